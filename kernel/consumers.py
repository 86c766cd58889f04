"""Which device queues a live worker consumes: for the warning that a stream's windows wait for
a worker that does not exist.

Each worker's main process records, every ``worker.card.CARD_REFRESH_S``, its hostname in one
sorted set per queue it consumes (``Keys.queue_consumers``), scored by the time it wrote; a
worker counts as live for ``LIVE_FOR_S`` after its last write, so one that died leaves within
that. A producer asks with one ``ZCOUNT`` per queue and remembers the answer for ``CACHE_S``,
so the check costs nothing on the usual open.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

import redis

from kernel.keys import Keys

#: A worker unheard of for this long is not counted (it refreshes four times as often).
LIVE_FOR_S = 120.0
#: How long a client trusts what it last read about a queue.
CACHE_S = 10.0


def record(client: redis.Redis, keys: Keys, hostname: str, queues: Iterable[str], now: float | None = None) -> None:
    """The worker ``hostname`` consumes ``queues`` (one transaction per queue: each key may live on
    another cluster shard)."""
    now = time.time() if now is None else now
    for queue in queues:
        key = keys.queue_consumers(queue)
        pipe = client.pipeline(transaction=True)
        pipe.zadd(key, {hostname: now})
        pipe.zremrangebyscore(key, "-inf", now - LIVE_FOR_S)
        pipe.expire(key, int(LIVE_FOR_S) * 2)
        pipe.execute()


def forget(client: redis.Redis, keys: Keys, hostname: str, queues: Iterable[str]) -> None:
    """A worker stopping: it consumes nothing any more."""
    for queue in queues:
        client.zrem(keys.queue_consumers(queue), hostname)


def live(client: redis.Redis, keys: Keys, queue: str, now: float | None = None) -> int:
    """How many live workers consume ``queue``."""
    now = time.time() if now is None else now
    return int(client.zcount(keys.queue_consumers(queue), now - LIVE_FOR_S, "+inf"))


def no_worker_warning(queue: str, device: str) -> str:
    """What to tell a caller whose windows went to a queue no live worker consumes."""
    start = "rerankq worker --device gpu" if device == "gpu" else "rerankq worker --device cpu"
    return (
        f"no live worker consumes queue {queue!r} (device={device!r}): the windows wait there until one "
        f"starts ({start}, against the same Redis and RERANKQ_NAMESPACE); rerankq inspect lists the workers"
    )


class ConsumerCheck:
    """A client's cached view of which queues have a live worker."""

    def __init__(self, client: redis.Redis, keys: Keys, *, cache_s: float = CACHE_S) -> None:
        self.client = client
        self.keys = keys
        self.cache_s = cache_s
        self._seen: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def count(self, queue: str) -> int | None:
        """Live workers on ``queue``; None when Redis could not say (never an error: a warning aid)."""
        now = time.monotonic()
        with self._lock:
            cached = self._seen.get(queue)
        if cached is not None and now - cached[0] < self.cache_s:
            return cached[1]
        try:
            found = live(self.client, self.keys, queue)
        except redis.RedisError:
            return None
        with self._lock:
            self._seen[queue] = (now, found)
        return found
