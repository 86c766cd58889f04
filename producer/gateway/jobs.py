"""A synchronous rerank call as a stream: its candidates, its windows, its idempotency key.

The key derives from everything that decides the scores (the stream's options: tenant,
chain profile, device, window size, document budget, filters, instruction, and any option
added later; the query and the documents) and nothing that only shapes the answer
(``top_n``, ``return_documents``, ``raw_scores``), so the same request again (from
any of the three APIs) finds the stream the first one opened and is answered from its
retained decisions without a provider call. ``generation`` moves a request past a retained
stream that cannot answer it (one whose windows failed, or a key left by a differently
configured gateway), so an outage is not remembered for the stream's whole TTL.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import msgspec

from kernel.store import Snapshot
from kernel.windows import window_count
from kernel.wire import Cancelled, Device, Failed, Filtered, PassageSpan, Ranked
from producer.gateway.problems import Problem
from producer.options import StreamOptions, given

#: Bump when the derivation changes, so old streams are never read as new answers.
KEY_VERSION = 2
_encoder = msgspec.msgpack.Encoder()


@dataclass(frozen=True)
class RerankJob:
    query: str
    texts: list[str]
    #: The stream's options, every one that decides the scores; device and window_size are set.
    options: StreamOptions

    @property
    def device(self) -> Device:
        assert self.options.device is not None
        return self.options.device

    @property
    def window_size(self) -> int:
        assert self.options.window_size is not None
        return self.options.window_size

    @property
    def document_budget(self) -> int:
        assert self.options.document_budget is not None
        return self.options.document_budget

    @property
    def n_windows(self) -> int:
        return window_count(len(self.texts), self.window_size)

    def candidates(self) -> list[dict[str, str]]:
        return [{"id": str(i), "text": text} for i, text in enumerate(self.texts)]

    def open_options(self, key: str) -> dict[str, Any]:
        """``open``'s options for this job under ``key``: every window sent at once, every document kept."""
        return {
            **given(self.options),
            "first_windows": self.n_windows,
            "idempotency_key": key,
            "max_rerank_candidates": len(self.texts),
        }

    def idempotency_key(self, generation: int) -> str:
        # The whole options struct, so an option added to it is part of the job without a change here.
        digest = hashlib.blake2b(
            _encoder.encode([KEY_VERSION, self.options, self.query, self.texts]), digest_size=20
        ).hexdigest()
        return f"gw-{digest}-{generation}"


@dataclass(frozen=True)
class Scored:
    index: int
    score: float
    #: A passages stream's best passage (and where reading stopped short); None otherwise.
    passage: PassageSpan | None = None


def failure(snapshot: Snapshot) -> str | None:
    """The reason of the first failed (or cancelled) window, or None when every window was scored."""
    for window in sorted(snapshot.results):
        result = snapshot.results[window]
        if any(isinstance(d, (Failed, Cancelled)) for d in result.decisions):
            return result.reason or "every chain member failed"
    return None


def scored(snapshot: Snapshot, stream_id: str) -> list[Scored]:
    """Every scored document, best first (ties in the member's order, then input order).

    A filtered decision (under a configured min score) still has its score and is answered,
    as the rerank APIs answer every document; one a provider's subset left out is not.
    """
    reason = failure(snapshot)
    if reason is not None:
        raise Problem("failed", f"reranking failed: {reason}", stream_id=stream_id)
    decisions = [
        d
        for window in sorted(snapshot.results)
        for d in snapshot.results[window].decisions
        if isinstance(d, (Ranked, Filtered))
    ]
    # A flat stretch of a calibration map ties documents the member scored apart: its own score
    # breaks the tie (uncalibrated, raw_score is unset and the order is as it always was).
    decisions.sort(key=lambda d: (-d.score, -(d.score if d.raw_score is None else d.raw_score), d.index))
    # A blank document scores minus infinity, which JSON cannot carry: it is answered with the
    # lowest score the APIs have (0; TEI's raw score is that one's logit), still last.
    return [Scored(d.index, d.score if math.isfinite(d.score) else 0.0, d.passage) for d in decisions]
