"""Read-time post-processing of a ranked list: cheap precision levers, applied by the reader.

Three optional steps, in this order:

1. a per-document cap: at most ``per_doc`` rows per ``doc_id`` (rows without one are
   each their own document), so one long document cannot fill the answer;
2. score-gap truncation: cut where a row's final score falls below ``gap_ratio`` times
   the row before it, so a question with one clear answer sends one row;
3. maximal marginal relevance, when candidates carry embeddings (sent by the caller, or
   kept by an ``embedding`` member that served their window): pick ``keep`` rows,
   each time the one that best trades relevance against similarity to those already
   picked (``mmr_lambda`` 1.0 is pure relevance).

These work on rows already read; they never write, so what is stored (and what any
other reader sees) does not change. Pure Python: the producer installs no numpy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from kernel.errors import ValidationError
from kernel.wire import Base, Candidate, Row


class PostProcess(Base, frozen=True):
    """Which steps to run; each is off when None."""

    per_doc: int | None = None
    gap_ratio: float | None = None
    mmr_lambda: float | None = None

    @property
    def needs_candidates(self) -> bool:
        return self.per_doc is not None or self.mmr_lambda is not None


class Selection(Base, frozen=True):
    """The post-processed rows, in selection order. Each row is as stored (its ``rank``
    is its place in the stream's ranked list); ``considered`` is how many rows were read."""

    stream_id: str
    keep: int
    considered: int
    rows: list[Row]
    complete: bool


def check_postprocess(options: PostProcess, keep: int) -> None:
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        raise ValidationError("keep", f"must be a positive integer, got {keep!r}")
    if options.per_doc is not None and (not isinstance(options.per_doc, int) or options.per_doc < 1):
        raise ValidationError("per_doc", f"must be a positive integer, got {options.per_doc!r}")
    if options.gap_ratio is not None and not (
        isinstance(options.gap_ratio, (int, float)) and 0.0 < options.gap_ratio < 1.0
    ):
        raise ValidationError("gap_ratio", f"must be within (0, 1), got {options.gap_ratio!r}")
    if options.mmr_lambda is not None and not (
        isinstance(options.mmr_lambda, (int, float)) and 0.0 <= options.mmr_lambda <= 1.0
    ):
        raise ValidationError("mmr_lambda", f"must be within [0, 1], got {options.mmr_lambda!r}")


def relevance(row: Row) -> float:
    """The boosted score; a row without one (a failed window) ranks as least relevant."""
    score = row.final_score
    return -math.inf if score is None or math.isnan(score) else score


def cap_per_doc(rows: Sequence[Row], doc_ids: Mapping[int, str | None], per_doc: int) -> list[Row]:
    """The first ``per_doc`` rows of each ``doc_id``, order kept. Keyed by candidate index."""
    counts: dict[str, int] = {}
    kept = []
    for row in rows:
        doc = doc_ids.get(row.decision.index)
        if doc is not None:
            counts[doc] = counts.get(doc, 0) + 1
            if counts[doc] > per_doc:
                continue
        kept.append(row)
    return kept


def truncate_at_gap(rows: Sequence[Row], ratio: float) -> list[Row]:
    """Rows up to the first one whose score drops below ``ratio`` x the previous row's."""
    for i in range(1, len(rows)):
        previous, current = rows[i - 1].final_score, rows[i].final_score
        if previous is None or current is None or not math.isfinite(previous):
            continue  # a failed row carries no score to judge a gap by
        if current < previous * ratio:
            return list(rows[:i])
    return list(rows)


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


def mmr(rows: Sequence[Row], embeddings: Mapping[int, Sequence[float] | None], keep: int, lambda_: float) -> list[Row]:
    """Maximal marginal relevance over ``rows``; a row without an embedding is never redundant.

    Ties go to the row that came first, so with no embeddings at all this is a stable
    sort by relevance.
    """
    pool = list(rows)
    selected: list[Row] = []
    chosen_vectors: list[Sequence[float]] = []
    while pool and len(selected) < keep:
        best_index, best_value = 0, -math.inf
        for i, row in enumerate(pool):
            vector = embeddings.get(row.decision.index)
            redundancy = max((cosine(vector, v) for v in chosen_vectors), default=0.0) if vector else 0.0
            rel = relevance(row)
            value = lambda_ * rel - (1.0 - lambda_) * redundancy if math.isfinite(rel) else -math.inf
            if value > best_value:
                best_index, best_value = i, value
        row = pool.pop(best_index)
        selected.append(row)
        vector = embeddings.get(row.decision.index)
        if vector:
            chosen_vectors.append(vector)
    return selected


def postprocess(
    rows: Sequence[Row],
    candidates: Mapping[int, Candidate],
    keep: int,
    options: PostProcess,
    *,
    kept_embeddings: Mapping[int, Sequence[float]] | None = None,
) -> list[Row]:
    """Per-document cap, then score-gap truncation, then MMR (or the first ``keep``).

    MMR uses the embeddings the caller sent with the candidates; when none were sent, the
    ones an embedding member kept with its windows (``kept_embeddings``). The two are never
    mixed: vectors of two models are not comparable.
    """
    check_postprocess(options, keep)
    out = list(rows)
    if options.per_doc is not None:
        out = cap_per_doc(out, {i: c.doc_id for i, c in candidates.items()}, options.per_doc)
    if options.gap_ratio is not None:
        out = truncate_at_gap(out, options.gap_ratio)
    embeddings: Mapping[int, Sequence[float]] = {i: c.embedding for i, c in candidates.items() if c.embedding}
    if not embeddings and kept_embeddings:
        embeddings = kept_embeddings
    if options.mmr_lambda is not None and embeddings:
        return mmr(out, embeddings, keep, options.mmr_lambda)
    return out[:keep]
