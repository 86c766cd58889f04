"""vLLM's rerank and score APIs, as its protocol (``vllm.entrypoints.pooling.scoring``) defines them.

``endpoint=rerank`` (the default): ``POST {url}/rerank`` with ``query``, ``documents`` and,
when set, ``top_n``, answered ``{"id", "model", "usage", "results": [{"index", "document",
"relevance_score"}]}`` in score order (a ``top_n`` answer holds that many results).
``endpoint=score``: ``POST {url}/score`` with ``text_1`` (the query) against ``text_2`` (the
documents), answered ``{"id", "object": "list", "created", "model", "data": [{"index", "object":
"score", "score"}], "usage"}``. Those are vLLM's own paths (its ``/v1/score`` logs on every call
that the API has moved to ``/score``). A URL already ending in ``/rerank`` or ``/score`` is
used as it is; one ending in ``/v1`` (an OpenAI-style base URL) gets the endpoint's name added.

Both take the same options, each sent only when the member sets it: ``model``,
``truncate_prompt_tokens`` (vLLM cuts the whole pair to that many tokens, -1 for the model's
limit; unset, an over-long pair is refused with a 400), ``max_tokens_per_doc`` (the document
alone is cut), ``use_activation: false`` for a member declared ``logit``, and ``instruction``:
the stream's instruction, which vLLM folds into ``chat_template_kwargs`` for the score template
of an instruction-aware reranker (Qwen3-Reranker's ``<Instruct>``). vLLM accepts a field it does
not know and ignores it (its own log says so, at DEBUG in recent versions), so a server older
than a field, or a model served without a template that reads the instruction, would drop it
silently: such a member is configured with ``INSTRUCTION_FIELD=`` (empty) and then says it
ignores instructions.

Scale: vLLM's pooler applies the model's own activation unless asked not to, so the number is
what ``CrossEncoder.predict`` returns: the sigmoid of a one-logit cross-encoder (bge-reranker,
ms-marco), and for Qwen3-Reranker loaded as a classifier from its "yes"/"no" tokens the sigmoid
of their difference, P(yes). Those are probabilities; a server that answers outside [0, 1] is
refused by the chain's checks rather than ranked on the wrong scale.
"""

from __future__ import annotations

from typing import Any

from kernel.settings import MemberSettings, Settings
from worker import control_strings
from worker.providers.base import MemberConfigError, Remedy, ScoreRequest
from worker.providers.remote import (
    check_base_url,
    check_member_numbers,
    check_subset_size,
    expected_subset,
    scores_from_pairs,
)
from worker.providers.rerank_endpoint import RerankEndpoint, answer_object

#: The request field vLLM's protocol gives the instruction (``ScoringRequestMixin.instruction``).
INSTRUCTION_FIELD = "instruction"
_ENDPOINT_NAMES = ("rerank", "score")


def endpoint_url(base: str, endpoint: str) -> str:
    """The URL to POST to: as given when it names an endpoint, else the base plus ``/<endpoint>``."""
    last = base.rsplit("/", 1)[-1]
    if last in _ENDPOINT_NAMES:
        if last != endpoint:
            raise MemberConfigError(
                "url",
                f"ends in /{last} but the member's endpoint is {endpoint}: set the"
                f" member's ENDPOINT={last}, or give the server's base URL",
            )
        return base
    return f"{base}/{endpoint}"


def instruction_field(member: MemberSettings) -> str | None:
    """The field the instruction goes in, or None when this member's server takes none."""
    if member.instruction_field is None:
        return INSTRUCTION_FIELD
    if member.instruction_field == "":
        return None
    if member.instruction_field != INSTRUCTION_FIELD:
        raise MemberConfigError(
            "instruction_field",
            f"vLLM's protocol names it {INSTRUCTION_FIELD!r}; leave it"
            " unset, or set it empty for a server whose model takes no instruction",
        )
    return INSTRUCTION_FIELD


class VllmProvider(RerankEndpoint):
    kind = "vllm"

    @staticmethod
    def check_config(member: MemberSettings) -> str:
        """The endpoint's URL; MemberConfigError naming the field for what can be wrong before anything is called."""
        base = check_base_url(member.url)
        assert base is not None
        endpoint = endpoint_url(base, member.endpoint)
        if member.endpoint == "score" and member.top_n is not None:
            raise MemberConfigError("top_n", "vLLM's score API answers every pair; top_n is for endpoint=rerank")
        if member.truncate_prompt_tokens is not None and not (
            member.truncate_prompt_tokens == -1 or member.truncate_prompt_tokens > 0
        ):
            raise MemberConfigError(
                "truncate_prompt_tokens",
                f"must be positive, or -1 for the model's limit; got {member.truncate_prompt_tokens}",
            )
        instruction_field(member)
        check_member_numbers(member)
        return endpoint

    def __init__(self, member: MemberSettings, settings: Settings) -> None:
        endpoint = self.check_config(member)
        field = instruction_field(member)
        self.endpoint_kind = member.endpoint
        self.instruction_field = field
        self.accepts_instruction = field is not None
        # Declared logit: vLLM is asked for the raw logits and scoring applies the sigmoid.
        self._raw = member.scale == "logit"
        super().__init__(
            member,
            endpoint,
            not_found=Remedy(
                "url",
                "check {variable}: vLLM serves POST /rerank and /score under its base URL"
                " (http://host:8000), for a model it serves as a reranker",
            ),
            endpoint=member.endpoint,
            truncate_prompt_tokens=member.truncate_prompt_tokens,
            max_tokens_per_doc=member.max_tokens_per_doc,
            raw=self._raw,
            instruction_field=field,
            control_strings=control_strings.RULE,
        )

    def payload(self, request: ScoreRequest) -> dict[str, Any]:
        # The server templates the text: its control strings are broken here (``worker.control_strings``).
        text = control_strings.REMOTE.neutralise
        query, documents = text(request.query), control_strings.REMOTE.neutralise_all(request.documents)
        if self.endpoint_kind == "rerank":
            body = self.rerank_body(query, documents)
        else:
            body = {"text_1": query, "text_2": documents}
            if self.member.model:
                body["model"] = self.member.model
        if self.member.truncate_prompt_tokens is not None:
            body["truncate_prompt_tokens"] = self.member.truncate_prompt_tokens
        if self.member.max_tokens_per_doc is not None:
            body["max_tokens_per_doc"] = self.member.max_tokens_per_doc
        if self._raw:
            body["use_activation"] = False
        if self.instruction_field is not None and request.instruction is not None:
            body[self.instruction_field] = text(request.instruction)
        return body

    def read(self, answer: Any, n_documents: int) -> list[float | None]:
        found = answer_object(answer)
        if self.endpoint_kind == "rerank":
            scores = scores_from_pairs(found.get("results"), n_documents, score_field="relevance_score")
            check_subset_size(scores, n_documents, expected_subset(self.member, n_documents))
        else:
            scores = scores_from_pairs(found.get("data"), n_documents, score_field="score")
            check_subset_size(scores, n_documents, None)
        return scores
