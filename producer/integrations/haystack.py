"""A Haystack ranker that reranks through the queue (``pip install 'rerankq[haystack]'``).

``RerankqRanker`` is a ``@component`` with ``run`` and ``run_async``: ``query`` and
``documents`` in, ``documents`` out, best first, each a copy of the one given with the queue's
score as its ``score``, as Haystack's own rankers answer. Each call is one stream
(``producer.integrations.jobs``) of the documents' ``content`` (``None`` is an empty text,
scored last); the same documents asked again, or deeper (a larger ``top_k``), find the same
stream, so its committed windows cost no provider call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from haystack import Document, component

from kernel.wire import Ranked
from producer.client import RerankClient
from producer.integrations.jobs import QueueRerank


@component
class RerankqRanker:
    """Rerank Haystack documents on the queue; keep the best ``top_k``.

    ``instruction``, ``long_documents``, ``min_score`` and ``device`` are the stream options of
    those names; ``options`` takes any other ``RerankClient.open`` keyword."""

    def __init__(
        self,
        client: RerankClient,
        top_k: int = 10,
        *,
        instruction: str | None = None,
        long_documents: str | None = None,
        min_score: float | None = None,
        device: str | None = None,
        options: Mapping[str, Any] | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        stream_options = {
            "instruction": instruction,
            "long_documents": long_documents,
            "min_score": min_score,
            "device": device,
            **(options or {}),
        }
        self.queue = QueueRerank(client, top_k, stream_options, timeout_s)

    @component.output_types(documents=list[Document])
    def run(self, query: str, documents: list[Document], top_k: int | None = None) -> dict[str, list[Document]]:
        _, rows = self.queue.top(query, [d.content or "" for d in documents], top_k)
        return {"documents": _ranked(documents, rows)}

    @component.output_types(documents=list[Document])
    async def run_async(
        self, query: str, documents: list[Document], top_k: int | None = None
    ) -> dict[str, list[Document]]:
        _, rows = await self.queue.atop(query, [d.content or "" for d in documents], top_k)
        return {"documents": _ranked(documents, rows)}


def _ranked(documents: list[Document], rows: list[Ranked]) -> list[Document]:
    return [dataclasses.replace(documents[row.index], score=row.score) for row in rows]
