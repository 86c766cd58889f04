"""How well a score reads as a probability of relevance: expected calibration error and the
reliability diagram's points.

Scores are binned into ``BINS`` equal-width bins over [0, 1] (a score of exactly 1 falls in
the last). Per bin: the mean score (predicted) and the share of relevant pairs (observed).
ECE is the pairs-weighted mean of ``|predicted - observed|`` over the bins (Naeini et al.,
2015; Guo et al., 2017): 0 when a score of 0.3 means "relevant three times in ten" everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BINS = 10


@dataclass(frozen=True)
class Bin:
    low: float
    high: float
    pairs: int
    predicted: float
    observed: float


def bins(scores: Sequence[float], relevant: Sequence[bool], *, n_bins: int = BINS) -> list[Bin]:
    """The non-empty bins, lowest first."""
    p = np.clip(np.asarray(scores, dtype=float), 0.0, 1.0)
    y = np.asarray(relevant, dtype=float)
    if p.shape != y.shape:
        raise ValueError("one relevance label per score")
    which = np.minimum((p * n_bins).astype(int), n_bins - 1)
    out = []
    for b in range(n_bins):
        mask = which == b
        n = int(mask.sum())
        if n:
            out.append(
                Bin(
                    low=b / n_bins,
                    high=(b + 1) / n_bins,
                    pairs=n,
                    predicted=float(p[mask].mean()),
                    observed=float(y[mask].mean()),
                )
            )
    return out


def expected_calibration_error(scores: Sequence[float], relevant: Sequence[bool], *, n_bins: int = BINS) -> float:
    binned = bins(scores, relevant, n_bins=n_bins)
    total = sum(b.pairs for b in binned)
    if not total:
        raise ValueError("no scored pairs")
    return sum(b.pairs * abs(b.predicted - b.observed) for b in binned) / total


def brier(scores: Sequence[float], relevant: Sequence[bool]) -> float:
    """Mean squared error of the score as a probability against relevance (0 or 1)."""
    from sklearn.metrics import brier_score_loss

    return float(brier_score_loss(np.asarray(relevant, dtype=int), np.clip(np.asarray(scores, dtype=float), 0, 1)))


def summary(scores: Sequence[float], relevant: Sequence[bool]) -> dict[str, object]:
    """ECE and the reliability points, as the report keeps them."""
    return {
        "ece": expected_calibration_error(scores, relevant),
        "bins": [
            {"low": b.low, "high": b.high, "pairs": b.pairs, "predicted": b.predicted, "observed": b.observed}
            for b in bins(scores, relevant)
        ],
    }
