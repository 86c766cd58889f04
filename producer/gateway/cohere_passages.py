"""What a Cohere answer says about passages: the winning span of each document (``relevant_spans``,
as Cohere's v2 API and its SDK's ``RerankRelevantSpans`` / ``RerankRelevantSpanResponse`` shape
them), and which documents were read only in part (``meta.warnings``).

A passages stream scores every passage of a document and keeps its best one's span: that span,
``[start, end)`` in code points of the document and its normalised score, is the answer's one
relevant span where it reaches the request's ``threshold`` (Cohere's default 0.1). A document
whose passages, as many as ``max_chunks_per_doc`` (or the stream default) and each as long as
the reranker reads, stopped short of its end is named in a warning, with how much was read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

from producer.gateway.jobs import Scored
from producer.gateway.problems import Problem

#: Cohere's default: spans scoring at most this are not returned.
DEFAULT_SPAN_THRESHOLD = 0.1
#: Documents a warning names at most; the count says how many there were.
_NAMED = 10


class RelevantSpansRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    mode: Literal["enabled", "disabled"]
    threshold: float | None = None
    max_spans: int | None = None

    @property
    def enabled(self) -> bool:
        return self.mode == "enabled"


class RelevantSpan(msgspec.Struct):
    start: int
    end: int
    score: float


def check_relevant_spans(asked: RelevantSpansRequest | None) -> None:
    if asked is None:
        return
    if asked.threshold is not None and not 0.0 <= asked.threshold <= 1.0:
        raise Problem(
            "invalid",
            f"relevant_spans.threshold: must be between 0 and 1, got {asked.threshold}",
            field="relevant_spans.threshold",
        )
    if asked.max_spans is not None and asked.max_spans < 1:
        raise Problem(
            "invalid",
            f"relevant_spans.max_spans: must be at least 1, got {asked.max_spans}",
            field="relevant_spans.max_spans",
        )


def relevant_spans(scored: Scored, asked: RelevantSpansRequest | None) -> list[RelevantSpan] | None:
    """The document's spans for the answer; None (left out, as Cohere leaves it) where none were
    asked for or none reaches the threshold."""
    if asked is None or not asked.enabled or scored.passage is None:
        return None
    threshold = DEFAULT_SPAN_THRESHOLD if asked.threshold is None else asked.threshold
    span = scored.passage
    if span.score < threshold:
        return None
    return [RelevantSpan(start=span.start, end=span.end, score=span.score)]


def unread_warnings(scores: Sequence[Scored], texts: Sequence[str], limit: str) -> list[str]:
    """One warning naming the documents whose end was not read, with how much was; none when
    every document was read to its end. ``limit``: what bounded the passages, as the caller
    knows it."""
    partial = sorted(
        (s.index, s.passage.unread_from) for s in scores if s.passage is not None and s.passage.unread_from is not None
    )
    if not partial:
        return []
    named = ", ".join(f"{index}: {read} of {len(texts[index])}" for index, read in partial[:_NAMED])
    more = f" and {len(partial) - _NAMED} more" if len(partial) > _NAMED else ""
    return [
        f"{len(partial)} of {len(texts)} documents were read only in part: their passages ({limit}, each "
        f"as long as the reranker reads) stopped before their end (document index: code points read of "
        f"its length) {named}{more}"
    ]
