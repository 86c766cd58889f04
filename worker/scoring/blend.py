"""The first stage blended in: a candidate's place in the fused list, and its ``fusion_score``
when the candidates carry one, is evidence the reranker should not throw away.

``first_stage_scores`` reads a window's first stage as scores on the stream's scale, [0.1, 1.0]
(the first candidate of the stream 1.0, the last 0.1: the scale passthrough windows are seeded
on), so a weight means the same in every window:

- by place (``first_stage_score``): evenly spaced, for candidates without a fusion score;
- by fusion score, where every candidate of the window carries a finite one, in the stream's
  order (not increasing down the fused list) and not all equal: the window keeps its places'
  range on the stream's scale (its first place's score to its last's: for a stream of one
  window, 1.0 to 0.1) and the fusion scores space the candidates within it. Each score is read as its z-score
  over the window, through a logistic, then spread min-max over the range. The z-score makes
  it scale-free (BM25's scores of one query are on a scale of their own, RRF's and cosines'
  on others); the logistic keeps one outlying top score from pressing every other one down to
  the floor, as a plain min-max does. (A score that is not in its list's order, a distance or
  one arm's score, is read by place.) On the long collection this is what lifted the blend
  from +0.087/+0.043 to about +0.07 on each held-out half at one stable weight
  (``ops.bench.blend_quality``).

The blend is ``(1 - w) * score + w * first_stage``, with ``score`` the member's normalised (or
calibrated) relevance and ``w`` the stream's ``first_stage_weight``, else the weight ``rerankq
calibrate`` fitted for the serving member in the calibration file, else 0 (no blend). Boosts
multiply the blend; ``min_score`` still reads the member's relevance, ``min_final_score`` the
boosted blend.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: The first stage's score of the last candidate: above 0, so a boost still moves it.
LAST_PLACE = 0.1


def first_stage_score(index: int, n_candidates: int) -> float:
    """The place ``index`` (0 first) of ``n_candidates`` as a score on [0.1, 1.0]."""
    if n_candidates <= 1:
        return 1.0
    return 1.0 - (1.0 - LAST_PLACE) * min(index, n_candidates - 1) / (n_candidates - 1)


def first_stage_scores(
    fusion_scores: Sequence[float | None], *, indexes: Sequence[int], n_candidates: int
) -> list[float]:
    """The first stage's score of each candidate of a window, given the candidates' fusion
    scores (None where a candidate has none) and their indexes in a stream of
    ``n_candidates`` (a window's are consecutive; a later stage's of a cascade need not be);
    see the module's docstring."""
    places = [first_stage_score(index, n_candidates) for index in indexes]
    spread = _spread(fusion_scores, indexes)
    if spread is None:
        return places
    top, bottom = max(places), min(places)
    return [bottom + (top - bottom) * u for u in spread]


def _spread(fusion_scores: Sequence[float | None], indexes: Sequence[int]) -> list[float] | None:
    """Each fusion score on [0, 1]: the logistic of its z-score, min-max over the window; None
    where the scores cannot be read so (one missing or not finite, fewer than two, all equal,
    or not in their stream's order: higher first)."""
    values = [f for f in fusion_scores if f is not None and math.isfinite(f)]
    if len(values) < 2 or len(values) < len(fusion_scores):
        return None
    in_order = [value for _, value in sorted(zip(indexes, values))]
    if any(later > earlier for earlier, later in zip(in_order, in_order[1:])):
        return None
    mean = math.fsum(values) / len(values)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
    if not sd > 0.0:
        return None
    squashed = [1.0 / (1.0 + math.exp(-(v - mean) / sd)) for v in values]
    low, high = min(squashed), max(squashed)
    if not high > low:
        return None
    return [(s - low) / (high - low) for s in squashed]


def blended(score: float, first_stage: float, weight: float) -> float:
    return (1.0 - weight) * score + weight * first_stage
