"""The embedding cache: an embedding member's vector of each text it has embedded, in Redis.

The pair cache answers a (query, document) pair seen before; a batch run asks many queries
over the same documents (and a passages stream the same passages), so the pairs are new and
the documents are not. A bi-encoder embeds a document without its query, so its vector can be
kept and each distinct text embedded once: a pair's cosine is then a dot product.

It follows the pair cache's rules: on where the pair cache is on (``RERANKQ_PAIR_CACHE``),
kept ``RERANKQ_CACHE_TTL_S``, keyed by a digest of the member's ``cache_identity`` (model,
precision, device: vectors differ in their last digits between them), the text and, unless
the operator shares caches across tenants, the tenant. A vector is the exact float32 values,
little-endian; each write sets a value and its expiry in one command (one script for all of a
window's, sent as soon as they are computed, so a window cut off by its lease and redelivered
embeds nothing twice).
"""

from __future__ import annotations

import array
import hashlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import redis

from kernel.keys import Keys
from worker.chain.expiring_set import ExpiringSet
from worker.providers.base import ScoreRequest

_encode = msgspec.msgpack.Encoder().encode


def pack(vector: Sequence[float]) -> bytes:
    values = array.array("f", vector)
    if sys.byteorder == "big":
        values.byteswap()
    return values.tobytes()


def unpack(blob: bytes, dims: int | None) -> list[float] | None:
    if not blob or len(blob) % 4 or (dims is not None and len(blob) != 4 * dims):
        return None  # not one of ours: embedded again
    values = array.array("f")
    values.frombytes(blob)
    if sys.byteorder == "big":
        values.byteswap()
    return values.tolist()


class EmbeddingCache:
    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        *,
        identity: str,
        ttl_s: int,
        per_tenant: bool,
        dims: int | None = None,
        on_counted: Callable[[int, int], None] | None = None,
    ) -> None:
        self.client = client
        self.keys = keys
        self.identity = identity
        self.ttl_s = ttl_s
        self.per_tenant = per_tenant
        self.dims = dims
        self._on_counted = on_counted or (lambda hits, misses: None)
        self._writes = ExpiringSet(client, keys, ttl_s=ttl_s, counter="embedding_cache")
        self._cluster = self._writes.cluster

    def key(self, text: str, tenant: str | None, *, query_prompt: str | None | bool = False) -> str:
        """A document's key; with ``query_prompt`` (None: the model's own query prompt, or the
        stream's instruction) a query's, which is embedded as a query under that prompt."""
        # msgpack framing keeps the parts apart: no text can forge another's key.
        role: list[object] = ["document"] if query_prompt is False else ["query", query_prompt]
        parts = ["embedding", self.identity, tenant if self.per_tenant else None, role, text]
        return self.keys.embedding(hashlib.blake2b(_encode(parts), digest_size=20).hexdigest())

    def get(self, texts: Sequence[str], tenant: str | None) -> dict[str, list[float]]:
        """The vectors kept for the documents ``texts``; one missing (or Redis failing) is absent."""
        return self._get([self.key(t, tenant) for t in texts], texts)

    def _get(self, keys: list[str], texts: Sequence[str]) -> dict[str, list[float]]:
        try:
            raw = self.client.mget_nonatomic(keys) if self._cluster else self.client.mget(keys)  # type: ignore[attr-defined]
        except redis.RedisError:
            return {}  # a cache outage costs embeddings, never a window
        found = {}
        for text, blob in zip(texts, raw):
            vector = unpack(blob, self.dims) if blob is not None else None
            if vector is not None:
                found[text] = vector
        return found

    def put(self, values: dict[str, bytes], *, hits: int, misses: int) -> None:
        """Keep fresh vectors (by key) and count hits and misses, in one script."""
        try:
            if self._cluster:
                self._writes.set_each(values)
            else:
                # At once, not held for the window's commit: a vector is valid whatever becomes of
                # the window, and an attempt cut off by its lease then leaves its work to the next.
                self._writes.run(values, hits=hits, misses=misses)
        except redis.RedisError:
            return  # a vector not kept is embedded again later, nothing worse
        self._on_counted(hits, misses)

    def cosines(self, provider: Any, request: ScoreRequest, *, deadline: float) -> list[float | None]:
        """An embedding member's scores with each distinct text embedded once: kept vectors are
        read, the rest computed by ``provider.fresh`` (coalesced like any window) and kept."""
        documents = list(request.documents)
        distinct = list(dict.fromkeys(documents))
        tenant, prompt = request.tenant, request.instruction
        query_key = self.key(request.query, tenant, query_prompt=prompt)
        known = self.get(distinct, tenant)
        query = self._get([query_key], [request.query]).get(request.query)
        missing = [d for d in distinct if d not in known]
        cosine: dict[str, float] = {}
        fresh: dict[str, list[float]] = {}
        if missing:
            for d, (c, vector) in zip(
                missing, provider.fresh(request.query, missing, deadline=deadline, prompt=prompt)
            ):
                cosine[d], fresh[d] = c, vector
        kept = [d for d in distinct if d not in cosine]
        values = {self.key(d, tenant): pack(v) for d, v in fresh.items()}
        if kept:
            if query is None:
                query = provider.engine.encode([request.query], role="query", prompt=prompt)[0].tolist()
                values[query_key] = pack(query)
            for d in kept:
                # Both are L2-normalised: the dot product is the cosine.
                cosine[d] = max(-1.0, min(1.0, sum(a * b for a, b in zip(query, known[d]))))
        self.put(values, hits=len(kept), misses=len(missing))
        provider.remember({d: known[d] if d in known else fresh[d] for d in distinct})
        return [cosine[d] for d in documents]

    def vectors(self, provider: Any, documents: Sequence[str], tenant: str | None) -> dict[str, list[float]]:
        """Each of ``documents``' vectors, for a window whose scores came from the pair cache:
        kept ones read, the rest embedded by ``provider``'s engine now and kept."""
        distinct = list(dict.fromkeys(documents))
        known = self.get(distinct, tenant)
        missing = [d for d in distinct if d not in known]
        fresh = dict(zip(missing, provider.engine.encode(missing).tolist())) if missing else {}
        self.put({self.key(d, tenant): pack(v) for d, v in fresh.items()}, hits=len(known), misses=len(missing))
        return {**known, **fresh}
