"""The LlamaIndex postprocessor against real llama-index-core, a real worker scoring with the
tiny cross-encoder, and Redis.

The framework is imported in the tests, not at the module's top: every test process collects
every module, and importing llama-index there cost each process more than a second."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest
from integration_job import KB_TEXTS, direct_rows, provider_calls, run_example

if TYPE_CHECKING:
    from llama_index.core.schema import NodeWithScore

TEXTS = [*KB_TEXTS, ""]  # an empty node, as RAG pipelines pass them along: scored last, not refused


@pytest.fixture(scope="module", autouse=True)
def llamaindex_installed() -> None:
    pytest.importorskip("llama_index.core", reason="llama-index-core is in the dev extra")


def nodes() -> list[NodeWithScore]:
    from llama_index.core.schema import NodeWithScore, TextNode

    # The empty node carries no metadata either: llama-index's content for reranking includes
    # the metadata, so with a source it would not be empty.
    return [
        NodeWithScore(
            node=TextNode(text=text, id_=f"node-{i}", metadata={"source": f"kb/{i}"} if text else {}), score=0.5
        )
        for i, text in enumerate(TEXTS)
    ]


def direct(client, query: str, given: list[NodeWithScore], top_n: int, **options) -> list[tuple[str, float]]:
    """The same job through RerankClient itself: the nodes' content as llama-index's rerankers read it."""
    from llama_index.core.schema import MetadataMode

    texts = [n.node.get_content(metadata_mode=MetadataMode.EMBED) for n in given]
    return [(given[row.index].node.node_id, row.score) for row in direct_rows(client, query, texts, top_n, **options)]


def test_the_postprocessor_equals_rerankclient_sync_async_and_deeper_costs_nothing(shared_client, own_query) -> None:
    from producer.integrations.llamaindex import RerankqRerank

    client = shared_client
    given = nodes()
    top = RerankqRerank(client=client, top_n=2, instruction="find runbooks", timeout_s=60).postprocess_nodes(
        given, query_str=own_query
    )
    assert [(n.node.node_id, n.score) for n in top] == direct(client, own_query, given, 2, instruction="find runbooks")
    assert all(n.node.metadata["source"] == f"kb/{n.node.node_id.split('-')[1]}" for n in top)

    calls = provider_calls(client)
    deeper = RerankqRerank(client=client, top_n=6, instruction="find runbooks", timeout_s=60)
    six = asyncio.run(deeper.apostprocess_nodes(given, query_str=own_query))
    assert provider_calls(client) == calls  # the committed window is read, not scored again
    assert [(n.node.node_id, n.score) for n in six] == direct(client, own_query, given, 6, instruction="find runbooks")
    assert six[-1].node.node_id == "node-5"  # the empty node, last


@pytest.mark.slow  # a subprocess importing the framework, beside a worker: make test runs it
def test_the_example_runs(start_worker, base_env) -> None:
    start_worker()
    printed = run_example("llamaindex_postprocessor.py", base_env)
    lines = printed.splitlines()
    assert len(lines) == 2 and all("kb/" in line for line in lines)
