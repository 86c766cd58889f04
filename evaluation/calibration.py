"""Fitting a member's calibration map on judged pairs (``rerankq calibrate``), with scikit-learn.

A pair is a reranked document of a judged query, with the score the member gave it
(normalised: what ``min_score`` reads) and whether it is relevant (grade >= the relevant
grade). Unjudged documents are not relevant by default, as trec_eval counts them: right for a
pooled collection (the shipped one judged every system's top 10), wrong for sparse judgements
(MS MARCO's one positive per query), where ``unjudged="skipped"`` keeps judged pairs only.

Two methods, both monotone, so a calibrated window ranks as the member did:

- **isotonic** (``IsotonicRegression``): no assumption about the curve's shape, which a
  cosine similarity's or a hosted reranker's is not known to have; it needs data, about a
  thousand pairs and fifty relevant ones before its steps stop following noise
  (Niculescu-Mizil & Caruana, 2005; scikit-learn's guide says the same). The steps are kept
  as one breakpoint per block at the block's mean score, interpolated between (centred
  isotonic regression, Oron & Flournoy, 2017): strictly increasing between the first block
  and the last, so documents of one block are not tied.
- **platt** (``LogisticRegression`` on the score): a sigmoid, two parameters, fine from a
  few hundred pairs and a few dozen relevant ones, wrong where the curve is not a sigmoid.

``auto`` takes isotonic from ``ISOTONIC_MIN_PAIRS`` pairs and ``ISOTONIC_MIN_POSITIVES``
relevant ones, Platt below. Fewer than ``MIN_EACH`` relevant or irrelevant pairs is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from evaluation.reliability import brier, expected_calibration_error
from evaluation.runner import QueryRun
from worker.scoring.calibration import Fit, MemberMap, interpolate

Method = Literal["auto", "isotonic", "platt"]
Unjudged = Literal["irrelevant", "skipped"]

ISOTONIC_MIN_PAIRS = 1000
ISOTONIC_MIN_POSITIVES = 50
MIN_EACH = 10
#: Breakpoints a Platt map is sampled at, over [0, 1].
PLATT_POINTS = 101


class FitError(Exception):
    """Too few judged pairs, or scores that do not rise with relevance."""


@dataclass(frozen=True)
class Pairs:
    scores: list[float]
    relevant: list[bool]

    @property
    def positives(self) -> int:
        return sum(self.relevant)


def judged_pairs(queries: Sequence[QueryRun], *, relevant_grade: int, unjudged: Unjudged) -> Pairs:
    """Every scored pair of the queries, with its member's own score and its relevance."""
    scores, relevant = [], []
    for query in queries:
        for pair in query.scored:
            if pair.grade is None and unjudged == "skipped":
                continue
            scores.append(pair.raw)
            relevant.append(pair.grade is not None and pair.grade >= relevant_grade)
    return Pairs(scores=scores, relevant=relevant)


def chosen_method(pairs: Pairs, method: Method) -> Literal["isotonic", "platt"]:
    if method != "auto":
        return method
    enough = len(pairs.scores) >= ISOTONIC_MIN_PAIRS and pairs.positives >= ISOTONIC_MIN_POSITIVES
    return "isotonic" if enough else "platt"


def _centred_isotonic(x: np.ndarray, y: np.ndarray) -> tuple[list[float], list[float]]:
    from sklearn.isotonic import IsotonicRegression

    order = np.argsort(x, kind="stable")
    xs, ys = x[order], y[order]
    fitted = IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, out_of_bounds="clip").fit_transform(xs, ys)
    points_x: list[float] = []
    points_y: list[float] = []
    start = 0
    for end in range(1, len(xs) + 1):
        if end == len(xs) or fitted[end] != fitted[start]:
            centre, value = float(xs[start:end].mean()), float(fitted[start])
            if points_x and centre <= points_x[-1]:
                # Equal scores straddling blocks cannot happen (ties are pooled), but equal
                # means can by rounding: keep the breakpoints strictly increasing.
                points_y[-1] = max(points_y[-1], value)
            else:
                points_x.append(centre)
                points_y.append(value)
            start = end
    return points_x, points_y


def _platt(x: np.ndarray, y: np.ndarray) -> tuple[list[float], list[float]]:
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(C=1e6, max_iter=1000).fit(x.reshape(-1, 1), y.astype(int))
    if model.coef_[0][0] <= 0:
        raise FitError("the member's scores do not rise with relevance on these pairs")
    grid = np.linspace(0.0, 1.0, PLATT_POINTS)
    return grid.tolist(), model.predict_proba(grid.reshape(-1, 1))[:, 1].tolist()


def fit_map(pairs: Pairs, *, label: str, method: Method = "auto") -> MemberMap:
    """The member's map from its score to P(relevant), with its support and its error on the fit."""
    negatives = len(pairs.scores) - pairs.positives
    if pairs.positives < MIN_EACH or negatives < MIN_EACH:
        raise FitError(
            f"{label}: {pairs.positives} relevant and {negatives} irrelevant pairs; "
            f"a map needs at least {MIN_EACH} of each"
        )
    x = np.asarray(pairs.scores, dtype=float)
    y = np.asarray(pairs.relevant, dtype=float)
    used = chosen_method(pairs, method)
    xs, ys = _centred_isotonic(x, y) if used == "isotonic" else _platt(x, y)
    calibrated = [interpolate(xs, ys, s) for s in pairs.scores]
    fit = Fit(
        pairs=len(pairs.scores),
        positives=pairs.positives,
        brier=brier(calibrated, pairs.relevant),
        ece_raw=expected_calibration_error(pairs.scores, pairs.relevant),
        ece=expected_calibration_error(calibrated, pairs.relevant),
    )
    return MemberMap(label=label, method=used, scores=xs, probabilities=ys, fit=fit)
