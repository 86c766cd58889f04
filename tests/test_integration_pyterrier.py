"""The PyTerrier transformer against real PyTerrier (``pt.Experiment`` over a run), a real
worker scoring with the tiny cross-encoder in the batch lane, and Redis."""

from __future__ import annotations

import pytest

pd = pytest.importorskip("pandas", reason="python-terrier (and pandas) are in the dev extra")
pt = pytest.importorskip("pyterrier", reason="python-terrier is in the dev extra")

from integration_job import KB_TEXTS, direct_rows, provider_calls, run_example  # noqa: E402

from producer.integrations.pyterrier import RerankqReranker  # noqa: E402

QUERIES = {"q1": "payment gateway 502 recovery", "q2": "where is the printer"}


def first_stage() -> pd.DataFrame:
    """A run as a first stage leaves it: every document for every query, in one fixed order."""
    rows = [
        {"qid": qid, "query": query, "docno": f"d{i}", "text": text, "score": float(-i), "rank": i}
        for qid, query in QUERIES.items()
        for i, text in enumerate(KB_TEXTS)
    ]
    return pd.DataFrame(rows)


def direct(client, qid: str) -> list[tuple[str, float]]:
    return [
        (f"d{row.index}", row.score) for row in direct_rows(client, QUERIES[qid], KB_TEXTS, len(KB_TEXTS), lane="batch")
    ]


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
        assert list(mine["rank"]) == list(range(len(KB_TEXTS)))
        assert set(mine["query"]) == {QUERIES[qid]}
    stream_id = reranker.queue.stream(QUERIES["q1"], KB_TEXTS)
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


@pytest.mark.slow  # a subprocess importing the framework, beside a worker: make test runs it
def test_the_example_runs(start_worker, base_env) -> None:
    start_worker()
    printed = run_example("pyterrier_experiment.py", base_env, timeout=180)
    assert "rerankq" in printed and "first stage" in printed
