"""The pair-score cache.

A score depends only on (provider and model, query, assembled document), so it is
kept in Redis under a digest of the three, for ``cache_ttl_s``. A repeated query
over the same documents then skips the provider; only the misses are sent. The
cached number is the provider's raw score, stored as the exact 8-byte double, so
normalisation, boosts and ``served_by`` come out the same as for a fresh score:
a hit is indistinguishable to the reader.

It wraps a built member provider through ``Chain.from_settings(wrap=...)``.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Callable

import msgspec
import redis
import redis.cluster

from producer.keys import Keys
from producer.settings import MemberSettings
from worker.providers.base import Provider, Scale, ScoreRequest

_DOUBLE = struct.Struct("<d")
_encode = msgspec.msgpack.Encoder().encode

# A window's fresh scores, each SET with its expiry, and the hit/miss counts, in one
# atomic command. KEYS[1] is the counters hash, KEYS[2..] the pair-score keys;
# ARGV: ttl, hits, misses, then one packed score per pair-score key.
_SET_WITH_EXPIRY = """
local ttl = ARGV[1]
for i = 2, #KEYS do
  redis.call('SET', KEYS[i], ARGV[i + 2], 'EX', ttl)
end
if tonumber(ARGV[3]) > 0 then redis.call('HINCRBY', KEYS[1], 'pair_cache_misses', ARGV[3]) end
if tonumber(ARGV[2]) > 0 then redis.call('HINCRBY', KEYS[1], 'pair_cache_hits', ARGV[2]) end
return #KEYS - 1
"""


def _cacheable(value: float | None) -> bool:
    # None is a document the provider left out; NaN and inf the chain will reject.
    return value is not None and math.isfinite(value)


def provider_identity(member: MemberSettings, provider: Provider) -> str:
    """What a score depends on besides the pair: the provider and the model behind it."""
    layer: object | None = provider
    while layer is not None:  # the chain may hand us its checking wrapper: look beneath
        declared = getattr(layer, "cache_identity", None)
        if isinstance(declared, str):
            return declared
        layer = getattr(layer, "inner", None)
    return f"{member.provider}|{member.model or ''}|{member.url or ''}"


def pair_digest(identity: str, query: str, document: str) -> str:
    # msgpack framing keeps the three parts apart: no separator can be forged by a document.
    return hashlib.blake2b(_encode([identity, query, document]), digest_size=20).hexdigest()


class CachedProvider:
    """Serves pairs scored before from Redis; sends only the misses to the provider."""

    def __init__(self, inner: Provider, *, identity: str, client: redis.Redis, keys: Keys, ttl_s: int,
                 count: Callable[[str, int], None] | None = None) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.identity = identity
        self.client = client
        self.keys = keys
        self.ttl_s = ttl_s
        self._count = count or (lambda name, n: None)
        self._cluster = isinstance(client, redis.cluster.RedisCluster)
        self._set_script = client.register_script(_SET_WITH_EXPIRY)

    @property
    def scale(self) -> Scale | None:
        return self.inner.scale

    def _key(self, query: str, document: str) -> str:
        return self.keys.pair_score(pair_digest(self.identity, query, document))

    def score(self, request: ScoreRequest, *, deadline: float) -> list[float | None]:
        documents = list(request.documents)
        keys = [self._key(request.query, d) for d in documents]
        scores: list[float | None] = [None] * len(documents)
        misses: list[int] = []
        for i, raw in enumerate(self._read(keys)):
            if raw is not None and len(raw) == _DOUBLE.size:
                scores[i] = _DOUBLE.unpack(raw)[0]
            else:
                misses.append(i)
        hits = len(documents) - len(misses)
        if not misses:
            self._count("pair_cache_hits", hits)
            return scores
        sub = ScoreRequest(query=request.query, documents=[documents[i] for i in misses],
                           stream_id=request.stream_id, window=request.window, tenant=request.tenant)
        fresh = self.inner.score(sub, deadline=deadline)
        if len(fresh) != len(misses):
            return fresh  # let the chain's checks reject a wrong-length answer as they would uncached
        for i, value in zip(misses, fresh):
            scores[i] = value
        self._write({keys[i]: value for i, value in zip(misses, fresh) if _cacheable(value)}, hits, len(misses))
        return scores

    def _read(self, keys: list[str]) -> list[bytes | None]:
        try:
            if self._cluster:
                # Keys hash to different slots; a read needs no atomicity, so split it.
                return list(self.client.mget_nonatomic(keys))  # type: ignore[attr-defined]
            return list(self.client.mget(keys))
        except redis.RedisError:
            return [None] * len(keys)  # a cache outage costs provider calls, never a window

    def _write(self, values: dict[str, float], hits: int, misses: int) -> None:
        """All fresh scores and the hit/miss counts in one round trip."""
        try:
            if self._cluster:
                # A script cannot span Cluster slots. Each SET with EX still writes the
                # value and its expiry in one atomic command; the keys are independent.
                pipe = self.client.pipeline(transaction=False)
                for key, value in values.items():
                    pipe.set(key, _DOUBLE.pack(value), ex=self.ttl_s)
                pipe.execute()
                self._count("pair_cache_misses", misses)
                if hits:
                    self._count("pair_cache_hits", hits)
                return
            self._set_script(keys=[self.keys.counters_for(None), *values],
                             args=[self.ttl_s, hits, misses, *(_DOUBLE.pack(v) for v in values.values())])
        except redis.RedisError:
            pass  # a score not cached is paid for again later, nothing worse

    def close(self) -> None:
        self.inner.close()
