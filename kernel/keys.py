"""Every Redis key the project writes, and nothing else builds one.

Streams are spread over ``SHARDS`` hash tags. A stream's keys, the active-stream index
of its shard and its shard's counters all carry the same tag, ``{NNNN}``, so the one
Lua script that changes a stream can also index it and count what happened, atomically,
and on a Redis Cluster every such call stays on one node. The tag is a function of the
stream id alone, so any reader holding an id finds its keys. With 1024 tags over the
16384 cluster slots, no slot carries more than a thousandth of the streams and a sweep
walks every shard in one pipelined round of reads.

Stream ids are validated before they reach here (``producer.validation.check_stream_id``),
so they cannot carry a separator or a glob character into a key.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from typing import get_args

from kernel.wire import Device

#: Every device a stream may ask for; each has its own index of uncommitted windows per shard.
DEVICES: tuple[str, ...] = get_args(Device)

#: Changing this strands every live stream's index entry: it is part of the key layout.
SHARDS = 1024


def shard_tag(stream_id: str) -> str:
    return f"{zlib.crc32(stream_id.encode()) % SHARDS:04d}"


@dataclass(frozen=True)
class StreamKeys:
    spec: str
    candidates: str
    meta: str
    results: str
    attempts: str
    pending: str
    events: str
    #: The shard's active-stream index and counters (shared with the shard's other streams).
    active: str
    counters: str
    #: Windows' embeddings from an embedding member (``WindowEmbeddings``), beside ``results``.
    embeddings: str
    #: The shard's index of admitted, uncommitted windows, one per device (in ``DEVICES`` order).
    uncommitted: tuple[str, ...] = ()

    def all(self) -> list[str]:
        """In the order ``store.lua`` expects them."""
        return [
            self.spec,
            self.candidates,
            self.meta,
            self.results,
            self.attempts,
            self.pending,
            self.events,
            self.active,
            self.counters,
            self.embeddings,
            *self.uncommitted,
        ]

    def own(self) -> list[str]:
        """The keys that belong to this stream alone."""
        return [
            self.spec,
            self.candidates,
            self.meta,
            self.results,
            self.attempts,
            self.pending,
            self.events,
            self.embeddings,
        ]


@dataclass(frozen=True)
class FairShareKeys:
    """One device queue's fair-share ledger (``kernel.fair_share``): one hash tag, so each
    script call on it stays on one Cluster slot."""

    queued: str
    inflight: str
    waiting: str
    deferred: str
    turns: str

    def all(self) -> list[str]:
        """In the order ``store.lua``'s fair-share commands expect them."""
        return [self.queued, self.inflight, self.waiting, self.deferred, self.turns]


@dataclass(frozen=True)
class Keys:
    namespace: str

    def stream(self, stream_id: str) -> StreamKeys:
        tag = shard_tag(stream_id)
        base = f"{self.namespace}:s:{{{tag}}}:{stream_id}"
        return StreamKeys(
            spec=f"{base}:spec",
            candidates=f"{base}:cands",
            meta=f"{base}:meta",
            results=f"{base}:results",
            attempts=f"{base}:attempts",
            pending=f"{base}:pending",
            events=f"{base}:events",
            active=self.active(tag),
            counters=self.counters(tag),
            embeddings=f"{base}:embeddings",
            uncommitted=tuple(self.uncommitted(tag, device) for device in DEVICES),
        )

    @staticmethod
    def shard_tags() -> list[str]:
        return [f"{i:04d}" for i in range(SHARDS)]

    def active(self, tag: str) -> str:
        """ZSET of one shard's stream ids scored by expiry, walked by the sweep."""
        return f"{self.namespace}:active:{{{tag}}}"

    def counters(self, tag: str) -> str:
        """HASH of one shard's counters; the totals are the sum over every shard."""
        return f"{self.namespace}:counters:{{{tag}}}"

    def uncommitted(self, tag: str, device: str) -> str:
        """ZSET of one shard's admitted, uncommitted windows of one device (``<stream>:<window>``
        scored by the stream's expiry), so the backlog per device is counted without a scan."""
        return f"{self.namespace}:uncommitted:{{{tag}}}:{device}"

    def fair_share(self, device: str) -> FairShareKeys:
        """The ledger of what each tenant (or tenant-less stream) has queued on ``device``'s queue
        and the windows it holds back."""
        base = f"{self.namespace}:fair:{{{device}}}"
        return FairShareKeys(
            queued=f"{base}:queued",
            inflight=f"{base}:inflight",
            waiting=f"{base}:waiting",
            deferred=f"{base}:deferred",
            turns=f"{base}:turns",
        )

    def counters_for(self, stream_id: str | None) -> str:
        """The counters a stream's events go to; any shard's for events of no stream (spread, not hot)."""
        tag = shard_tag(stream_id) if stream_id else f"{random.randrange(SHARDS):04d}"
        return self.counters(tag)

    def breaker(self, member: str) -> str:
        return f"{self.namespace}:breaker:{member}"

    def pair_score(self, digest: str) -> str:
        return f"{self.namespace}:score:{digest}"

    def embedding(self, digest: str) -> str:
        """An embedding member's vector of one text (``worker.chain.embedding_cache``)."""
        return f"{self.namespace}:embedding:{digest}"

    @property
    def cache_patterns(self) -> tuple[str, ...]:
        """SCAN patterns matching every pair score, window answer and embedding kept, so the
        caches can be emptied (a benchmark's cold rounds)."""
        return (f"{self.namespace}:score:*", f"{self.namespace}:answer:*", f"{self.namespace}:embedding:*")

    def window_answer(self, digest: str) -> str:
        """A subset-answering member's whole answer to one window (``worker.chain.cache``)."""
        return f"{self.namespace}:answer:{digest}"

    def worker_card(self, hostname: str) -> str:
        """HASH of one worker's processes (pid -> what each runs), for operators (``worker.card``)."""
        return f"{self.namespace}:worker:{hostname}"

    @property
    def worker_cards_pattern(self) -> str:
        """SCAN pattern matching every worker's card."""
        return f"{self.namespace}:worker:*"

    def queue_consumers(self, queue: str) -> str:
        """ZSET of the workers consuming ``queue`` (hostname -> when it last said so), for the
        no-worker warning (``kernel.consumers``); cold: each worker writes it every half minute."""
        return f"{self.namespace}:consumers:{queue}"

    @property
    def sweep_lock(self) -> str:
        return f"{self.namespace}:sweep-lock"
