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

from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document

from kernel.wire import Ranked
from producer.integrations.jobs import SCORE_KEY, STREAM_KEY
from producer.integrations.queue_fields import QueueFields


class RerankqCompressor(QueueFields, BaseDocumentCompressor):
    """Rerank LangChain documents on the queue; keep the best ``top_n``.

    ``instruction``, ``long_documents`` (``"excerpt"`` or ``"passages"``), ``min_score``
    and ``device`` are the stream options of those names; ``options`` takes any other
    (``RerankClient.open``'s keywords: ``chain``, ``lane``, ``window_size``, ...)."""

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        stream_id, rows = self.queue().top(query, [d.page_content for d in documents])
        return _ranked(documents, stream_id, rows)

    async def acompress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        stream_id, rows = await self.queue().atop(query, [d.page_content for d in documents])
        return _ranked(documents, stream_id, rows)


def _ranked(documents: Sequence[Document], stream_id: str, rows: list[Ranked]) -> list[Document]:
    out = []
    for row in rows:
        given = documents[row.index]
        metadata = {**given.metadata, SCORE_KEY: row.score, STREAM_KEY: stream_id}
        out.append(Document(page_content=given.page_content, metadata=metadata, id=given.id))
    return out
