"""The producer's candidate budget, the over-fetch rule, and read-time post-processing."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.errors import ConfigError, ValidationError
from kernel.wire import Candidate, Ranked, Row
from producer import RerankClient, load_settings
from producer.budget import (
    BudgetLimits,
    apply_budget,
    check_over_fetch,
    limits_for,
    parse_strategy_boosts,
)
from producer.postprocess import PostProcess, cap_per_doc, mmr, postprocess, truncate_at_gap

FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SOURCES = ["semantic", "bm25", "graph", "temporal", None]


def cands(sources: list[str | None]) -> list[Candidate]:
    return [Candidate(id=f"c{i}", text="t", source=s) for i, s in enumerate(sources)]


# -- settings ----------------------------------------------------------------


def test_strategy_boosts_parse_and_name_the_variable_when_wrong() -> None:
    assert parse_strategy_boosts("graph:high, bm25:low") == {"graph": "high", "bm25": "low"}
    assert parse_strategy_boosts("") == {}
    with pytest.raises(ValidationError) as err:
        parse_strategy_boosts("graph:extreme")
    assert err.value.field == "strategy_boosts"
    with pytest.raises(ConfigError) as cfg:
        load_settings({"RERANKQ_STRATEGY_BOOSTS": "graph"})
    assert cfg.value.variable == "RERANKQ_STRATEGY_BOOSTS"
    with pytest.raises(ConfigError) as cfg:
        load_settings({"RERANKQ_MAX_RERANK_CANDIDATES": "0"})
    assert cfg.value.variable == "RERANKQ_MAX_RERANK_CANDIDATES"


def test_per_budget_overrides_and_per_call_values() -> None:
    s = load_settings(
        {
            "RERANKQ_MAX_RERANK_CANDIDATES": "300",
            "RERANKQ_MAX_RERANK_CANDIDATES_LOW": "50",
            "RERANKQ_MAX_RERANK_CANDIDATES_HIGH": "600",
            "RERANKQ_MAX_CANDIDATES_PER_SOURCE": "40",
            "RERANKQ_STRATEGY_BOOSTS": "graph:high",
        }
    )
    assert limits_for(s).max_candidates == 300
    assert limits_for(s, budget="low").max_candidates == 50
    assert limits_for(s, budget="mid").max_candidates == 300  # 0: use the flat cap
    assert limits_for(s, budget="high").max_candidates == 600
    assert limits_for(s).per_source == 40 and limits_for(s).strategy_boosts == {"graph": "high"}
    call = limits_for(s, budget="low", max_rerank_candidates=7, max_candidates_per_source=0, strategy_boosts="bm25:low")
    assert (call.max_candidates, call.per_source, dict(call.strategy_boosts)) == (7, 0, {"bm25": "low"})
    with pytest.raises(ValidationError) as err:
        limits_for(s, budget="huge")  # type: ignore[arg-type]
    assert err.value.field == "budget"


# -- caps --------------------------------------------------------------------


@FAST
@given(
    st.lists(st.sampled_from(SOURCES), min_size=0, max_size=400),
    st.integers(min_value=1, max_value=120),
    st.integers(min_value=0, max_value=60),
    st.dictionaries(st.sampled_from(SOURCES[:4]), st.sampled_from(["low", "mid", "high"]), max_size=4),
)
def test_budget_caps_hold_per_source_and_globally(
    sources: list[str | None], cap: int, per_source: int, strategy: dict[str, str]
) -> None:
    items = cands(sources)
    result = apply_budget(items, BudgetLimits(max_candidates=cap, per_source=per_source, strategy_boosts=strategy))
    kept = result.kept
    assert len(kept) <= cap
    if per_source:
        counts = Counter(c.source for c in kept if c.source is not None)
        assert all(n <= per_source for n in counts.values())
    # Survivors keep fusion order: the budget chooses who, never the order.
    indexes = [int(c.id[1:]) for c in kept]
    assert indexes == sorted(indexes)
    assert len(kept) + result.dropped_per_source + result.dropped_global == len(items)
    if not per_source and len(items) <= cap:
        assert kept == items


def test_per_source_cap_runs_first_so_one_arm_cannot_fill_the_budget() -> None:
    # An over-expanding arm returns 200 rows ahead of the graph arm's 50.
    items = cands(["semantic"] * 200 + ["graph"] * 50)
    without = apply_budget(items, BudgetLimits(max_candidates=100)).kept
    assert {c.source for c in without} == {"semantic"}
    capped = apply_budget(items, BudgetLimits(max_candidates=100, per_source=50)).kept
    assert Counter(c.source for c in capped) == {"semantic": 50, "graph": 50}


def test_strategy_boosts_decide_who_survives_the_cap() -> None:
    items = cands(["semantic", "graph"] * 100)
    neutral = Counter(c.source for c in apply_budget(items, BudgetLimits(max_candidates=100)).kept)
    favoured = Counter(
        c.source for c in apply_budget(items, BudgetLimits(max_candidates=100, strategy_boosts={"graph": "high"})).kept
    )
    disfavoured = Counter(
        c.source for c in apply_budget(items, BudgetLimits(max_candidates=100, strategy_boosts={"graph": "low"})).kept
    )
    assert neutral["graph"] == 50
    assert favoured["graph"] > 50 > disfavoured["graph"]


# -- the over-fetch rule -----------------------------------------------------


def test_over_fetch_rule() -> None:
    check_over_fetch(25, 6, allow_shallow=False)  # max(25, 24)
    check_over_fetch(40, 10, allow_shallow=False)
    with pytest.raises(ValidationError) as err:
        check_over_fetch(24, 6, allow_shallow=False)
    assert err.value.field == "keep"
    assert "too shallow" in err.value.message and "cannot promote" in err.value.message
    with pytest.raises(ValidationError, match="max\\(25, 4 x keep\\) = 40"):
        check_over_fetch(39, 10, allow_shallow=False, dropped=100)
    check_over_fetch(12, 6, allow_shallow=True)
    check_over_fetch(3, None, allow_shallow=False)  # no keep: no rule
    with pytest.raises(ValidationError):
        check_over_fetch(100, 0, allow_shallow=False)


def test_open_applies_the_budget_and_refuses_a_shallow_set(make_client: Callable[..., RerankClient]) -> None:
    client = make_client(max_rerank_candidates=30, max_candidates_per_source=12)
    items = [{"id": f"c{i}", "text": "t", "source": s} for i, s in enumerate(["semantic"] * 40 + ["graph"] * 20)]
    with pytest.raises(ValidationError) as err:
        client.open("payment", items, keep=10)  # 24 survive the budget: under max(25, 40)
    assert err.value.field == "keep" and "removed by the candidate budget" in err.value.message
    stream = client.open("payment", items, keep=10, allow_shallow=True, window_size=50)
    spec = client.store.load_spec(stream)
    stored = client.store.load_candidates(stream, 0, spec.n_candidates)
    assert spec.n_candidates == 24
    assert Counter(c.source for c in stored) == {"semantic": 12, "graph": 12}
    per_call = client.open(
        "payment", items, max_rerank_candidates=5, max_candidates_per_source=0, strategy_boosts="graph:high"
    )
    assert client.store.load_spec(per_call).strategy_boosts == {"graph": "high"}
    assert client.store.load_spec(per_call).n_candidates == 5


# -- read-time post-processing ------------------------------------------------


def row(index: int, score: float, rank: int | None = None) -> Row:
    d = Ranked(id=f"c{index}", index=index, document="d", score=score, final_score=score, served_by="0:x")
    return Row(rank=rank or index + 1, window=0, decision=d)


def test_per_doc_cap() -> None:
    rows = [row(i, 1 - i / 10) for i in range(6)]
    docs = {0: "a", 1: "a", 2: "b", 3: "a", 4: None, 5: None}
    assert [r.decision.index for r in cap_per_doc(rows, docs, 2)] == [0, 1, 2, 4, 5]


def test_score_gap_truncation() -> None:
    rows = [row(0, 0.9), row(1, 0.85), row(2, 0.3), row(3, 0.29)]
    assert [r.decision.index for r in truncate_at_gap(rows, 0.6)] == [0, 1]
    assert len(truncate_at_gap(rows, 0.1)) == 4


def test_mmr_prefers_a_diverse_second_pick() -> None:
    rows = [row(0, 0.9), row(1, 0.89), row(2, 0.8)]
    embeddings = {0: [1.0, 0.0], 1: [0.99, 0.01], 2: [0.0, 1.0]}
    assert [r.decision.index for r in mmr(rows, embeddings, 2, 0.7)] == [0, 2]
    assert [r.decision.index for r in mmr(rows, embeddings, 2, 1.0)] == [0, 1]  # pure relevance


def test_postprocess_validates_and_never_touches_its_input() -> None:
    rows = [row(i, 1 - i / 10) for i in range(5)]
    before = list(rows)
    candidates = {i: Candidate(id=f"c{i}", doc_id="same") for i in range(5)}
    assert len(postprocess(rows, candidates, 3, PostProcess(per_doc=1))) == 1
    assert rows == before
    for bad in (PostProcess(per_doc=0), PostProcess(gap_ratio=1.5), PostProcess(mmr_lambda=-0.1)):
        with pytest.raises(ValidationError):
            postprocess(rows, candidates, 3, bad)
