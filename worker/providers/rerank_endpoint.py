"""What the providers of a remote rerank API (Cohere's, vLLM's, a generic endpoint) share.

Each POSTs a window's query and documents to one endpoint and reads the answer's shape its
own way; the rest is alike and lives here: the member's scale (``probability`` unless
declared), whether its answers may be subsets (``top_n``), its cache identity (the endpoint,
model, ``top_n`` and scale, plus what the provider adds), the HTTP client, the Cohere-like
request body, and the answer read as a JSON object.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kernel.settings import MemberSettings
from worker.providers.base import Remedy, Scale, ScoreRequest, UnusableResponse, cache_identity
from worker.providers.remote import RemoteClient, expected_subset


class RerankEndpoint:
    """The base of a remote rerank provider: a subclass sets ``kind`` and says what it sends
    (``payload``) and how it reads the answer (``read``)."""

    kind: str
    remote = True

    def __init__(self, member: MemberSettings, url: str, /, *, not_found: Remedy, **identity: object) -> None:
        """``url``: the endpoint POSTed to; ``identity``: what else changes this provider's answer,
        for its ``cache_identity``."""
        self.endpoint = url
        self.member = member
        self.scale: Scale | None = member.scale or "probability"
        self.answers_subsets = member.top_n is not None
        self.cache_identity = cache_identity(
            self.kind, url=url, model=member.model, top_n=member.top_n, scale=self.scale, **identity
        )
        self.client = RemoteClient(member, not_found=not_found)

    def rerank_body(self, query: str, documents: Sequence[str]) -> dict[str, Any]:
        """``query``, ``documents`` and, where the member sets them, ``model`` and ``top_n``."""
        body: dict[str, Any] = {"query": query, "documents": list(documents)}
        if self.member.model:
            body["model"] = self.member.model
        top_n = expected_subset(self.member, len(documents))
        if top_n is not None:
            body["top_n"] = top_n
        return body

    def payload(self, request: ScoreRequest) -> dict[str, Any]:
        """The request body for a window of one or more documents."""
        raise NotImplementedError

    def read(self, answer: Any, n_documents: int) -> list[float | None]:
        """The endpoint's parsed answer as one score a document (None for one a subset left out)."""
        raise NotImplementedError

    def score(self, request: ScoreRequest, *, deadline: float) -> list[float | None]:
        n = len(request.documents)
        if n == 0:
            return []
        body = self.payload(request)
        return self.read(self.client.post_json(self.endpoint, body, self.client.headers(request), deadline=deadline), n)

    def close(self) -> None:
        self.client.close()


def answer_object(answer: Any) -> dict[str, Any]:
    """An answer that must be a JSON object (UnusableResponse otherwise)."""
    if not isinstance(answer, dict):
        raise UnusableResponse("bad_shape", f"expected an object, got {type(answer).__name__}")
    return answer
