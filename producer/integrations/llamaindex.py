"""A LlamaIndex node postprocessor that reranks through the queue (``pip install 'rerankq[llamaindex]'``).

``RerankqRerank`` is a ``BaseNodePostprocessor`` (``node_postprocessors=[...]`` of a query
engine, or ``postprocess_nodes`` by hand), sync and async. Each call is one stream
(``producer.integrations.jobs``) of the nodes' content as llama-index's own rerankers read it
(``MetadataMode.EMBED``); each node comes back as given, its ``score`` the queue's. The same
nodes asked again, or deeper (a larger ``top_n``), find the same stream, so its committed
windows cost no provider call.
"""

from __future__ import annotations

from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle

from kernel.wire import Ranked
from producer.integrations.queue_fields import QueueFields


class RerankqRerank(QueueFields, BaseNodePostprocessor):
    """Rerank LlamaIndex nodes on the queue; keep the best ``top_n``.

    ``instruction``, ``long_documents``, ``min_score`` and ``device`` are the stream options of
    those names; ``options`` takes any other ``RerankClient.open`` keyword."""

    @classmethod
    def class_name(cls) -> str:
        return "RerankqRerank"

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        query = _query(query_bundle)
        _, rows = self.queue().top(query, _texts(nodes))
        return _ranked(nodes, rows)

    async def _apostprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        query = _query(query_bundle)
        _, rows = await self.queue().atop(query, _texts(nodes))
        return _ranked(nodes, rows)


def _query(query_bundle: QueryBundle | None) -> str:
    if query_bundle is None:
        raise ValueError("RerankqRerank needs the query: pass query_str or query_bundle")
    return query_bundle.query_str


def _texts(nodes: list[NodeWithScore]) -> list[str]:
    return [n.node.get_content(metadata_mode=MetadataMode.EMBED) for n in nodes]


def _ranked(nodes: list[NodeWithScore], rows: list[Ranked]) -> list[NodeWithScore]:
    return [NodeWithScore(node=nodes[row.index].node, score=row.score) for row in rows]
