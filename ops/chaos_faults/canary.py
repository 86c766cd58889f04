"""Does Redis keep every write it acknowledged, through SIGTERM and SIGKILL restarts?

A thread INCRs one counter a few hundred times a second on a client that never retries,
so each reply it receives is one acknowledged write. Redis applies writes in order and
appends them to its AOF in order, so after a restart the next INCR must return more than
the last value acknowledged before it; each value it falls short by is an acknowledged
write that was lost. The chaos run counts that as a violation: docs/guarantees.md
says a crash of Redis alone loses nothing.
"""

from __future__ import annotations

import threading

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

#: The chaos run's own key, outside the namespace rerankq writes under.
CANARY_KEY = "rerankq-chaos-canary:acknowledged-writes"
PERIOD_S = 0.004


class AcknowledgedWrites(threading.Thread):
    def __init__(
        self,
        url: str | None = None,
        *,
        client: redis.Redis | None = None,
        key: str = CANARY_KEY,
        name: str = "chaos-canary",
    ) -> None:
        """``url`` for one Redis; or a ready ``client`` that never retries (a cluster's, Sentinel's)."""
        super().__init__(name=name, daemon=True)
        self.url = url
        self.client = client
        self.key = key
        self.stop = threading.Event()
        self.acknowledged = 0  # writes whose reply came back
        self.lost = 0  # of those, how many a restart took away
        self._last = 0

    def run(self) -> None:
        client = self.client or redis.Redis.from_url(
            self.url, socket_timeout=2, socket_connect_timeout=2, retry=Retry(NoBackoff(), 0)
        )
        try:
            while not self.stop.wait(PERIOD_S):
                try:
                    value = int(client.incr(self.key))
                except (redis.RedisError, OSError):
                    continue  # down or loading: the reply never came, so nothing was acknowledged
                if value <= self._last:
                    self.lost += self._last - value + 1
                self._last = value
                self.acknowledged += 1
        finally:
            client.close()
