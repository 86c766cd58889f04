"""The LlamaIndex postprocessor against real llama-index-core, a real worker scoring with the
tiny cross-encoder, and Redis."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("llama_index.core", reason="llama-index-core is in the dev extra")

from integration_job import KB_TEXTS, QUERY, direct_rows, provider_calls, run_example  # noqa: E402
from llama_index.core.schema import MetadataMode, NodeWithScore, TextNode  # noqa: E402

from producer.integrations.llamaindex import RerankqRerank  # noqa: E402

TEXTS = [*KB_TEXTS, ""]  # an empty node, as RAG pipelines pass them along: scored last, not refused


def nodes() -> list[NodeWithScore]:
    return [
        NodeWithScore(node=TextNode(text=text, id_=f"node-{i}", metadata={"source": f"kb/{i}"}), score=0.5)
        for i, text in enumerate(TEXTS)
    ]


def direct(client, given: list[NodeWithScore], top_n: int, **options) -> list[tuple[str, float]]:
    """The same job through RerankClient itself: the nodes' content as llama-index's rerankers read it."""
    texts = [n.node.get_content(metadata_mode=MetadataMode.EMBED) for n in given]
    return [(given[row.index].node.node_id, row.score) for row in direct_rows(client, QUERY, texts, top_n, **options)]


def test_the_postprocessor_equals_rerankclient_sync_async_and_deeper_costs_nothing(start_worker, make_client) -> None:
    start_worker()
    client = make_client()
    given = nodes()
    top = RerankqRerank(client=client, top_n=2, instruction="find runbooks", timeout_s=60).postprocess_nodes(
        given, query_str=QUERY
    )
    assert [(n.node.node_id, n.score) for n in top] == direct(client, given, 2, instruction="find runbooks")
    assert all(n.node.metadata["source"] == f"kb/{n.node.node_id.split('-')[1]}" for n in top)

    calls = provider_calls(client)
    deeper = RerankqRerank(client=client, top_n=6, instruction="find runbooks", timeout_s=60)
    six = asyncio.run(deeper.apostprocess_nodes(given, query_str=QUERY))
    assert provider_calls(client) == calls  # the committed window is read, not scored again
    assert [(n.node.node_id, n.score) for n in six] == direct(client, given, 6, instruction="find runbooks")
    assert six[-1].node.node_id == "node-5"  # the empty node, last


@pytest.mark.slow  # a subprocess importing the framework, beside a worker: make test runs it
def test_the_example_runs(start_worker, base_env) -> None:
    start_worker()
    printed = run_example("llamaindex_postprocessor.py", base_env)
    lines = printed.splitlines()
    assert len(lines) == 2 and all("kb/" in line for line in lines)
