"""The Haystack ranker against real haystack-ai (a Pipeline and run_async), a real worker scoring
with the tiny cross-encoder, and Redis.

The framework is imported in the tests, not at the module's top: every test process collects
every module, and importing haystack there cost each process two seconds."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest
from integration_job import KB_TEXTS, direct_rows, provider_calls, run_example

if TYPE_CHECKING:
    from haystack import Document

TEXTS = [*KB_TEXTS, None]  # haystack's content=None, as RAG pipelines pass it along: scored last, not refused


@pytest.fixture(scope="module", autouse=True)
def haystack_installed() -> None:
    pytest.importorskip("haystack", reason="haystack-ai is in the dev extra")


def documents() -> list[Document]:
    from haystack import Document

    return [Document(content=text, meta={"source": f"kb/{i}"}, id=f"doc-{i}") for i, text in enumerate(TEXTS)]


def direct(client, query: str, top_n: int, **options) -> list[tuple[str, float]]:
    texts = [t or "" for t in TEXTS]
    return [(f"doc-{row.index}", row.score) for row in direct_rows(client, query, texts, top_n, **options)]


def test_the_ranker_in_a_pipeline_equals_rerankclient_and_deeper_costs_nothing(shared_client, own_query) -> None:
    from haystack import Pipeline

    from producer.integrations.haystack import RerankqRanker

    client = shared_client
    pipeline = Pipeline()
    pipeline.add_component("ranker", RerankqRanker(client, top_k=2, instruction="find runbooks", timeout_s=60))
    top = pipeline.run({"ranker": {"query": own_query, "documents": documents()}})["ranker"]["documents"]
    assert [(d.id, d.score) for d in top] == direct(client, own_query, 2, instruction="find runbooks")
    assert all(d.meta["source"] == f"kb/{d.id.split('-')[1]}" for d in top)

    calls = provider_calls(client)
    ranker = RerankqRanker(client, top_k=2, instruction="find runbooks", timeout_s=60)
    six = asyncio.run(ranker.run_async(own_query, documents(), top_k=6))["documents"]
    assert provider_calls(client) == calls  # the committed window is read, not scored again
    assert [(d.id, d.score) for d in six] == direct(client, own_query, 6, instruction="find runbooks")
    assert six[-1].id == "doc-5" and six[-1].content is None
    assert ranker.run(own_query, [])["documents"] == []


@pytest.mark.slow  # a subprocess importing the framework, beside a worker: make test runs it
def test_the_example_runs(start_worker, base_env) -> None:
    start_worker()
    printed = run_example("haystack_ranker.py", base_env)
    lines = printed.splitlines()
    assert len(lines) == 2 and all("kb/" in line for line in lines)
