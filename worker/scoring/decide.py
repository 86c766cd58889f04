"""Turn a chain outcome into a window's decisions: normalise, calibrate, seed, boost, filter, order.

``score`` on a decision is the normalised relevance (absolute: a weak best hit stays
weak), or, with a calibration map for the serving member, the probability of relevance the
map gives that normalised score (kept as ``raw_score``); ``final_score`` is ``score`` times
the bounded boost multiplier, where the first stage is blended in the blend's
(``worker.scoring.blend``). Boosts and filters see the calibrated score.

A window whose member declared ``rank`` (a listwise member: each number is a place in the order
it chose) has no relevance to keep: its places are seeded onto [0.1, 1.0] as a passthrough
window's fusion ranks are (``rank_scores``), and like those they are never filtered by
``min_score`` or ``min_final_score`` nor mapped by a calibration map (fitted on relevance, it
would read a place as a probability); the stream's own ``first_stage_weight`` still blends.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kernel.wire import Candidate, Decision, Failed, Filtered, Omitted, PassageSpan, Ranked, StreamSpec
from worker.chain import ChainOutcome
from worker.scoring import boosts
from worker.scoring.blend import blended, first_stage_scores
from worker.scoring.calibration import ScoreMap
from worker.scoring.documents import has_text


def sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def normalise(score: float, scale: str) -> float:
    """Declared per provider: probabilities as they are, logits through a sigmoid, cosine
    similarities clipped at 0. Never by rank.

    A declared probability slightly outside [0, 1] (float noise from a hosted API) is
    clamped, so min_score keeps meaning "fraction of certainty"; it is never rescaled.

    A cosine similarity is neither: it is kept as it is above 0, so ``min_score`` is a
    cosine threshold and a weak best hit stays weak, and a negative one (texts that point
    apart: unrelated) reads as 0, not as some relevance. ``(1 + cos) / 2`` would keep the
    order below 0 too, but would score unrelated text 0.5; among documents the model finds
    unrelated, fusion order (the tie-break) is as good an order as any.

    A ``rank`` is no score on its own: it is read against its window's others (``rank_scores``).
    """
    if scale == "logit":
        return sigmoid(score)
    if scale == "rank":
        raise ValueError("a place is normalised against its window's others: rank_scores")
    return min(1.0, max(0.0, score))


def seeded_scores(n: int) -> list[float]:
    """Fusion rank mapped onto [0.1, 1.0], so boosts modulate fusion order instead of replacing it."""
    if n == 1:
        return [1.0]
    return [1.0 - 0.9 * rank / (n - 1) for rank in range(n)]


def rank_scores(places: list[float | None]) -> list[float | None]:
    """Places in a member's order (0 first; None where there is none) seeded as fusion ranks
    are: the first present 1.0, the last 0.1, evenly between, read by order alone (ties keep
    input order), so places with gaps between them (a window's text-less rows) still span it."""
    present = sorted((p, i) for i, p in enumerate(places) if p is not None)
    seeded: list[float | None] = [None] * len(places)
    for score, (_, i) in zip(seeded_scores(len(present)) if present else [], present):
        seeded[i] = score
    return seeded


def ranked_by_member(outcome: ChainOutcome) -> bool:
    """Whether the window's scores are places in the serving member's order, not relevance."""
    return outcome.scale == "rank"


def base_scores(candidates: list[Candidate], outcome: ChainOutcome) -> list[float | None]:
    """Normalised relevance per candidate; None where the provider omitted one.

    Passthrough is read from the outcome's explicit flag, never inferred from tied
    scores: a real model can tie, and seeding over it would corrupt a genuine rerank.
    """
    if outcome.passthrough:
        return list(seeded_scores(len(candidates)))
    if outcome.scores is None or outcome.scale is None:
        raise ValueError("a served, non-passthrough outcome must carry scores and a scale")
    if ranked_by_member(outcome):
        return rank_scores(outcome.scores)
    return [None if s is None else normalise(s, outcome.scale) for s in outcome.scores]


def _filter_reason(spec: StreamSpec, score: float, final: float, *, seeded: bool) -> str | None:
    # Seeded scores are ranks (fusion's or a listwise member's), not relevance: an absolute
    # threshold on them would drop the bottom of every such window for no reason.
    if seeded or not math.isfinite(score):
        return None
    if spec.min_score is not None and score < spec.min_score:
        return "min_score"
    if spec.min_final_score is not None and final < spec.min_final_score:
        return "min_final_score"
    return None


def decide(
    spec: StreamSpec,
    candidates: list[Candidate],
    documents: list[str],
    outcome: ChainOutcome,
    *,
    indexes: Sequence[int],
    calibration: ScoreMap | None = None,
    passages: list[PassageSpan | None] | None = None,
    first_stage_weight: float | None = None,
) -> list[Decision]:
    """Decisions for one window, in final order (final score desc; on ties a calibrated
    window's raw score, so a flat stretch of its map keeps the member's order; then the window's
    own order). ``indexes``: each candidate's index in the stream.

    ``calibration`` maps the serving member's normalised score to P(relevant); never applied
    to seeded scores (a passthrough window's, or a member's declared ranks). ``passages``: a
    passages stream's best passage of each candidate, kept on its decision.
    ``first_stage_weight``: the fitted weight for the serving member, where the stream sets
    none (``worker.scoring.blend``); never applied to a passthrough window, which is in fusion
    order already, nor to a member's declared ranks (the file's weights are fitted with its
    maps; the stream's own weight does blend them).
    """
    if outcome.failed:
        failure = outcome.reason or "failed"
        return [
            Failed(id=c.id, index=indexes[i], document=documents[i], reason=failure) for i, c in enumerate(candidates)
        ]
    served_by = outcome.served_by or ""
    base = base_scores(candidates, outcome)
    reference = boosts.reference_time(spec)

    seeded = outcome.passthrough or ranked_by_member(outcome)
    calibrate = calibration if calibration is not None and not seeded else None
    if ranked_by_member(outcome):
        first_stage_weight = None
    weight = spec.first_stage_weight if spec.first_stage_weight is not None else first_stage_weight
    if outcome.passthrough or not weight:
        weight = None
    first_stages = (
        first_stage_scores(
            [c.fusion_score for c in candidates],
            indexes=indexes,
            n_candidates=spec.n_candidates or max(indexes) + 1,
        )
        if weight is not None
        else None
    )

    scored: list[tuple[float, float, int, Decision]] = []
    omitted: list[Decision] = []
    for i, c in enumerate(candidates):
        index = indexes[i]
        raw: float | None = None
        first_stage: float | None = None
        member_score = base[i]
        if not has_text(c):
            # No text: sinks to the bottom of its window, never dropped.
            score = final = -math.inf
        elif member_score is None:
            omitted.append(Omitted(id=c.id, index=index, document=documents[i], served_by=served_by))
            continue
        else:
            score = member_score
            if calibrate is not None:
                raw, score = score, calibrate(score)
            ordered = score
            if weight is not None and first_stages is not None:
                first_stage = first_stages[i]
                ordered = blended(score, first_stage, weight)
            final = ordered * boosts.breakdown(c, spec, reference).multiplier(spec.boosts)
        reason = _filter_reason(spec, score, final, seeded=seeded)
        passage = passages[i] if passages is not None else None
        decision: Decision
        if reason:
            decision = Filtered(
                id=c.id,
                index=index,
                document=documents[i],
                score=score,
                final_score=final,
                served_by=served_by,
                reason=reason,
                raw_score=raw,
                calibrated=raw is not None,
                passage=passage,
                first_stage=first_stage,
                first_stage_weight=weight if first_stage is not None else None,
            )
        else:
            decision = Ranked(
                id=c.id,
                index=index,
                document=documents[i],
                score=score,
                final_score=final,
                served_by=served_by,
                raw_score=raw,
                calibrated=raw is not None,
                passage=passage,
                first_stage=first_stage,
                first_stage_weight=weight if first_stage is not None else None,
            )
        # Uncalibrated, equal final scores keep fusion order, as they always have.
        scored.append((final, raw if raw is not None else 0.0, i, decision))
    scored.sort(key=lambda item: (-item[0], -item[1], item[2]))
    return [d for *_, d in scored] + omitted
