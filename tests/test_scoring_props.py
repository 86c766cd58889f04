"""Invariants of the scoring step: normalisation, passthrough seeding, boosts, filters.

These drive the real ``decide()`` with chain outcomes built as inputs (what a member
returned); nothing here asserts on a mock.
"""

from __future__ import annotations

import datetime as dt
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.wire import Boosts, Candidate, Filtered, Omitted, Ranked, StreamSpec, TimeRange
from worker.chain import ChainOutcome
from worker.scoring import boosts
from worker.scoring.decide import decide, normalise, seeded_scores, sigmoid

REF = dt.datetime(2024, 6, 1, tzinfo=dt.timezone.utc)
DEFAULT = Boosts()
LOW, HIGH = boosts.bounds(DEFAULT)
# The largest factor by which boosts can change the ratio of two final scores.
SPREAD = HIGH / LOW

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def spec(**kw: object) -> StreamSpec:
    base: dict[str, object] = {"query": "payment gateway", "window_size": 256, "reference_time": REF}
    base.update(kw)
    return StreamSpec(**base)  # type: ignore[arg-type]


def served(scores: list[float | None], scale: str = "probability") -> ChainOutcome:
    return ChainOutcome(served_by="0:local", scale=scale, scores=scores)  # type: ignore[arg-type]


def passthrough(n: int) -> ChainOutcome:
    return ChainOutcome(served_by="1:rrf", scale=None, scores=[None] * n)


def run(s: StreamSpec, candidates: list[Candidate], outcome: ChainOutcome) -> list:
    return decide(s, candidates, [c.text for c in candidates], outcome, indexes=range(len(candidates)))


# -- strategies --------------------------------------------------------------

days = st.floats(min_value=-400, max_value=3000, allow_nan=False)
maybe_time = st.one_of(st.none(), days.map(lambda d: REF - dt.timedelta(days=d)))


@st.composite
def dated_candidate(draw: st.DrawFn, id: str = "c0") -> Candidate:
    return Candidate(
        id=id,
        text="payment gateway error",
        occurred_start=draw(maybe_time),
        occurred_end=draw(maybe_time),
        mentioned_at=draw(maybe_time),
        proof_count=draw(st.one_of(st.none(), st.integers(min_value=0, max_value=100_000))),
    )


@st.composite
def candidate_lists(draw: st.DrawFn, min_size: int = 2, max_size: int = 25) -> list[Candidate]:
    n = draw(st.integers(min_value=min_size, max_value=max_size))
    return [draw(dated_candidate(f"c{i}")) for i in range(n)]


query_ranges = st.one_of(
    st.none(),
    st.tuples(days, st.floats(min_value=0, max_value=400)).map(
        lambda t: TimeRange(
            start=REF - dt.timedelta(days=t[0]), end=REF - dt.timedelta(days=t[0]) + dt.timedelta(days=t[1])
        )
    ),
)
curves = st.sampled_from(["linear", "exponential", "none"])


# -- normalisation -----------------------------------------------------------


def test_a_calibrated_weak_best_hit_stays_weak() -> None:
    candidates = [Candidate(id=f"c{i}", text="t") for i in range(3)]
    decisions = run(spec(), candidates, served([0.003, 0.007, 0.001]))
    assert [d.id for d in decisions] == ["c1", "c0", "c2"]
    assert decisions[0].score == 0.007 and decisions[0].final_score == 0.007


@FAST
@given(st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=30))
def test_calibrated_scores_are_used_as_they_are(scores: list[float]) -> None:
    candidates = [Candidate(id=f"c{i}", text="t") for i in range(len(scores))]
    decisions = run(spec(), candidates, served(list(scores)))
    by_id = {d.id: d for d in decisions}
    for i, s in enumerate(scores):
        # Exactly the input: neither rank-normalised (best -> 1.0) nor squashed by a sigmoid.
        assert by_id[f"c{i}"].score == s
        assert by_id[f"c{i}"].final_score == s  # no dates, no proof: neutral boosts are exactly 1.0


@FAST
@given(st.lists(st.floats(min_value=-30, max_value=30), min_size=1, max_size=30))
def test_logits_go_through_a_sigmoid_never_by_rank(logits: list[float]) -> None:
    candidates = [Candidate(id=f"c{i}", text="t") for i in range(len(logits))]
    decisions = run(spec(), candidates, served(list(logits), scale="logit"))
    by_id = {d.id: d for d in decisions}
    for i, x in enumerate(logits):
        assert by_id[f"c{i}"].score == pytest.approx(1 / (1 + math.exp(-x)), rel=1e-12, abs=1e-300)
    if max(logits) < -1e-9:
        assert max(d.score for d in decisions) < 0.5  # a weak best hit is not inflated


def test_sigmoid_is_stable_at_the_extremes() -> None:
    assert sigmoid(-1000) == 0.0 and sigmoid(1000) == 1.0 and sigmoid(0) == 0.5
    assert normalise(1.0000001, "probability") == 1.0  # float noise clamped, never rescaled


# -- passthrough seeding -----------------------------------------------------


def test_seeded_scores_follow_fusion_rank() -> None:
    assert seeded_scores(1) == [1.0]
    assert seeded_scores(2) == pytest.approx([1.0, 0.1])
    assert seeded_scores(4) == pytest.approx([1.0, 0.7, 0.4, 0.1])


def test_passthrough_is_never_inferred_from_ties() -> None:
    # A real model can tie; its 0.5s stay 0.5s and are not replaced by a fusion seed.
    candidates = [Candidate(id=f"c{i}", text="t") for i in range(10)]
    decisions = run(spec(), candidates, served([0.5] * 10))
    assert {d.score for d in decisions} == {0.5}
    assert [d.id for d in decisions] == [c.id for c in candidates]


def test_min_scores_do_not_apply_to_seeded_scores() -> None:
    candidates = [Candidate(id=f"c{i}", text="t") for i in range(5)]
    decisions = run(spec(min_score=0.95, min_final_score=0.95), candidates, passthrough(5))
    assert all(isinstance(d, Ranked) for d in decisions)
    assert [d.score for d in decisions] == pytest.approx([1.0, 0.775, 0.55, 0.325, 0.1])


def fusion_inversions(decisions: list, seeded: list[float]) -> list[tuple[int, int]]:
    """Pairs (i, j) of fusion ranks, i before j in fusion order, that the result swapped."""
    position = {d.index: p for p, d in enumerate(decisions)}
    n = len(seeded)
    return [(i, j) for i in range(n) for j in range(i + 1, n) if position[j] < position[i]]


def illegitimate_swaps(decisions: list, seeded: list[float], spread: float = SPREAD) -> list[tuple[int, int]]:
    """Swaps of two candidates whose seeded scores differ by more than the boosts can bridge."""
    return [(i, j) for i, j in fusion_inversions(decisions, seeded) if seeded[i] > seeded[j] * spread]


@FAST
@given(candidate_lists(), query_ranges, curves)
def test_a_passthrough_window_keeps_fusion_order_up_to_close_neighbour_swaps(
    candidates: list[Candidate], query_range: TimeRange | None, curve: str
) -> None:
    s = spec(query_range=query_range, boosts=Boosts(recency_curve=curve))  # type: ignore[arg-type]
    decisions = run(s, candidates, passthrough(len(candidates)))
    seeded = seeded_scores(len(candidates))
    assert illegitimate_swaps(decisions, seeded) == []
    for d in decisions:
        assert d.score == pytest.approx(seeded[d.index])


def _reversed_dates(n: int) -> list[Candidate]:
    # The worst case for the trap: fusion's best hit is the oldest, its worst the newest.
    return [Candidate(id=f"c{i}", text="t", occurred_start=REF - dt.timedelta(days=15 * (n - i))) for i in range(n)]


def _is_date_sort(decisions: list, candidates: list[Candidate]) -> bool:
    by_id = {c.id: c for c in candidates}
    times = [by_id[d.id].occurred_start for d in decisions]
    return times == sorted(times, reverse=True)


def test_passthrough_never_becomes_a_date_sort() -> None:
    n = 20
    candidates = _reversed_dates(n)
    ours = run(spec(), candidates, passthrough(n))
    assert not _is_date_sort(ours, candidates)
    assert illegitimate_swaps(ours, seeded_scores(n)) == []
    assert ours[0].id == "c0"  # fusion's best hit still leads, though it is the oldest


def test_the_naive_identical_score_passthrough_is_a_date_sort_and_fails_the_invariant() -> None:
    """What the invariant above protects against: give every candidate the same base
    score (a passthrough read as "the model said 1.0 for all") and the boosts become the
    only signal. The same checks that pass for the seeded passthrough fail here."""
    n = 20
    candidates = _reversed_dates(n)
    naive = run(spec(), candidates, served([1.0] * n))
    assert _is_date_sort(naive, candidates)
    assert [d.id for d in naive] == [f"c{i}" for i in reversed(range(n))]  # newest first: recall is gone
    assert illegitimate_swaps(naive, seeded_scores(n)) != []
    with pytest.raises(AssertionError):
        assert naive[0].id == "c0"


# -- boosts ------------------------------------------------------------------


def test_default_bounds_match_the_documented_ones() -> None:
    no_proof = Boosts(proof_alpha=0.0)
    low, high = boosts.bounds(no_proof)
    assert high == pytest.approx(1.21) and low == pytest.approx(0.81)  # ~ +21% / -19%
    assert HIGH == pytest.approx(1.21 * 1.05) and LOW == pytest.approx(0.81 * 0.95)  # proof: +-5% more


@FAST
@given(dated_candidate(), query_ranges, curves, st.floats(0, 1), st.floats(0, 1), st.floats(0, 1), st.floats(0.0, 1.0))
def test_combined_multiplier_stays_within_its_bounds(
    candidate: Candidate,
    query_range: TimeRange | None,
    curve: str,
    a_r: float,
    a_t: float,
    a_p: float,
    floor: float,
) -> None:
    b = Boosts(recency_alpha=a_r, temporal_alpha=a_t, proof_alpha=a_p, recency_curve=curve, recency_floor=floor)  # type: ignore[arg-type]
    s = spec(boosts=b, query_range=query_range)
    parts = boosts.breakdown(candidate, s, REF)
    for signal in (parts.recency, parts.temporal, parts.proof):
        assert 0.0 <= signal <= 1.0
    low, high = boosts.bounds(b)
    m = boosts.multiplier(candidate, s)
    assert low - 1e-12 <= m <= high + 1e-12
    default_m = boosts.multiplier(candidate, spec(query_range=query_range))
    assert LOW - 1e-12 <= default_m <= HIGH + 1e-12


@FAST
@given(
    candidate_lists(max_size=15),
    query_ranges,
    st.lists(st.floats(min_value=1e-6, max_value=1.0), min_size=15, max_size=15),
)
def test_boosts_never_reorder_candidates_whose_base_scores_are_far_apart(
    candidates: list[Candidate], query_range: TimeRange | None, base: list[float]
) -> None:
    base = base[: len(candidates)]
    decisions = run(spec(query_range=query_range), candidates, served(list(base)))
    for upper, d in enumerate(decisions):
        for lower in decisions[upper + 1 :]:
            # If a candidate finished above another, the boosts may have bridged at most SPREAD.
            assert lower.score <= d.score * SPREAD * (1 + 1e-12)


def test_recency_curves() -> None:
    day = dt.timedelta(days=1)
    linear = Boosts()
    assert boosts.recency(REF, REF, linear) == 1.0
    assert boosts.recency(REF + 10 * day, REF, linear) == 1.0  # a future date is freshest
    assert boosts.recency(REF - 365 * day, REF, linear) == pytest.approx(0.1)
    assert boosts.recency(REF - 3650 * day, REF, linear) == pytest.approx(0.1)  # the floor
    assert boosts.recency(REF - 182.5 * day, REF, linear) == pytest.approx(0.55)
    exp = Boosts(recency_curve="exponential")
    assert boosts.recency(REF - 90 * day, REF, exp) == pytest.approx(0.5)  # half-life is neutral
    assert boosts.recency(REF - 180 * day, REF, exp) == pytest.approx(0.25)
    assert boosts.recency(REF - 10 * day, REF, Boosts(recency_curve="none")) == 0.5
    assert boosts.recency(None, REF, linear) == 0.5


def test_effective_time_falls_back_start_then_mention_then_end() -> None:
    a, b, c = (REF - dt.timedelta(days=d) for d in (1, 2, 3))
    assert boosts.effective_time(Candidate(id="x", occurred_start=a, mentioned_at=b, occurred_end=c)) == a
    assert boosts.effective_time(Candidate(id="x", mentioned_at=b, occurred_end=c)) == b
    assert boosts.effective_time(Candidate(id="x", occurred_end=c)) == c
    assert boosts.effective_time(Candidate(id="x")) is None


def test_temporal_proximity() -> None:
    day = dt.timedelta(days=1)
    rng = TimeRange(start=REF - 10 * day, end=REF)
    b = Boosts()
    inside = Candidate(id="x", occurred_start=REF - 5 * day)
    near = Candidate(id="x", occurred_start=REF - 40 * day)  # 30 days before the range
    far = Candidate(id="x", occurred_start=REF - 400 * day)
    assert boosts.temporal(inside, rng, b) == 1.0
    assert boosts.temporal(near, rng, b) == pytest.approx(0.5)
    assert 0.0 <= boosts.temporal(far, rng, b) < 0.01
    assert boosts.temporal(inside, None, b) == 0.5  # a query without a range reorders nothing by time
    assert boosts.temporal(Candidate(id="x"), rng, b) == 0.5
    spanning = Candidate(id="x", occurred_start=REF - 50 * day, occurred_end=REF - 9 * day)
    assert boosts.temporal(spanning, rng, b) == 1.0  # overlaps the range


def test_proof_count_curve() -> None:
    assert boosts.proof(None) == 0.5
    assert boosts.proof(1) == 0.5
    assert boosts.proof(10) == pytest.approx(0.5 + math.log(10) / 10)
    assert boosts.proof(149) == pytest.approx(1.0, abs=0.001)
    assert boosts.proof(10_000) == 1.0
    assert boosts.proof(0) == 0.0


def test_numbers_come_from_the_streams_reference_time_not_the_clock() -> None:
    old_ref = dt.datetime(2001, 1, 1, tzinfo=dt.timezone.utc)
    c = Candidate(id="x", text="t", occurred_start=old_ref - dt.timedelta(days=365))
    first = run(spec(reference_time=old_ref), [c], served([0.5]))[0]
    again = run(spec(reference_time=old_ref), [c], served([0.5]))[0]
    assert first.final_score == again.final_score == pytest.approx(0.5 * 0.92)  # a year old: floor 0.1


def test_strategy_boost_nudges_after_scoring() -> None:
    cands = [Candidate(id="a", text="t", source="bm25"), Candidate(id="b", text="t", source="graph")]
    decisions = run(spec(strategy_boosts={"graph": "high", "bm25": "low"}), cands, served([0.5, 0.49]))
    by_id = {d.id: d for d in decisions}
    assert by_id["b"].final_score == pytest.approx(0.49 * 1.03)
    assert by_id["a"].final_score == pytest.approx(0.5 * 0.97)
    assert [d.id for d in decisions] == ["b", "a"]  # near-tie broken toward the favoured arm


# -- filters and text-less candidates ---------------------------------------


def test_min_score_and_min_final_score_filter_with_scores_kept() -> None:
    cands = [
        Candidate(id="strong", text="t"),
        Candidate(id="weak", text="t"),
        Candidate(id="old", text="t", occurred_start=REF - dt.timedelta(days=3000)),
    ]
    decisions = run(spec(min_score=0.3, min_final_score=0.5), cands, served([0.9, 0.2, 0.52]))
    by_id = {d.id: d for d in decisions}
    assert isinstance(by_id["strong"], Ranked)
    assert isinstance(by_id["weak"], Filtered) and by_id["weak"].reason == "min_score"
    assert by_id["weak"].score == 0.2
    old = by_id["old"]
    assert isinstance(old, Filtered) and old.reason == "min_final_score"
    assert old.score == 0.52 and old.final_score == pytest.approx(0.52 * 0.92)


def test_a_candidate_without_text_sinks_and_is_never_dropped() -> None:
    cands = [
        Candidate(id="a", text="t"),
        Candidate(id="empty", text=""),
        Candidate(id="b", text="t"),
        Candidate(id="blank", text=" \t\n"),
    ]
    decisions = run(spec(min_score=0.5), cands, served([0.01, None, 0.02, None]))
    assert [d.id for d in decisions] == ["b", "a", "empty", "blank"]
    for empty in decisions[-2:]:
        assert isinstance(empty, Ranked)  # not filtered either: -inf is "no text", not "irrelevant"
        assert empty.score == -math.inf and empty.final_score == -math.inf
    # The same for a passthrough window.
    seeded = run(spec(), cands, passthrough(4))
    assert [d.id for d in seeded][-2:] == ["empty", "blank"] and len(seeded) == 4


def test_an_omitted_candidate_stays_omitted() -> None:
    cands = [Candidate(id="a", text="t"), Candidate(id="b", text="t")]
    decisions = run(spec(), cands, served([0.4, None]))
    assert isinstance(decisions[-1], Omitted) and decisions[-1].id == "b"
