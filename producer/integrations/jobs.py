"""What every framework integration does with the queue: one stream per (query, documents,
options), and the top rows of it.

A stream's idempotency key is derived from its query, texts and options (never from ``top_n``),
so asking again, or asking deeper, finds the same stream: committed windows are read, not
scored again, and only windows past them are sent (``RerankClient.pull`` admits them).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from kernel.errors import NotScoredInTime
from kernel.wire import Ranked
from producer.client import RerankClient

#: The metadata key each integration writes a document's score under (LangChain's and
#: llama-index's Cohere rerankers use ``relevance_score`` too).
SCORE_KEY = "relevance_score"
#: The metadata key naming the stream, for a deeper ``RerankClient.pull`` of the same job.
STREAM_KEY = "rerankq_stream_id"


@dataclass(frozen=True)
class QueueRerank:
    """How a framework's reranker asks the queue: the client, how many rows, the stream options."""

    client: RerankClient
    top_n: int = 3
    options: Mapping[str, Any] = field(default_factory=dict)
    timeout_s: float = 30.0

    def stream(self, query: str, texts: Sequence[str]) -> str:
        """Open (or find) the stream of ``texts`` for ``query``."""
        candidates = [{"id": f"d{i}", "text": text} for i, text in enumerate(texts)]
        options = {k: v for k, v in self.options.items() if v is not None}
        key = idempotency_key(query, texts, options)
        return self.client.open(query, candidates, idempotency_key=key, **options)

    def top(self, query: str, texts: Sequence[str], top_n: int | None = None) -> tuple[str, list[Ranked]]:
        """The stream's id and its best ``top_n`` ranked rows (filtered ones left out)."""
        if not texts:
            return "", []
        stream_id = self.stream(query, texts)
        return stream_id, self.ranked(stream_id, top_n or self.top_n)

    def ranked(self, stream_id: str, limit: int) -> list[Ranked]:
        """The stream's first ``limit`` ranked rows, waiting up to ``timeout_s`` for them; raises
        ``NotScoredInTime`` when they are not there by then (an empty or partial answer would
        pass for the reranker's verdict)."""
        page = self.client.pull(stream_id, 0, limit, timeout=self.timeout_s, raise_on_failed=True)
        if len(page.rows) < limit and not page.complete:
            raise NotScoredInTime(stream_id, self.timeout_s, page.pending_windows)
        return [row.decision for row in page.rows if isinstance(row.decision, Ranked)]

    async def atop(self, query: str, texts: Sequence[str], top_n: int | None = None) -> tuple[str, list[Ranked]]:
        # RerankClient blocks (redis-py), so an event loop hands it to a thread.
        return await asyncio.to_thread(self.top, query, texts, top_n)


def idempotency_key(query: str, texts: Sequence[str], options: Mapping[str, Any]) -> str:
    digest = hashlib.blake2b(msgspec.json.encode([query, list(texts), dict(sorted(options.items()))]), digest_size=20)
    return "int-" + digest.hexdigest()
