"""A LangChain document compressor that reranks through the queue (``pip install 'rerankq[langchain]'``).

``RerankqCompressor`` is a ``BaseDocumentCompressor``, so it goes wherever LangChain takes one,
``ContextualCompressionRetriever`` first. Each call is one stream (``producer.integrations.jobs``);
each document comes back as given (``id``, ``page_content``, every metadata key), with the
row's score under ``relevance_score`` (as langchain-cohere's ``CohereRerank`` writes it) and the
stream under ``rerankq_stream_id``. The same documents asked again, or deeper (a larger
``top_n``), find the same stream, so its committed windows cost no provider call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from pydantic import ConfigDict

from kernel.wire import Ranked
from producer.client import RerankClient
from producer.integrations.jobs import SCORE_KEY, STREAM_KEY, QueueRerank


class RerankqCompressor(BaseDocumentCompressor):
    """Rerank LangChain documents on the queue; keep the best ``top_n``.

    ``instruction``, ``long_documents`` (``"excerpt"`` or ``"passages"``), ``min_score``
    and ``device`` are the stream options of those names; ``options`` takes any other
    (``RerankClient.open``'s keywords: ``chain``, ``lane``, ``window_size``, ...)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: RerankClient
    top_n: int = 3
    instruction: str | None = None
    long_documents: Literal["excerpt", "passages"] | None = None
    min_score: float | None = None
    device: Literal["cpu", "gpu", "any"] | None = None
    options: dict[str, Any] = {}
    timeout_s: float = 30.0

    def _queue(self) -> QueueRerank:
        options = {
            "instruction": self.instruction,
            "long_documents": self.long_documents,
            "min_score": self.min_score,
            "device": self.device,
            **self.options,
        }
        return QueueRerank(self.client, self.top_n, options, self.timeout_s)

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        stream_id, rows = self._queue().top(query, [d.page_content for d in documents])
        return _ranked(documents, stream_id, rows)

    async def acompress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        stream_id, rows = await self._queue().atop(query, [d.page_content for d in documents])
        return _ranked(documents, stream_id, rows)


def _ranked(documents: Sequence[Document], stream_id: str, rows: list[Ranked]) -> list[Document]:
    out = []
    for row in rows:
        given = documents[row.index]
        metadata = {**given.metadata, SCORE_KEY: row.score, STREAM_KEY: stream_id}
        out.append(Document(page_content=given.page_content, metadata=metadata, id=given.id))
    return out
