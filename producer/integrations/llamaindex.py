"""A LlamaIndex node postprocessor that reranks through the queue (``pip install 'rerankq[llamaindex]'``).

``RerankqRerank`` is a ``BaseNodePostprocessor`` (``node_postprocessors=[...]`` of a query
engine, or ``postprocess_nodes`` by hand), sync and async. Each call is one stream
(``producer.integrations.jobs``) of the nodes' content as llama-index's own rerankers read it
(``MetadataMode.EMBED``); each node comes back as given, its ``score`` the queue's. The same
nodes asked again, or deeper (a larger ``top_n``), find the same stream, so its committed
windows cost no provider call.
"""

from __future__ import annotations

from typing import Any, Literal

from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle
from pydantic import ConfigDict

from kernel.wire import Ranked
from producer.client import RerankClient
from producer.integrations.jobs import QueueRerank


class RerankqRerank(BaseNodePostprocessor):
    """Rerank LlamaIndex nodes on the queue; keep the best ``top_n``.

    ``instruction``, ``long_documents``, ``min_score`` and ``device`` are the stream options of
    those names; ``options`` takes any other ``RerankClient.open`` keyword."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: RerankClient
    top_n: int = 3
    instruction: str | None = None
    long_documents: Literal["excerpt", "passages"] | None = None
    min_score: float | None = None
    device: Literal["cpu", "gpu", "any"] | None = None
    options: dict[str, Any] = {}
    timeout_s: float = 30.0

    @classmethod
    def class_name(cls) -> str:
        return "RerankqRerank"

    def _queue(self) -> QueueRerank:
        options = {
            "instruction": self.instruction,
            "long_documents": self.long_documents,
            "min_score": self.min_score,
            "device": self.device,
            **self.options,
        }
        return QueueRerank(self.client, self.top_n, options, self.timeout_s)

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        query = _query(query_bundle)
        _, rows = self._queue().top(query, _texts(nodes))
        return _ranked(nodes, rows)

    async def _apostprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        query = _query(query_bundle)
        _, rows = await self._queue().atop(query, _texts(nodes))
        return _ranked(nodes, rows)


def _query(query_bundle: QueryBundle | None) -> str:
    if query_bundle is None:
        raise ValueError("RerankqRerank needs the query: pass query_str or query_bundle")
    return query_bundle.query_str


def _texts(nodes: list[NodeWithScore]) -> list[str]:
    return [n.node.get_content(metadata_mode=MetadataMode.EMBED) for n in nodes]


def _ranked(nodes: list[NodeWithScore], rows: list[Ranked]) -> list[NodeWithScore]:
    return [NodeWithScore(node=nodes[row.index].node, score=row.score) for row in rows]
