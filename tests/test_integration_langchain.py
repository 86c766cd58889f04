"""The LangChain compressor against real langchain-core (and langchain-classic's
ContextualCompressionRetriever), a real worker scoring with the tiny cross-encoder, and Redis."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("langchain_core", reason="langchain-core is in the dev extra")

from integration_job import KB_TEXTS, QUERY, direct_rows, provider_calls, run_example  # noqa: E402
from langchain_classic.retrievers import ContextualCompressionRetriever  # noqa: E402
from langchain_core.callbacks import CallbackManagerForRetrieverRun  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from langchain_core.retrievers import BaseRetriever  # noqa: E402

from kernel.errors import NotScoredInTime  # noqa: E402
from producer.integrations.langchain import RerankqCompressor  # noqa: E402

TEXTS = [*KB_TEXTS, "lunch menu for friday"]


def documents() -> list[Document]:
    return [
        Document(page_content=text, metadata={"source": f"kb/{i}", "n": i}, id=f"doc-{i}")
        for i, text in enumerate(TEXTS)
    ]


class FixedRetriever(BaseRetriever):
    docs: list[Document]

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return self.docs


def direct(client, top_n: int, **options) -> list[tuple[int, float]]:
    """The same job sent through RerankClient itself."""
    return [(row.index, row.score) for row in direct_rows(client, QUERY, TEXTS, top_n, **options)]


def test_the_compressor_equals_rerankclient_carries_metadata_and_a_deeper_pull_costs_nothing(
    start_worker, make_client
) -> None:
    start_worker()
    client = make_client()
    compressor = RerankqCompressor(client=client, top_n=2, instruction="find runbooks", timeout_s=60)
    given = documents()
    top = compressor.compress_documents(given, QUERY)
    expected = direct(client, 2, instruction="find runbooks")
    assert [(d.metadata["n"], d.metadata["relevance_score"]) for d in top] == expected
    for doc in top:
        original = given[doc.metadata["n"]]
        assert doc.id == original.id and doc.page_content == original.page_content
        assert doc.metadata["source"] == original.metadata["source"]

    calls = provider_calls(client)
    deeper = RerankqCompressor(client=client, top_n=5, instruction="find runbooks", timeout_s=60)
    five = deeper.compress_documents(given, QUERY)
    assert provider_calls(client) == calls  # the committed window is read, not scored again
    assert [d.metadata["n"] for d in five[:2]] == [d.metadata["n"] for d in top]
    assert {d.metadata["rerankq_stream_id"] for d in five} == {top[0].metadata["rerankq_stream_id"]}
    assert [(d.metadata["n"], d.metadata["relevance_score"]) for d in five] == direct(
        client, 5, instruction="find runbooks"
    )


def test_a_queue_that_does_not_answer_in_time_raises_instead_of_answering_nothing(make_client) -> None:
    # No worker: an empty list would pass for "nothing relevant", so the compressor says why.
    compressor = RerankqCompressor(client=make_client(), top_n=2, timeout_s=0.5)
    with pytest.raises(NotScoredInTime) as late:
        compressor.compress_documents(documents(), QUERY)
    assert late.value.pending_windows == 1 and "is a worker running" in str(late.value)


def test_async_and_in_a_contextual_compression_retriever_with_min_score(start_worker, make_client) -> None:
    start_worker()
    client = make_client()
    compressor = RerankqCompressor(client=client, top_n=4, timeout_s=60)
    retriever = ContextualCompressionRetriever(
        base_compressor=compressor, base_retriever=FixedRetriever(docs=documents())
    )
    sync = retriever.invoke(QUERY)
    assert [(d.metadata["n"], d.metadata["relevance_score"]) for d in sync] == direct(client, 4)
    async_ = asyncio.run(retriever.ainvoke(QUERY))
    assert [d.metadata["n"] for d in async_] == [d.metadata["n"] for d in sync]
    assert asyncio.run(compressor.acompress_documents([], QUERY)) == []

    cut = sorted(d.metadata["relevance_score"] for d in sync)[1]
    strict = RerankqCompressor(client=client, top_n=4, min_score=cut, timeout_s=60)
    kept = strict.compress_documents(documents(), QUERY)
    assert kept and all(d.metadata["relevance_score"] >= cut for d in kept)
    assert [(d.metadata["n"], d.metadata["relevance_score"]) for d in kept] == direct(client, 4, min_score=cut)


def test_long_documents_passages_scores_a_long_document_by_its_passages(start_worker, make_client) -> None:
    start_worker()
    client = make_client()
    long_text = " ".join(["filler words about nothing in particular"] * 60) + " payment gateway 502 recovery steps"
    docs = [Document(page_content=long_text, metadata={"n": 0}), Document(page_content=TEXTS[0], metadata={"n": 1})]
    compressor = RerankqCompressor(client=client, top_n=2, long_documents="passages", timeout_s=60)
    top = compressor.compress_documents(docs, QUERY)
    page = client.pull(top[0].metadata["rerankq_stream_id"], 0, 2, timeout=60)
    long_row = next(row.decision for row in page.rows if row.decision.index == 0)
    assert long_row.passage is not None  # scored by its best passage, not an excerpt
    assert next(d for d in top if d.metadata["n"] == 0).metadata["relevance_score"] == long_row.score


@pytest.mark.slow  # a subprocess importing the framework, beside a worker: make test runs it
def test_the_example_runs(start_worker, base_env) -> None:
    start_worker()
    printed = run_example("langchain_compressor.py", base_env)
    lines = printed.splitlines()
    assert len(lines) == 3 and lines[-1].startswith("4 rows in k_int-")
    assert all("kb/" in line for line in lines[:2])
