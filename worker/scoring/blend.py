"""The first stage blended in: a candidate's place in the fused list is evidence the reranker
should not throw away.

``first_stage_score`` reads the place as a score on [0.1, 1.0] over the whole stream (the
first candidate 1.0, the last 0.1: the scale passthrough windows are seeded on), so it means
the same in every window of the stream. The blend is ``(1 - w) * score + w * first_stage``,
with ``score`` the member's normalised (or calibrated) relevance and ``w`` the stream's
``first_stage_weight``, else the weight ``rerankq calibrate`` fitted for the serving member in
the calibration file, else 0 (no blend). Boosts multiply the blend; ``min_score`` still reads
the member's relevance, ``min_final_score`` the boosted blend.
"""

from __future__ import annotations

#: The first stage's score of the last candidate: above 0, so a boost still moves it.
LAST_PLACE = 0.1


def first_stage_score(index: int, n_candidates: int) -> float:
    """The place ``index`` (0 first) of ``n_candidates`` as a score on [0.1, 1.0]."""
    if n_candidates <= 1:
        return 1.0
    return 1.0 - (1.0 - LAST_PLACE) * min(index, n_candidates - 1) / (n_candidates - 1)


def blended(score: float, first_stage: float, weight: float) -> float:
    return (1.0 - weight) * score + weight * first_stage
