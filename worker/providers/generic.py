"""A generic rerank endpoint: ``POST {url}`` as configured, any of the common answer shapes.

The request is Cohere-like (``query``, ``documents``, optional ``model`` and ``top_n``).
Accepted answers:

- ``{"results": [{"index", "relevance_score" | "score"}]}`` (Cohere-like)
- ``{"rankings": [{"index", "score"}]}``
- ``{"scores": [s0, s1, ...]}``: one score per document, in input order
- ``[{"index", "score"}]``: a bare array (TEI-like)

The stream's instruction is sent only in the field ``RERANKQ_RERANKER_INSTRUCTION_FIELD``
names (e.g. ``instruction``, or DashScope's ``instruct``); unset, the endpoint takes none.

Its scale is whatever the endpoint emits, so it is declared (``RERANKQ_RERANKER_SCALE``);
it defaults to ``probability``, and the chain rejects probabilities outside [0, 1], so an
endpoint emitting logits fails over loudly instead of ranking on the wrong scale.
"""

from __future__ import annotations

import re
from typing import Any

from kernel.settings import MemberSettings, Settings
from worker.providers.base import MemberConfigError, Remedy, ScoreRequest, UnusableResponse
from worker.providers.remote import (
    check_base_url,
    check_member_numbers,
    check_subset_size,
    expected_subset,
    scores_from_pairs,
    scores_in_order,
)
from worker.providers.rerank_endpoint import RerankEndpoint

_FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
_REQUEST_FIELDS = frozenset({"query", "documents", "model", "top_n"})


def instruction_field(member: MemberSettings) -> str | None:
    field = member.instruction_field or None
    if field is not None and (not _FIELD_NAME.match(field) or field in _REQUEST_FIELDS):
        raise MemberConfigError(
            "instruction_field",
            "must be a JSON field name (letters, digits, _) other than"
            f" {', '.join(sorted(_REQUEST_FIELDS))}; got {field!r}",
        )
    return field


class HttpProvider(RerankEndpoint):
    kind = "http"

    @staticmethod
    def check_config(member: MemberSettings) -> str:
        """The URL; MemberConfigError naming the field for what can be wrong before anything is called."""
        url = check_base_url(member.url)
        assert url is not None
        instruction_field(member)
        check_member_numbers(member)
        return url

    def __init__(self, member: MemberSettings, settings: Settings) -> None:
        endpoint = self.check_config(member)
        field = instruction_field(member)
        self.instruction_field = field
        self.accepts_instruction = field is not None
        # Named only when set, so the identity of a member without one is what it always was.
        sends = {"instruction_field": field} if field else {}
        super().__init__(
            member,
            endpoint,
            not_found=Remedy(
                "url", "check {variable}: it is POSTed to as given, so it must be the full URL of the rerank endpoint"
            ),
            **sends,
        )

    def payload(self, request: ScoreRequest) -> dict[str, Any]:
        body = self.rerank_body(request.query, request.documents)
        if self.instruction_field is not None and request.instruction is not None:
            body[self.instruction_field] = request.instruction
        return body

    def read(self, answer: Any, n_documents: int) -> list[float | None]:
        scores = read_answer(answer, n_documents)
        check_subset_size(scores, n_documents, expected_subset(self.member, n_documents))
        return scores


def read_answer(answer: Any, n_documents: int) -> list[float | None]:
    if isinstance(answer, list):
        return scores_from_pairs(answer, n_documents, score_field="score")
    if not isinstance(answer, dict):
        raise UnusableResponse("bad_shape", f"expected an object or array, got {type(answer).__name__}")
    if "scores" in answer:
        return scores_in_order(answer["scores"], n_documents)
    if "rankings" in answer:
        return scores_from_pairs(answer["rankings"], n_documents, score_field="score")
    if "results" in answer:
        return scores_from_pairs(answer["results"], n_documents, score_field=("relevance_score", "score"))
    # Keys are named only when they look like field names: an answer's keys are the server's text.
    keys = ", ".join(k if _FIELD_NAME.match(k) else "?" for k in sorted(map(str, answer))[:5])
    raise UnusableResponse("bad_shape", f"no results, rankings or scores in the answer (keys: {keys})")
