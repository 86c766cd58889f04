"""Ranking parity between two score lists: what "keeps ranking parity" means here.

A reduced precision is acceptable only where it orders a window the way fp32 does
(Spearman rank correlation), whatever it does to the last digits of each score.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: The bar a reduced precision must clear per window against fp32.
MIN_SPEARMAN = 0.99

#: How far an engine's fp32 score may be from sentence-transformers' own for the same pair:
#: an absolute 1e-3 plus 1e-3 of the score's size (logit-scale scores run to tens). Same
#: model, same inputs, same fp32 arithmetic: only the batch shape differs, which moves the
#: last digits (1e-6 here), never the third.
SCORE_TOLERANCE = 1e-3


class EngineDisagrees(Exception):
    """The engine does not give the scores sentence-transformers gives for this model: refused at load."""


def within_tolerance(expected: float, actual: float) -> bool:
    return abs(expected - actual) <= SCORE_TOLERANCE * (1.0 + abs(expected))


def disagreement_with(expected: Sequence[float], actual: Sequence[float]) -> str | None:
    """Why ``actual`` is not the library's ``expected`` (max |diff| past the tolerance, or a
    ranking below parity), or None when it is."""
    worst = max_abs_diff(expected, actual)
    if not all(within_tolerance(e, a) for e, a in zip(expected, actual)):
        return f"max |diff| {worst:.3g} past the tolerance {SCORE_TOLERANCE:g} (+{SCORE_TOLERANCE:g}*|score|)"
    rho = spearman(expected, actual)
    if rho < MIN_SPEARMAN:
        return f"Spearman {rho:.4f} below {MIN_SPEARMAN}"
    return None


def _ranks(values: Sequence[float]) -> list[float]:
    """Average ranks, so ties rank alike (the Spearman definition for ties)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0
        i = j + 1
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Pearson correlation of ranks; 1.0 for windows too small or too flat to disagree."""
    if len(a) != len(b):
        raise ValueError(f"lengths differ: {len(a)} and {len(b)}")
    if len(a) < 2:
        return 1.0
    ra, rb = _ranks(a), _ranks(b)
    mean_a, mean_b = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - mean_a) * (y - mean_b) for x, y in zip(ra, rb))
    var_a = sum((x - mean_a) ** 2 for x in ra)
    var_b = sum((y - mean_b) ** 2 for y in rb)
    if var_a == 0 or var_b == 0:
        return 1.0 if var_a == var_b else 0.0
    return cov / math.sqrt(var_a * var_b)


def max_abs_diff(a: Sequence[float], b: Sequence[float]) -> float:
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)
