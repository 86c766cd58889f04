"""Cohere's rerank API, v1 and v2 shapes, and every gateway that speaks it.

``POST {url}/v1/rerank`` or ``{url}/v2/rerank`` (a URL already ending in ``/rerank`` is used
as it is) with ``model``, ``query``, ``documents``, ``top_n`` and, for v2,
``max_tokens_per_doc``. The answer is ``{"results": [{"index", "relevance_score"}]}`` in
score order; Jina, Infinity (whose ``document`` is a plain string), Azure and self-hosted
gateways answer the same, Voyage under ``"data"``. Infinity serves ``/rerank`` only, so it
takes its full URL (``http://infinity:7997/rerank``); a 404 from a derived endpoint says so.
``document`` is never read: the window's own text is what a reader gets back. Relevance
scores are calibrated. Cohere's API has no instruction: a stream's instruction is not sent, and a
window this member serves records that it was not used.
"""

from __future__ import annotations

from typing import Any

from kernel.settings import MemberSettings, Settings
from worker.providers.base import MemberConfigError, Remedy, ScoreRequest
from worker.providers.remote import (
    check_base_url,
    check_member_numbers,
    check_subset_size,
    expected_subset,
    public_url,
    refuse_instruction_field,
    scores_from_pairs,
)
from worker.providers.rerank_endpoint import RerankEndpoint, answer_object

HOSTED_URL = "https://api.cohere.com"


class CohereProvider(RerankEndpoint):
    kind = "cohere"
    accepts_instruction = False

    @staticmethod
    def check_config(member: MemberSettings) -> str:
        """The base URL; MemberConfigError naming the field for what can be wrong before anything is called."""
        base = check_base_url(member.url, required=False) or HOSTED_URL
        refuse_instruction_field(member, "Cohere's rerank API")
        if base == HOSTED_URL:
            # The hosted API needs both; a self-hosted gateway may need neither.
            if member.api_key is None or not member.api_key.reveal():
                raise MemberConfigError("api_key", "is required for the hosted Cohere API")
            if not member.model:
                raise MemberConfigError("model", "is required for the hosted Cohere API (e.g. rerank-v3.5)")
        check_member_numbers(member)
        return base

    def __init__(self, member: MemberSettings, settings: Settings) -> None:
        base = self.check_config(member)
        if base.endswith("/rerank"):
            endpoint = base
            not_found = Remedy("url", "check {variable}: a URL ending in /rerank is POSTed to as given")
        else:
            endpoint = f"{base}/{member.api_version}/rerank"
            # Infinity and some gateways serve /rerank at the root, not /v2/rerank.
            not_found = Remedy("url", f"if this server serves /rerank, set {{variable}}={public_url(base)}/rerank")
        # The endpoint already holds the API version (or the URL given as is); the version
        # also changes the body (return_documents, max_tokens_per_doc), so it is named too.
        super().__init__(
            member,
            endpoint,
            not_found=not_found,
            api_version=member.api_version,
            max_tokens_per_doc=member.max_tokens_per_doc,
        )

    def payload(self, request: ScoreRequest) -> dict[str, Any]:
        body = self.rerank_body(request.query, request.documents)
        if self.member.api_version == "v1":
            body["return_documents"] = False
        elif self.member.max_tokens_per_doc is not None:
            body["max_tokens_per_doc"] = self.member.max_tokens_per_doc
        return body

    def read(self, answer: Any, n_documents: int) -> list[float | None]:
        found = answer_object(answer)
        scores = scores_from_pairs(found.get("results", found.get("data")), n_documents, score_field="relevance_score")
        check_subset_size(scores, n_documents, expected_subset(self.member, n_documents))
        return scores
