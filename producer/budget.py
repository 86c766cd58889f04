"""The candidate budget, applied on the producer side before any window forms.

The cross-encoder costs one forward pass per candidate, so the set it reads is capped.
Order of operations, each for a reason:

1. a per-source cap (first), so one over-expanding retrieval arm cannot fill the
   whole budget and crowd out every other arm's best hits;
2. strategy boosts (``source:level``) decide who survives the global cap: a favoured
   arm's candidates reach deeper, a disfavoured arm's shallower;
3. the global cap (default 300, overridable per budget level ``low``/``mid``/``high``).

Survivors keep their fusion order: the budget chooses *who* is reranked, never the order.
Then the over-fetch rule: keeping ``k`` from fewer than ``max(25, 4k)`` candidates is
refused, because a reranker cannot promote what retrieval did not return, and a shallow
set looks like it works (precision improves) while recall is silently capped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kernel.errors import TooShallow, ValidationError
from kernel.strategy_boosts import LEVELS
from kernel.strategy_boosts import parse_strategy_boosts as parse_strategy_boosts
from kernel.wire import BudgetLevel, Candidate

if TYPE_CHECKING:  # settings validates through this module, so no runtime import back
    from kernel.settings import Settings


# How much deeper a favoured arm reaches when candidates compete for the global cap.
# Survival is ranked by weight / (RRF_K + fusion rank): with weight 2 a "high" arm's
# candidate at fusion rank r outranks a neutral one at rank r' while r < 2 r' + 60.
# Unlisted sources (and candidates without a source) are "mid".
SURVIVAL_WEIGHT: dict[str, float] = {"low": 0.5, "mid": 1.0, "high": 2.0}
RRF_K = 60

MIN_RERANK_DEPTH = 25
OVER_FETCH_FACTOR = 4


@dataclass(frozen=True)
class BudgetLimits:
    """The caps in force for one open; 0 disables the per-source cap."""

    max_candidates: int = 300
    per_source: int = 0
    strategy_boosts: Mapping[str, BudgetLevel] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.max_candidates, int) or self.max_candidates < 1:
            raise ValidationError("max_rerank_candidates", f"must be a positive integer, got {self.max_candidates!r}")
        if not isinstance(self.per_source, int) or self.per_source < 0:
            raise ValidationError("max_candidates_per_source", f"must be 0 (off) or positive, got {self.per_source!r}")


def global_cap(flat: int, overrides: Mapping[str, int], budget: BudgetLevel | None) -> int:
    """The flat cap, or the per-level override when one is set (0 means use the flat cap)."""
    if budget is None:
        return flat
    if budget not in LEVELS:
        raise ValidationError("budget", f"must be low, mid or high, got {budget!r}")
    return overrides.get(budget) or flat


@dataclass(frozen=True)
class BudgetResult:
    kept: list[Candidate]
    dropped_per_source: int
    dropped_global: int


def cap_per_source(candidates: list[Candidate], per_source: int) -> list[Candidate]:
    """The first ``per_source`` of each named arm, in fusion order. Unnamed candidates are not an arm."""
    if per_source <= 0:
        return list(candidates)
    seen: dict[str, int] = {}
    kept = []
    for c in candidates:
        if c.source is not None:
            seen[c.source] = seen.get(c.source, 0) + 1
            if seen[c.source] > per_source:
                continue
        kept.append(c)
    return kept


def survival_priority(rank: int, candidate: Candidate, strategy_boosts: Mapping[str, BudgetLevel]) -> float:
    level = strategy_boosts.get(candidate.source, "mid") if candidate.source else "mid"
    return SURVIVAL_WEIGHT[level] / (RRF_K + rank)


def cap_global(candidates: list[Candidate], cap: int, strategy_boosts: Mapping[str, BudgetLevel]) -> list[Candidate]:
    """The ``cap`` candidates with the highest survival priority, back in fusion order."""
    if len(candidates) <= cap:
        return list(candidates)
    ranked = sorted(
        range(len(candidates)),
        key=lambda i: (-survival_priority(i, candidates[i], strategy_boosts), i),
    )
    survivors = sorted(ranked[:cap])
    return [candidates[i] for i in survivors]


def apply_budget(candidates: list[Candidate], limits: BudgetLimits) -> BudgetResult:
    after_source = cap_per_source(candidates, limits.per_source)
    kept = cap_global(after_source, limits.max_candidates, limits.strategy_boosts)
    return BudgetResult(
        kept=kept,
        dropped_per_source=len(candidates) - len(after_source),
        dropped_global=len(after_source) - len(kept),
    )


def required_depth(keep: int) -> int:
    return max(MIN_RERANK_DEPTH, OVER_FETCH_FACTOR * keep)


def check_over_fetch(n_candidates: int, keep: int | None, *, allow_shallow: bool, dropped: int = 0) -> None:
    """Refuse to rerank a set too shallow for the ``keep`` asked, unless the caller opts out."""
    if keep is None:
        return
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        raise ValidationError("keep", f"must be a positive integer, got {keep!r}")
    needed = required_depth(keep)
    if n_candidates >= needed or allow_shallow:
        return
    raise TooShallow(
        n_candidates=n_candidates,
        keep=keep,
        needed=needed,
        dropped=dropped,
        rule=f"max({MIN_RERANK_DEPTH}, {OVER_FETCH_FACTOR} x keep)",
    )


def limits_for(
    settings: Settings,
    *,
    budget: BudgetLevel | None = None,
    max_rerank_candidates: int | None = None,
    max_candidates_per_source: int | None = None,
    strategy_boosts: str | Mapping[str, str] | None = None,
) -> BudgetLimits:
    """The limits for one open: per-call values win over settings; the budget level picks an override."""
    overrides = {
        "low": settings.budget.max_rerank_candidates_low,
        "mid": settings.budget.max_rerank_candidates_mid,
        "high": settings.budget.max_rerank_candidates_high,
    }
    cap = global_cap(settings.budget.max_rerank_candidates, overrides, budget)
    if max_rerank_candidates is not None:
        cap = max_rerank_candidates
    return BudgetLimits(
        max_candidates=cap,
        per_source=max_candidates_per_source
        if max_candidates_per_source is not None
        else settings.budget.max_candidates_per_source,
        strategy_boosts=parse_strategy_boosts(
            strategy_boosts if strategy_boosts is not None else settings.budget.strategy_boosts
        ),
    )
