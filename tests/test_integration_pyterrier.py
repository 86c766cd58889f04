"""The PyTerrier transformer against real PyTerrier (``pt.Experiment`` over a run), a real
worker scoring with the tiny cross-encoder in the batch lane, and Redis."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pd = pytest.importorskip("pandas", reason="python-terrier (and pandas) are in the dev extra")
pt = pytest.importorskip("pyterrier", reason="python-terrier is in the dev extra")

from producer.integrations.pyterrier import RerankqReranker  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
QUERIES = {"q1": "payment gateway 502 recovery", "q2": "where is the printer"}
TEXTS = [
    "the cat sat on the mat",
    "checkout returned 502 after the certificate expired",
    "how to recover checkout after 502s",
    "office facilities: the printer on floor 3",
    "a payment gateway runbook for 502 errors",
]


def first_stage() -> pd.DataFrame:
    """A run as a first stage leaves it: every document for every query, in one fixed order."""
    rows = [
        {"qid": qid, "query": query, "docno": f"d{i}", "text": text, "score": float(-i), "rank": i}
        for qid, query in QUERIES.items()
        for i, text in enumerate(TEXTS)
    ]
    return pd.DataFrame(rows)


def provider_calls(client) -> int:
    return client.store.counters().get("provider_calls:0:local", 0)


def direct(client, qid: str) -> list[tuple[str, float]]:
    stream_id = client.open(QUERIES[qid], [{"id": f"d{i}", "text": t} for i, t in enumerate(TEXTS)], lane="batch")
    page = client.pull(stream_id, 0, len(TEXTS), timeout=60)
    return [(f"d{row.decision.index}", row.decision.score) for row in page.rows if row.kind == "ranked"]


def test_a_run_reranked_in_the_batch_lane_equals_rerankclient_and_again_costs_nothing(
    start_worker, make_client
) -> None:
    start_worker()
    client = make_client()
    reranker = RerankqReranker(client, timeout_s=60)
    out = reranker.transform(first_stage())
    for qid in QUERIES:
        mine = out[out["qid"] == qid].sort_values("rank")
        assert list(zip(mine["docno"], mine["score"], strict=True)) == direct(client, qid)
        assert list(mine["rank"]) == list(range(len(TEXTS)))
        assert set(mine["query"]) == {QUERIES[qid]}
    stream_id = reranker.queue.stream(QUERIES["q1"], TEXTS)
    assert client.status(stream_id) is not None
    assert client.store.snapshot(stream_id).lane == "batch"

    calls = provider_calls(client)
    again = reranker.transform(first_stage())
    assert provider_calls(client) == calls
    assert again.equals(out)


def test_pt_experiment_compares_it_with_the_first_stage(start_worker, make_client) -> None:
    start_worker()
    client = make_client()
    qrels = pd.DataFrame(
        [
            {"qid": "q1", "docno": "d2", "label": 1},
            {"qid": "q1", "docno": "d4", "label": 1},
            {"qid": "q2", "docno": "d3", "label": 1},
        ]
    )
    topics = pd.DataFrame([{"qid": qid, "query": query} for qid, query in QUERIES.items()])
    run = first_stage()
    bm25_like = pt.Transformer.from_df(run)
    table = pt.Experiment(
        [bm25_like, bm25_like >> RerankqReranker(client, timeout_s=60)],
        topics,
        qrels,
        eval_metrics=["map"],
        names=["first stage", "rerankq"],
    )
    assert list(table["name"]) == ["first stage", "rerankq"]
    assert table["map"].between(0, 1).all()


def test_the_example_runs(start_worker, base_env) -> None:
    start_worker()
    ran = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "pyterrier_experiment.py")],
        env=base_env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "rerankq" in ran.stdout and "first stage" in ran.stdout
