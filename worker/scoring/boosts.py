"""Multiplicative boosts: recency, temporal proximity, proof count, strategy level.

Each signal lies in [0, 1] with 0.5 neutral (missing data is neutral) and becomes a
multiplier ``1 + alpha * (signal - 0.5)``. Multipliers, not additive bonuses: the
effect stays proportional whatever scale the base score is on, and with the default
alphas it is bounded near +27% / -23% in total, so boosts reorder close neighbours
and never promote an irrelevant candidate over a relevant one.

Every time is measured against the stream's reference time (fixed at open), so a
re-read of the same stream computes the same numbers.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

from kernel.wire import Boosts, BudgetLevel, Candidate, StreamSpec, TimeRange

NEUTRAL = 0.5
_DAY_S = 86400.0

# After scoring, a favoured arm is nudged, gently: the strategy level already decided
# who survived the candidate budget; here it only breaks near-ties.
STRATEGY_MULTIPLIER: dict[str, float] = {"low": 0.97, "mid": 1.0, "high": 1.03}


def effective_time(candidate: Candidate) -> dt.datetime | None:
    """The same coalesce order retrieval uses: start, then mention, then end."""
    return candidate.occurred_start or candidate.mentioned_at or candidate.occurred_end


def _aware(when: dt.datetime) -> dt.datetime:
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.timezone.utc)


def _days_between(earlier: dt.datetime, later: dt.datetime) -> float:
    return (_aware(later) - _aware(earlier)).total_seconds() / _DAY_S


def recency(when: dt.datetime | None, reference: dt.datetime | None, boosts: Boosts) -> float:
    """1.0 for fresh (and future) dates, decaying with age; neutral without a date."""
    if when is None or reference is None or boosts.recency_curve == "none":
        return NEUTRAL
    age_days = _days_between(when, reference)
    if age_days <= 0:
        # A meeting next week is not stale because a naive age went negative.
        return 1.0
    if boosts.recency_curve == "exponential":
        # The half-life is the age at which a candidate is exactly neutral.
        return math.pow(0.5, age_days / boosts.recency_half_life_days)
    floor = min(max(boosts.recency_floor, 0.0), 1.0)
    return max(floor, 1.0 - (1.0 - floor) * age_days / boosts.recency_window_days)


def _span(candidate: Candidate) -> tuple[dt.datetime, dt.datetime] | None:
    """The interval a candidate is about: its occurrence, else the moment it was mentioned."""
    times = [t for t in (candidate.occurred_start, candidate.occurred_end) if t is not None]
    if not times and candidate.mentioned_at is not None:
        times = [candidate.mentioned_at]
    if not times:
        return None
    aware = [_aware(t) for t in times]
    return min(aware), max(aware)


def temporal(candidate: Candidate, query_range: TimeRange | None, boosts: Boosts) -> float:
    """1.0 when the candidate overlaps the query's range, halving every ``temporal_decay_days`` outside.

    Neutral when the query has no range or the candidate no date: a query that is not
    about time must not reorder anything by time.
    """
    span = _span(candidate)
    if query_range is None or span is None:
        return NEUTRAL
    start, end = _aware(query_range.start), _aware(query_range.end)
    if span[1] < start:
        distance = _days_between(span[1], start)
    elif span[0] > end:
        distance = _days_between(end, span[0])
    else:
        return 1.0
    if boosts.temporal_decay_days <= 0:
        return 0.0
    return math.pow(0.5, distance / boosts.temporal_decay_days)


def proof(count: int | None) -> float:
    """``clamp(0.5 + ln(n) / 10, 0, 1)``: one proof is neutral, ~150 is the ceiling, none is the floor."""
    if count is None:
        return NEUTRAL
    if count <= 0:
        return 0.0
    return min(1.0, max(0.0, 0.5 + math.log(count) / 10.0))


def factor(alpha: float, signal: float) -> float:
    return 1.0 + alpha * (signal - NEUTRAL)


@dataclass(frozen=True)
class BoostBreakdown:
    recency: float
    temporal: float
    proof: float
    strategy: float

    def multiplier(self, boosts: Boosts) -> float:
        return (
            factor(boosts.recency_alpha, self.recency)
            * factor(boosts.temporal_alpha, self.temporal)
            * factor(boosts.proof_alpha, self.proof)
            * self.strategy
        )


def breakdown(candidate: Candidate, spec: StreamSpec, reference: dt.datetime | None) -> BoostBreakdown:
    level: BudgetLevel | None = spec.strategy_boosts.get(candidate.source) if candidate.source else None
    return BoostBreakdown(
        recency=recency(effective_time(candidate), reference, spec.boosts),
        temporal=temporal(candidate, spec.query_range, spec.boosts),
        proof=proof(candidate.proof_count),
        strategy=STRATEGY_MULTIPLIER[level] if level else 1.0,
    )


def reference_time(spec: StreamSpec) -> dt.datetime | None:
    # Set at open. Never "now" here: a worker's clock would make a re-read (or a
    # redelivered window) compute different numbers. Without one, recency is neutral.
    return _aware(spec.reference_time) if spec.reference_time else None


def multiplier(candidate: Candidate, spec: StreamSpec) -> float:
    """The combined boost a candidate's base score is multiplied by."""
    return breakdown(candidate, spec, reference_time(spec)).multiplier(spec.boosts)


def bounds(boosts: Boosts, *, strategy: bool = False) -> tuple[float, float]:
    """The smallest and largest combined multiplier these settings can produce."""
    low = factor(boosts.recency_alpha, 0.0) * factor(boosts.temporal_alpha, 0.0) * factor(boosts.proof_alpha, 0.0)
    high = factor(boosts.recency_alpha, 1.0) * factor(boosts.temporal_alpha, 1.0) * factor(boosts.proof_alpha, 1.0)
    if strategy:
        low *= min(STRATEGY_MULTIPLIER.values())
        high *= max(STRATEGY_MULTIPLIER.values())
    return low, high
