"""The fields LangChain's and LlamaIndex's rerankers share, for their pydantic models.

Both frameworks' reranker bases are pydantic models, so the stream options are declared once
here and each integration mixes them in; ``queue()`` turns them into the ``QueueRerank`` that
does the work.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from kernel.wire import Device, LongDocuments
from producer.client import RerankClient
from producer.integrations.jobs import QueueRerank


class QueueFields(BaseModel):
    """``instruction``, ``long_documents``, ``min_score`` and ``device`` are the stream options of
    those names; ``options`` takes any other ``RerankClient.open`` keyword (``chain``, ``lane``,
    ``window_size``, ...)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: RerankClient
    top_n: int = 3
    instruction: str | None = None
    long_documents: LongDocuments | None = None
    min_score: float | None = None
    device: Device | None = None
    options: dict[str, Any] = {}
    timeout_s: float = 30.0

    def queue(self) -> QueueRerank:
        options = {
            "instruction": self.instruction,
            "long_documents": self.long_documents,
            "min_score": self.min_score,
            "device": self.device,
            **self.options,
        }
        return QueueRerank(self.client, self.top_n, options, self.timeout_s)
