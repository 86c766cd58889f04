"""The pair-score cache, and the meter that counts real provider calls.

A score depends only on (provider and model, query, assembled document), so it is
kept in Redis under a digest of the three, for ``cache_ttl_s``. A repeated query
over the same documents then skips the provider; only the misses are sent. The
cached number is the provider's raw score, stored as the exact 8-byte double, so
normalisation, boosts and ``served_by`` come out the same as for a fresh score:
a hit is indistinguishable to the reader.

Both wrap a built member provider through ``Chain.from_settings(wrap=...)``.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable

import msgspec
import redis

from producer.keys import Keys
from producer.settings import MemberSettings
from worker.providers.base import Provider, Scale, ScoreRequest

_DOUBLE = struct.Struct("<d")
_encode = msgspec.msgpack.Encoder().encode


def provider_identity(member: MemberSettings, provider: Provider) -> str:
    """What a score depends on besides the pair: the provider and the model behind it."""
    declared = getattr(provider, "cache_identity", None)
    if isinstance(declared, str):
        return declared
    return f"{member.provider}|{member.model or ''}|{member.url or ''}"


def pair_digest(identity: str, query: str, document: str) -> str:
    # msgpack framing keeps the three parts apart: no separator can be forged by a document.
    return hashlib.blake2b(_encode([identity, query, document]), digest_size=20).hexdigest()


class MeteredProvider:
    """Counts ``provider_calls:<member>`` only when the provider itself is called."""

    def __init__(self, inner: Provider, *, label: str, count: Callable[[str], None]) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.label = label
        self._count = count

    @property
    def scale(self) -> Scale | None:
        return self.inner.scale

    def score(self, request: ScoreRequest, *, deadline: float) -> list[float | None]:
        self._count(f"provider_calls:{self.label}")
        return self.inner.score(request, deadline=deadline)

    def close(self) -> None:
        self.inner.close()


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
        if len(misses) < len(documents):
            self._count("pair_cache_hits", len(documents) - len(misses))
        if not misses:
            return scores
        self._count("pair_cache_misses", len(misses))
        sub = ScoreRequest(query=request.query, documents=[documents[i] for i in misses],
                           stream_id=request.stream_id, window=request.window, tenant=request.tenant)
        fresh = self.inner.score(sub, deadline=deadline)
        if len(fresh) != len(misses):
            return fresh  # let the chain's checks reject a wrong-length answer as they would uncached
        for i, value in zip(misses, fresh):
            scores[i] = value
        self._write({keys[i]: value for i, value in zip(misses, fresh) if value is not None})
        return scores

    def _read(self, keys: list[str]) -> list[bytes | None]:
        # A pipeline of GETs rather than one MGET: the keys hash to different slots on a
        # Redis Cluster, and a read needs no atomicity.
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)
        try:
            return list(pipe.execute())
        except redis.RedisError:
            return [None] * len(keys)  # a cache outage costs provider calls, never a window

    def _write(self, values: dict[str, float]) -> None:
        # Each SET with EX writes the value and its expiry in one atomic command, so no
        # key is ever left without a TTL; keys are independent, so no wider transaction
        # is needed (and one would fail across Cluster slots).
        if not values:
            return
        pipe = self.client.pipeline(transaction=False)
        for key, value in values.items():
            if value == value and abs(value) != float("inf"):  # never cache NaN or inf
                pipe.set(key, _DOUBLE.pack(value), ex=self.ttl_s)
        try:
            pipe.execute()
        except redis.RedisError:
            pass

    def close(self) -> None:
        self.inner.close()
