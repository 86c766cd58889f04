"""A cache's writes: fresh values, each with its expiry, and the hit/miss counts, in one command.

The pair cache and the embedding cache write alike: on a single Redis one call of
``expiring_set.lua`` sets every value with its expiry and counts the hits and misses
atomically; on a Cluster, whose keys hash to different slots a script cannot span, each
``SET ... EX`` is atomic on its own and the counts are the caller's to send.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import redis
import redis.cluster

from kernel.keys import Keys

_SCRIPT = resources.files("worker.chain").joinpath("expiring_set.lua").read_text()


class ExpiringSet:
    """Writes values that expire after ``ttl_s``, counted under ``<counter>_hits`` and ``<counter>_misses``."""

    def __init__(self, client: redis.Redis, keys: Keys, *, ttl_s: int, counter: str) -> None:
        self.client = client
        self.ttl_s = ttl_s
        self.counter = counter
        self.cluster = isinstance(client, redis.cluster.RedisCluster)
        self._counters = keys.counters_for(None)
        self._script = client.register_script(_SCRIPT)

    def _call(self, values: dict[str, bytes], hits: int, misses: int) -> tuple[list[str], list[Any]]:
        return [self._counters, *values], [self.ttl_s, self.counter, hits, misses, *values.values()]

    def run(self, values: dict[str, bytes], *, hits: int, misses: int) -> Any:
        """Set and count now (a single Redis)."""
        keys, args = self._call(values, hits, misses)
        return self._script(keys=keys, args=args)

    def queue(self, pipe: Any, values: dict[str, bytes], *, hits: int, misses: int) -> None:
        """Set and count on ``pipe``, a pipeline to the same single Redis."""
        keys, args = self._call(values, hits, misses)
        pipe.evalsha(self._script.sha, len(keys), *keys, *args)

    def set_each(self, values: dict[str, bytes]) -> None:
        """Set each value with its expiry, uncounted (a Cluster: one atomic command a key)."""
        pipe = self.client.pipeline(transaction=False)
        for key, value in values.items():
            pipe.set(key, value, ex=self.ttl_s)
        pipe.execute()
