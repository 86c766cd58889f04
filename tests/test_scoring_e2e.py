"""The scoring rules end to end: a real worker (``python -m worker``), a real Redis, the tiny
real model. Every expected number here is computed in the test from the written rule
(DESIGN.md "Scores"), not by calling the code under test.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kernel.wire import Filtered, Ranked, TimeRange, WindowResult
from producer import RerankClient

REF = dt.datetime(2023, 3, 1, tzinfo=dt.timezone.utc)
QUERY = "payment gateway error"
RRF = {"RERANKQ_RERANKER_PROVIDER": "rrf"}


def committed(client: RerankClient, stream: str) -> list[WindowResult]:
    results = client.store.snapshot(stream).results
    return [results[w] for w in sorted(results)]


def decisions_by_id(client: RerankClient, stream: str) -> dict[str, Any]:
    return {d.id: d for r in committed(client, stream) for d in r.decisions}


def seeded(rank: int, n: int) -> float:
    return 1.0 if n == 1 else 1.0 - 0.9 * rank / (n - 1)


def linear_recency_factor(age_days: float) -> float:
    recency = 1.0 if age_days <= 0 else max(0.1, 1.0 - 0.9 * age_days / 365.0)
    return 1.0 + 0.2 * (recency - 0.5)


def temporal_factor(age_days: float, range_from_days: float, range_to_days: float) -> float:
    """1.0 inside the query's range, halving every 30 days outside it."""
    outside = max(0.0, age_days - range_from_days, range_to_days - age_days)
    return 1.0 + 0.2 * (0.5 ** (outside / 30.0) - 0.5)


def proof_factor(n: int) -> float:
    return 1.0 + 0.1 * (min(1.0, max(0.0, 0.5 + math.log(n) / 10.0)) - 0.5)


def test_the_text_scored_is_the_text_returned_and_textless_rows_sink(
    shared_client: RerankClient, own_query: str, tiny_model_dir: Path
) -> None:
    # The shared worker runs fp32 (tests/conftest.py queue_env_for): the check below predicts in fp32.
    client = shared_client
    long_text = (
        "unrelated filler text. " * 40 + "the payment gateway error came from a certificate. " + "more filler. " * 40
    )
    items = [
        {
            "id": "dated",
            "text": "restart the pods after the payment gateway error",
            "context": "incident 42",
            "heading_path": ["Runbooks", "Payments"],
            "occurred_start": "2022-06-05T10:00:00Z",
        },
        {"id": "empty", "text": ""},
        {"id": "long", "text": long_text},
        {"id": "plain", "text": "checkout recovery after an outage"},
        {"id": "blank", "text": "  \n "},
    ]
    stream = client.open(own_query, items, window_size=10, reference_time=REF, document_budget=120)
    page = client.pull(stream, 0, 10, timeout=60)
    assert page.complete and page.total == 5  # text-less rows are counted, never dropped
    by_id = {r.id: r.decision for r in page.rows}

    assert by_id["dated"].document == (
        "[Date: June 05, 2022 (2022-06-05)] Runbooks > Payments\n\nincident 42: "
        "restart the pods after the payment gateway error"
    )
    assert len(by_id["long"].document) == 120
    assert "payment gateway error came from" in by_id["long"].document
    assert by_id["plain"].document == "checkout recovery after an outage"

    # The provider scored exactly that text: recompute with the same model, in this process.
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(tiny_model_dir), device="cpu")
    for cid in ("dated", "long", "plain"):
        expected = float(model.predict([(own_query, by_id[cid].document)])[0])
        assert by_id[cid].score == pytest.approx(expected, abs=1e-4)
    raw = float(model.predict([(own_query, items[0]["text"])])[0])
    assert abs(raw - by_id["dated"].score) > 1e-3, "the raw text would have scored differently"

    # Both text-less rows (empty, whitespace only) sink, in fusion order among themselves.
    assert [r.id for r in page.rows[-2:]] == ["empty", "blank"]
    for last in page.rows[-2:]:
        assert last.kind == "ranked" and last.score == -math.inf and last.final_score == -math.inf


def test_min_filters_reach_redis_with_their_scores(shared_client: RerankClient, own_query: str) -> None:
    client = shared_client
    words = [
        "payment",
        "gateway",
        "error",
        "checkout",
        "outage",
        "retry",
        "certificate",
        "dns",
        "cache",
        "invoice",
        "vendor",
        "laptop",
    ]
    items = [
        {
            "id": f"c{i}",
            "text": f"{w} {words[(i * 5) % 12]} report",
            "occurred_start": (REF - dt.timedelta(days=40 * i)).isoformat(),
        }
        for i, w in enumerate(words)
    ] + [{"id": "empty", "text": ""}]
    open_ = dict(window_size=13, reference_time=REF)
    probe = client.open(own_query, items, **open_)
    client.pull(probe, 0, 13, timeout=60)
    free = decisions_by_id(client, probe)
    assert all(isinstance(d, Ranked) for d in free.values())

    scored = sorted((d for d in free.values() if math.isfinite(d.score)), key=lambda d: d.score)
    assert len({d.score for d in scored}) == len(scored), "the tiny model should spread its scores"
    min_score = (scored[2].score + scored[3].score) / 2  # three below
    passing = sorted((d for d in scored if d.score >= min_score), key=lambda d: d.final_score)
    min_final = (passing[1].final_score + passing[2].final_score) / 2  # two more below

    stream = client.open(own_query, items, min_score=min_score, min_final_score=min_final, **open_)
    page = client.pull(stream, 0, 13, timeout=60)
    got = decisions_by_id(client, stream)
    reasons = {}
    for cid, d in got.items():
        assert d.score == pytest.approx(free[cid].score, abs=1e-6)  # scores are kept on filtered rows
        assert d.final_score == pytest.approx(free[cid].final_score, abs=1e-6)
        if isinstance(d, Filtered):
            reasons[cid] = d.reason
    expected = {d.id: "min_score" for d in scored[:3]} | {d.id: "min_final_score" for d in passing[:2]}
    assert reasons == expected
    assert isinstance(got["empty"], Ranked)  # -inf means "no text", not "irrelevant"
    assert page.total == 13 - 5 and {r.id for r in page.rows}.isdisjoint(expected)


def test_an_rrf_window_keeps_fusion_order_gently_boosted(
    start_worker: Callable[..., Any], make_client: Callable[..., RerankClient]
) -> None:
    start_worker(env=RRF)
    client = make_client()
    n = 10
    # Fusion's best hit is the oldest: a date sort would put it last.
    ages = [20 * (n - i) for i in range(n)]
    items = [
        {"id": f"c{i}", "text": f"memory {i}", "occurred_start": (REF - dt.timedelta(days=ages[i])).isoformat()}
        for i in range(n)
    ]
    items[3]["proof_count"] = 40
    items[5]["source"] = "graph"
    # The query asks about 100 to 50 days before the reference time.
    query_range = TimeRange(start=REF - dt.timedelta(days=100), end=REF - dt.timedelta(days=50))
    stream = client.open(
        QUERY,
        items,
        window_size=n,
        reference_time=REF,
        min_score=0.99,
        min_final_score=0.99,
        strategy_boosts="graph:high",
        query_range=query_range,
    )
    page = client.pull(stream, 0, n, timeout=60)
    [result] = committed(client, stream)
    assert result.passthrough and result.served_by and result.served_by.endswith("rrf")
    assert page.total == n  # min scores do not apply to seeded scores

    expected = {}
    for i in range(n):
        final = seeded(i, n) * linear_recency_factor(ages[i]) * temporal_factor(ages[i], 100, 50)
        if i == 3:
            final *= proof_factor(40)
        if i == 5:
            final *= 1.03
        expected[f"c{i}"] = final
    for r in page.rows:
        i = int(r.id[1:])
        assert r.score == pytest.approx(seeded(i, n))
        assert r.final_score == pytest.approx(expected[r.id])
    order = [r.id for r in page.rows]
    assert order == sorted(expected, key=lambda cid: (-expected[cid], int(cid[1:])))
    assert order != [f"c{i}" for i in reversed(range(n))]  # not newest-first
    assert order[0] == "c0"

    again = client.pull(stream, 0, n, timeout=5)
    assert [(r.id, r.final_score) for r in again.rows] == [(r.id, r.final_score) for r in page.rows]


def test_the_budget_decides_what_reaches_the_windows(
    start_worker: Callable[..., Any], make_client: Callable[..., RerankClient]
) -> None:
    start_worker(env=RRF)
    client = make_client(max_rerank_candidates=20, max_candidates_per_source=12, strategy_boosts="graph:high")
    items = [{"id": f"c{i}", "text": f"memory {i}", "source": "semantic" if i < 40 else "graph"} for i in range(60)]
    stream = client.open(QUERY, items, window_size=10)
    page = client.pull(stream, 0, 20, timeout=60)
    assert page.complete and page.total == 20
    # Per source first (semantic c0-c11, graph c40-c51), then graph:high survives the cap
    # of 20 ahead of the deeper semantic rows; survivors keep fusion order in windows.
    survivors = [f"c{i}" for i in range(8)] + [f"c{i}" for i in range(40, 52)]
    windows = committed(client, stream)
    assert [sorted(d.index for d in w.decisions) for w in windows] == [list(range(10)), list(range(10, 20))]
    by_index = {d.index: d.id for w in windows for d in w.decisions}
    assert [by_index[i] for i in range(20)] == survivors
    # After scoring the strategy level nudges again, gently.
    for w in windows:
        for d in w.decisions:
            rank = d.index - w.start
            boost = 1.03 if d.id in survivors[8:] else 1.0
            assert d.final_score == pytest.approx(seeded(rank, 10) * boost)


def test_select_postprocesses_at_read_time_and_changes_nothing_stored(
    start_worker: Callable[..., Any], make_client: Callable[..., RerankClient], raw_redis: Any, namespace: str
) -> None:
    start_worker(env=RRF)
    client = make_client()
    vectors = [[1.0, 0.0], [0.99, 0.05], [0.98, 0.1], [0.0, 1.0], [0.1, 0.99], [0.7, 0.7]]
    items = [{"id": f"c{i}", "text": f"memory {i}", "doc_id": f"d{i // 2}", "embedding": vectors[i]} for i in range(6)]
    stream = client.open(QUERY, items, window_size=6)
    client.pull(stream, 0, 6, timeout=60)
    keys = client.store.keys.stream(stream).all()
    before = {k: raw_redis.dump(k) for k in keys}

    plain = client.select(stream, 3, depth=6)
    assert [r.id for r in plain.rows] == ["c0", "c1", "c2"]
    capped = client.select(stream, 3, depth=6, per_doc=1)
    assert [r.id for r in capped.rows] == ["c0", "c2", "c4"]
    diverse = client.select(stream, 2, depth=6, mmr_lambda=0.5)
    assert [r.id for r in diverse.rows][0] == "c0" and diverse.rows[1].id in {"c3", "c4"}
    cut = client.select(stream, 6, depth=6, gap_ratio=0.9)
    assert [r.id for r in cut.rows] == ["c0"]  # seeded 1.0 then 0.82: a drop past 0.9x
    assert plain.considered == 6

    after = {k: raw_redis.dump(k) for k in keys}
    assert after == before and before[client.store.keys.stream(stream).results] is not None
