"""The pair-score cache.

A score depends on the pair (query, assembled document), on the stream's instruction
(the model's prompt: the same pair under another instruction is another entry) and on
the member's *identity*: everything else that changes what the provider is asked or how
its answer is read (model, URL, scale, request options; each provider declares its own
``cache_identity``). It is kept in Redis under a digest of them, for
``cache_ttl_s``. A repeated query over the same documents then skips the provider;
only the misses are sent. The cached number is the provider's raw score, stored as
the exact 8-byte double, so normalisation, boosts and ``served_by`` come out the same
as for a fresh score: a hit is indistinguishable to the reader.

A member that answers a subset (``top_n``) is cached per window instead: which
documents it leaves out depends on the whole window, so per-pair hits mixed with a
fresh subset of the misses would rank more documents than a fresh call does (10 of 25,
then 20, then 25 on repeats). Its whole answer, omissions included, is kept under a
digest of the identity, the query and the ordered documents, and served only for that
exact window. Re-asking for just the misses cannot work: no request for a subset of
the misses says which of the cached ones the provider would have kept.

Where a stream has a tenant, its entries are the tenant's own (the tenant is in the
digest): otherwise tenant B repeating tenant A's query and documents would be answered
from A's scores, at cache speed, and learn what A sent. Sharing across tenants is the
operator's explicit choice (``RERANKQ_PAIR_CACHE_SHARED_ACROSS_TENANTS``, off by default).
The hit and miss counters are fleet-wide and for operators only (``rerankq inspect``, the
workers' metrics): nothing a tenant can read reports them.

It wraps a built member provider through ``Chain.from_settings(wrap=...)``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import struct
from collections.abc import Callable, Iterable, Sequence

import msgspec
import redis

from kernel.keys import Keys
from kernel.settings import MemberSettings
from worker.chain.expiring_set import ExpiringSet
from worker.providers.base import Provider, Scale, ScoreRequest, cache_identity
from worker.side_writes import SideWrite, write

_DOUBLE = struct.Struct("<d")
_encode = msgspec.msgpack.Encoder().encode
# msgpack keeps a Python float as a float64: a window's answer round-trips exactly.
_decode_window = msgspec.msgpack.Decoder(list[float | None]).decode

# Member settings that cannot change a score: how long to wait, how often to retry, the key.
_NOT_IN_IDENTITY = frozenset({"api_key", "timeout_s", "connect_timeout_s", "max_retries", "send_tenant", "allow_mps"})


def _cacheable(value: float | None) -> bool:
    # None is a document the provider left out; NaN and inf the chain will reject.
    return value is not None and math.isfinite(value)


def _values(replies: Iterable[object]) -> list[bytes | None]:
    """MGET's replies as the cache reads them: its client does not decode, so a value is bytes."""
    return [reply if isinstance(reply, bytes) else None for reply in replies]


def _declared(provider: object, name: str) -> object | None:
    """An attribute the raw provider declares, looked up beneath any wrappers (checks, metering)."""
    layer: object | None = provider
    while layer is not None:
        value: object | None = getattr(layer, name, None)
        if value is not None:
            return value
        layer = getattr(layer, "inner", None)
    return None


def provider_identity(member: MemberSettings, provider: Provider) -> str:
    """What a score depends on besides the pair: the provider's declared ``cache_identity``.

    A provider that declares none (a custom one) is keyed on every member setting that
    could change its answer, and on the scale it reads its numbers on.
    """
    declared = _declared(provider, "cache_identity")
    if isinstance(declared, str):
        return declared
    settings = {f: getattr(member, f) for f in member.__struct_fields__ if f not in _NOT_IN_IDENTITY}
    return cache_identity(member.provider, **settings, read_as=provider.scale)


def answers_subsets(member: MemberSettings, provider: Provider) -> bool:
    """Whether an answer may leave documents out; undeclared, whether ``top_n`` is set."""
    declared = _declared(provider, "answers_subsets")
    return declared if isinstance(declared, bool) else member.top_n is not None


def _instructed(parts: list[object], instruction: str | None) -> list[object]:
    # Without an instruction the parts are what they always were, so earlier entries still hit.
    return parts if instruction is None else [*parts, ["instruction", instruction]]


def pair_digest(
    identity: str, query: str, document: str, *, tenant: str | None = None, instruction: str | None = None
) -> str:
    # msgpack framing keeps the parts apart: no separator can be forged by a document.
    parts = _instructed([identity, tenant, query, document], instruction)
    return hashlib.blake2b(_encode(parts), digest_size=20).hexdigest()


def window_digest(
    identity: str, query: str, documents: Sequence[str], *, tenant: str | None = None, instruction: str | None = None
) -> str:
    # The leading tag and the list keep a window's digest apart from any pair's.
    parts = _instructed(["window", identity, tenant, query, list(documents)], instruction)
    return hashlib.blake2b(_encode(parts), digest_size=20).hexdigest()


class CachedProvider:
    """Serves answers given before from Redis; sends only what it has not seen to the provider."""

    def __init__(
        self,
        inner: Provider,
        *,
        member: MemberSettings,
        client: redis.Redis,
        keys: Keys,
        ttl_s: int,
        count: Callable[..., None] | None = None,
        on_counted: Callable[[int, int], None] | None = None,
        shared_across_tenants: bool = False,
    ) -> None:
        """``count(name, n, then=...)`` adds to the store's counters and calls ``then()`` once
        counted; ``on_counted(hits, misses)`` hears of every count the store has taken (the
        metrics count at the same points)."""
        self.inner = inner
        self.kind = inner.kind
        self.identity = provider_identity(member, inner)
        self.per_window = answers_subsets(member, inner)
        # Per tenant unless the operator shares scores across tenants: a hit answered faster
        # (or counted) would tell one tenant what another sent. A member trusted with the
        # tenant may answer per tenant: its scores are kept per tenant even when shared.
        self.per_tenant = member.send_tenant or not shared_across_tenants
        self.client = client
        self.keys = keys
        self.ttl_s = ttl_s
        self._count = count or (lambda name, n, then=None: then() if then else None)
        self._on_counted = on_counted or (lambda hits, misses: None)
        self._writes = ExpiringSet(client, keys, ttl_s=ttl_s, counter="pair_cache")
        self._cluster = self._writes.cluster

    @property
    def scale(self) -> Scale | None:
        return self.inner.scale

    def _tenant(self, request: ScoreRequest) -> str | None:
        return request.tenant if self.per_tenant else None

    def score(self, request: ScoreRequest, *, deadline: float) -> list[float | None]:
        if self.per_window:
            return self._score_window(request, deadline=deadline)
        documents = list(request.documents)
        tenant = self._tenant(request)
        keys = [
            self.keys.pair_score(
                pair_digest(self.identity, request.query, d, tenant=tenant, instruction=request.instruction)
            )
            for d in documents
        ]
        scores: list[float | None] = [None] * len(documents)
        misses: list[int] = []
        for i, raw in enumerate(self._read(keys)):
            if raw is not None and len(raw) == _DOUBLE.size:
                scores[i] = _DOUBLE.unpack(raw)[0]
            else:
                misses.append(i)
        hits = len(documents) - len(misses)
        if not misses:
            self._count("pair_cache_hits", hits, then=lambda: self._on_counted(hits, 0))
            return scores
        sub = dataclasses.replace(request, documents=[documents[i] for i in misses])
        fresh = self.inner.score(sub, deadline=deadline)
        if len(fresh) != len(misses):
            return fresh  # let the chain's checks reject a wrong-length answer as they would uncached
        for i, value in zip(misses, fresh):
            scores[i] = value
        self._write(
            {keys[i]: _DOUBLE.pack(value) for i, value in zip(misses, fresh) if _cacheable(value)}, hits, len(misses)
        )
        return scores

    def _score_window(self, request: ScoreRequest, *, deadline: float) -> list[float | None]:
        n = len(request.documents)
        key = self.keys.window_answer(
            window_digest(
                self.identity,
                request.query,
                request.documents,
                tenant=self._tenant(request),
                instruction=request.instruction,
            )
        )
        raw = self._read([key])[0]
        if raw is not None:
            try:
                kept = _decode_window(raw)
            except msgspec.DecodeError:
                kept = None
            if kept is not None and len(kept) == n:
                self._count("pair_cache_hits", n, then=lambda: self._on_counted(n, 0))
                return kept
        fresh = self.inner.score(request, deadline=deadline)
        # The checks beneath have passed it; a subset's None marks are part of the answer.
        whole = len(fresh) == n and all(v is None or math.isfinite(v) for v in fresh)
        self._write({key: _encode(fresh)} if whole else {}, 0, n)
        return fresh

    def _read(self, keys: list[str]) -> list[bytes | None]:
        try:
            if self._cluster:
                # Keys hash to different slots; a read needs no atomicity, so split it.
                return _values(self.client.mget_nonatomic(keys))  # type: ignore[attr-defined]
            return _values(self.client.mget(keys))
        except redis.RedisError:
            return [None] * len(keys)  # a cache outage costs provider calls, never a window

    def _write(self, values: dict[str, bytes], hits: int, misses: int) -> None:
        """All fresh values and the hit/miss counts in one round trip."""
        try:
            if self._cluster:
                self._writes.set_each(values)
                self._count("pair_cache_misses", misses)
                if hits:
                    self._count("pair_cache_hits", hits)
            else:
                # With the window's commit (worker.side_writes): one round trip less per window.
                write(
                    SideWrite(
                        queue=lambda pipe: self._writes.queue(pipe, values, hits=hits, misses=misses),
                        run=lambda: self._writes.run(values, hits=hits, misses=misses),
                        done=lambda _reply: self._on_counted(hits, misses),
                    )
                )
                return
        except redis.RedisError:
            return  # a score not cached is paid for again later, nothing worse (and not counted)
        self._on_counted(hits, misses)

    def close(self) -> None:
        self.inner.close()
