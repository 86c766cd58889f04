"""The LangChain compressor against real langchain-core (and langchain-classic's
ContextualCompressionRetriever), a real worker scoring with the tiny cross-encoder, and Redis.

The framework is imported in the tests, not at the module's top: every test process collects
every module, and importing the framework there cost each process a second."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest
from integration_job import KB_TEXTS, QUERY, direct_rows, provider_calls, run_example

from kernel.errors import NotScoredInTime

if TYPE_CHECKING:
    from langchain_core.documents import Document

    from producer.integrations.langchain import RerankqCompressor

TEXTS = [*KB_TEXTS, "lunch menu for friday"]


@pytest.fixture(scope="module", autouse=True)
def langchain_installed() -> None:
    pytest.importorskip("langchain_core", reason="langchain-core is in the dev extra")


def documents() -> list[Document]:
    from langchain_core.documents import Document

    return [
        Document(page_content=text, metadata={"source": f"kb/{i}", "n": i}, id=f"doc-{i}")
        for i, text in enumerate(TEXTS)
    ]


def compressor(**fields: Any) -> RerankqCompressor:
    from producer.integrations.langchain import RerankqCompressor

    return RerankqCompressor(**fields)


def retriever_of(docs: list[Document], base_compressor: RerankqCompressor) -> Any:
    """langchain-classic's ContextualCompressionRetriever over a retriever that returns ``docs``."""
    from langchain_classic.retrievers import ContextualCompressionRetriever
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.retrievers import BaseRetriever

    class FixedRetriever(BaseRetriever):
        docs: list[Any]  # pydantic resolves a field's type at class creation, where Document is not imported

        def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
            return self.docs

    return ContextualCompressionRetriever(base_compressor=base_compressor, base_retriever=FixedRetriever(docs=docs))


def direct(client, query: str, top_n: int, **options) -> list[tuple[int, float]]:
    """The same job sent through RerankClient itself."""
    return [(row.index, row.score) for row in direct_rows(client, query, TEXTS, top_n, **options)]


def test_the_compressor_equals_rerankclient_carries_metadata_and_a_deeper_pull_costs_nothing(
    shared_client, own_query
) -> None:
    client = shared_client
    top_two = compressor(client=client, top_n=2, instruction="find runbooks", timeout_s=60)
    given = documents()
    top = top_two.compress_documents(given, own_query)
    expected = direct(client, own_query, 2, instruction="find runbooks")
    assert [(d.metadata["n"], d.metadata["relevance_score"]) for d in top] == expected
    for doc in top:
        original = given[doc.metadata["n"]]
        assert doc.id == original.id and doc.page_content == original.page_content
        assert doc.metadata["source"] == original.metadata["source"]

    calls = provider_calls(client)
    deeper = compressor(client=client, top_n=5, instruction="find runbooks", timeout_s=60)
    five = deeper.compress_documents(given, own_query)
    assert provider_calls(client) == calls  # the committed window is read, not scored again
    assert [d.metadata["n"] for d in five[:2]] == [d.metadata["n"] for d in top]
    assert {d.metadata["rerankq_stream_id"] for d in five} == {top[0].metadata["rerankq_stream_id"]}
    assert [(d.metadata["n"], d.metadata["relevance_score"]) for d in five] == direct(
        client, own_query, 5, instruction="find runbooks"
    )


def test_a_queue_that_does_not_answer_in_time_raises_instead_of_answering_nothing(make_client) -> None:
    # No worker: an empty list would pass for "nothing relevant", so the compressor says why.
    late_one = compressor(client=make_client(), top_n=2, timeout_s=0.5)
    with pytest.raises(NotScoredInTime) as late:
        late_one.compress_documents(documents(), QUERY)
    assert late.value.pending_windows == 1 and "is a worker running" in str(late.value)


def test_async_and_in_a_contextual_compression_retriever_with_min_score(shared_client, own_query) -> None:
    client = shared_client
    top_four = compressor(client=client, top_n=4, timeout_s=60)
    retriever = retriever_of(documents(), top_four)
    sync = retriever.invoke(own_query)
    assert [(d.metadata["n"], d.metadata["relevance_score"]) for d in sync] == direct(client, own_query, 4)
    async_ = asyncio.run(retriever.ainvoke(own_query))
    assert [d.metadata["n"] for d in async_] == [d.metadata["n"] for d in sync]
    assert asyncio.run(top_four.acompress_documents([], own_query)) == []

    cut = sorted(d.metadata["relevance_score"] for d in sync)[1]
    strict = compressor(client=client, top_n=4, min_score=cut, timeout_s=60)
    kept = strict.compress_documents(documents(), own_query)
    assert kept and all(d.metadata["relevance_score"] >= cut for d in kept)
    assert [(d.metadata["n"], d.metadata["relevance_score"]) for d in kept] == direct(
        client, own_query, 4, min_score=cut
    )


def test_long_documents_passages_scores_a_long_document_by_its_passages(shared_client, own_query) -> None:
    from langchain_core.documents import Document

    client = shared_client
    long_text = " ".join(["filler words about nothing in particular"] * 60) + " payment gateway 502 recovery steps"
    docs = [Document(page_content=long_text, metadata={"n": 0}), Document(page_content=TEXTS[0], metadata={"n": 1})]
    by_passages = compressor(client=client, top_n=2, long_documents="passages", timeout_s=60)
    top = by_passages.compress_documents(docs, own_query)
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
