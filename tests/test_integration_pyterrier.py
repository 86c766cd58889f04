"""The PyTerrier transformer against real PyTerrier (``pt.Experiment`` over a run), a real
worker scoring with the tiny cross-encoder in the batch lane, and Redis.

PyTerrier and pandas are imported in the tests, not at the module's top: every test process
collects every module, and importing them there cost each process half a second."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from integration_job import KB_TEXTS, direct_rows, provider_calls, run_example

if TYPE_CHECKING:
    import pandas as pd


@pytest.fixture(scope="module", autouse=True)
def pyterrier_installed() -> None:
    pytest.importorskip("pandas", reason="python-terrier (and pandas) are in the dev extra")
    pytest.importorskip("pyterrier", reason="python-terrier is in the dev extra")


@pytest.fixture
def queries(own_query: str) -> dict[str, str]:
    """Two queries of this test's own (the shared worker's pair cache keys on the query)."""
    return {"q1": own_query, "q2": f"where is the printer ({own_query})"}


def first_stage(queries: dict[str, str]) -> pd.DataFrame:
    """A run as a first stage leaves it: every document for every query, in one fixed order."""
    import pandas as pd

    rows = [
        {"qid": qid, "query": query, "docno": f"d{i}", "text": text, "score": float(-i), "rank": i}
        for qid, query in queries.items()
        for i, text in enumerate(KB_TEXTS)
    ]
    return pd.DataFrame(rows)


def direct(client, query: str) -> list[tuple[str, float]]:
    return [(f"d{row.index}", row.score) for row in direct_rows(client, query, KB_TEXTS, len(KB_TEXTS), lane="batch")]


def test_a_run_reranked_in_the_batch_lane_equals_rerankclient_and_again_costs_nothing(shared_client, queries) -> None:
    from producer.integrations.pyterrier import RerankqReranker

    client = shared_client
    reranker = RerankqReranker(client, timeout_s=60)
    out = reranker.transform(first_stage(queries))
    for qid, query in queries.items():
        mine = out[out["qid"] == qid].sort_values("rank")
        assert list(zip(mine["docno"], mine["score"], strict=True)) == direct(client, query)
        assert list(mine["rank"]) == list(range(len(KB_TEXTS)))
        assert set(mine["query"]) == {query}
    stream_id = reranker.queue.stream(queries["q1"], KB_TEXTS)
    assert client.status(stream_id) is not None
    assert client.store.snapshot(stream_id).lane == "batch"

    calls = provider_calls(client)
    again = reranker.transform(first_stage(queries))
    assert provider_calls(client) == calls
    assert again.equals(out)


def test_pt_experiment_compares_it_with_the_first_stage(shared_client, queries) -> None:
    import pandas as pd
    import pyterrier as pt

    from producer.integrations.pyterrier import RerankqReranker

    qrels = pd.DataFrame(
        [
            {"qid": "q1", "docno": "d2", "label": 1},
            {"qid": "q1", "docno": "d4", "label": 1},
            {"qid": "q2", "docno": "d3", "label": 1},
        ]
    )
    topics = pd.DataFrame([{"qid": qid, "query": query} for qid, query in queries.items()])
    bm25_like = pt.Transformer.from_df(first_stage(queries))
    table = pt.Experiment(
        [bm25_like, bm25_like >> RerankqReranker(shared_client, timeout_s=60)],
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
