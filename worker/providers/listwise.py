"""Listwise reranking by a chat model: RankZephyr's prompt over any OpenAI-compatible
``POST {url}/v1/chat/completions`` (vLLM, llama.cpp's server, hosted APIs).

A prompt shows the model up to ``PASSAGES_PER_PROMPT`` passages numbered ``[1]..[m]`` and asks
for their ids in descending relevance (``[2] > [1] > ...``). The window's list is ranked by
prompts from its bottom to its top, ``PROMPT_STEP`` apart, each overlapping the next, so the
best passage of the bottom prompt can rise to the top (RankGPT's sliding windows; the spans
and the repair of a malformed answer are ``worker.providers.permutation``'s). Each prompt
depends on the order the one before it left, so they are sent one after another, all within
the member's ``TIMEOUT_S``.

The prompt is rank_llm's ``rank_zephyr_template`` (a system message and one user message),
with the stream's instruction, when it has one, as a line after the opening. Passages are cut
to ``WORDS_PER_PASSAGE`` words with their whitespace collapsed (as rank_llm cuts them, 300 at
20 a prompt), and a ``[n]`` in a passage, the query or the instruction is written ``(n)``, as
rank_llm writes it, so no text can pass for an id. The server's chat template reads the text,
so control strings are broken first (``worker.control_strings``). The answer is asked for with
``temperature`` 0 and ``max_tokens`` enough for every id of the prompt.

An answer naming no usable id keeps that prompt's order; the window is still served, the
repair is logged and counted (``rerankq_provider_answers_repaired_total``). A request that
yields nothing at all (HTTP errors, timeouts, a body that is not a chat completion, or not one
usable id in any of its prompts) is a ProviderError, and the chain fails over.

Scores: the document's place in the final order (0 first), declared ``rank``: not relevance,
seeded onto [0.1, 1.0] by scoring (``worker.scoring.decide.rank_scores``). The answer depends
on the whole window (``answers_subsets``), so the pair cache keeps it per window.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from kernel.settings import MemberSettings, Settings
from worker.control_strings import REMOTE, RULE
from worker.providers.base import (
    MemberConfigError,
    Remedy,
    Scale,
    ScoreRequest,
    UnusableResponse,
    announce_repair,
    cache_identity,
)
from worker.providers.permutation import Repaired, identifiers, prompt_spans, repair
from worker.providers.remote import RemoteClient, check_base_url, check_member_numbers, public_url

log = structlog.get_logger("rerankq.provider.listwise")

CHAT_PATH = "/chat/completions"
#: Named in the cache identity: a change of the words below is another answer.
PROMPT = "rank_zephyr-1"
SYSTEM = "You are RankLLM, an intelligent assistant that can rank passages based on their relevancy to the query"
PREFIX = (
    "I will provide you with {num} passages, each indicated by a numerical identifier []. "
    "Rank the passages based on their relevance to the search query: {query}.\n"
)
INSTRUCTION = "Judge relevance by this instruction: {instruction}\n"
PASSAGE = "[{rank}] {passage}\n"
SUFFIX = (
    "Search Query: {query}.\n"
    "Rank the {num} passages above based on their relevance to the search query. All the passages should be "
    "included and listed using identifiers, in descending order of relevance. The output format should be "
    "[] > [], e.g., [2] > [1], Answer concisely and directly and only respond with the ranking results, "
    "do not say any word or explain."
)
#: Tokens the answer may take per passage: "[12] > " is 3 to 5 in the tokenizers of the
#: models served for this (rank_llm counts them with the model's own), with room to spare.
ANSWER_TOKENS_PER_PASSAGE = 8
ANSWER_TOKENS_EXTRA = 16
_ID_IN_TEXT = re.compile(r"\[\s*(\d+)\s*\]")
#: Member settings this provider has no use for: set, they are refused rather than ignored.
_NOT_FOR_LISTWISE = {
    "top_n": "a listwise member ranks every passage; there is no subset to ask for",
    "scale": "a listwise member's scores are ranks (declared rank); leave it unset",
    "instruction_field": "the stream's instruction goes into the prompt; leave it unset",
    "max_tokens_per_doc": "passages are cut by the member's WORDS_PER_PASSAGE",
    "truncate_prompt_tokens": "passages are cut by the member's WORDS_PER_PASSAGE",
}


def chat_url(base: str) -> str:
    """``{base}/v1/chat/completions``; a base already ending in ``/v1`` or in the path itself as given."""
    if base.endswith(CHAT_PATH):
        return base
    if base.endswith("/v1"):
        return base + CHAT_PATH
    return base + "/v1" + CHAT_PATH


def as_text(text: str) -> str:
    """Text the server's template reads as text, with no ``[n]`` that could pass for an id."""
    return _ID_IN_TEXT.sub(r"(\1)", REMOTE.neutralise(text))


def cut_passage(document: str, words: int) -> str:
    """The first ``words`` words of a document, whitespace collapsed: one line of the prompt."""
    return as_text(" ".join(document.split()[:words]))


def messages(query: str, passages: Sequence[str], instruction: str | None) -> list[dict[str, str]]:
    """The chat messages of one prompt over ``passages`` (already cut), numbered from 1."""
    num, shown = len(passages), as_text(query)
    user = PREFIX.format(num=num, query=shown)
    if instruction is not None:
        user += INSTRUCTION.format(instruction=as_text(instruction))
    user += "".join(PASSAGE.format(rank=rank, passage=p) for rank, p in enumerate(passages, start=1))
    user += SUFFIX.format(num=num, query=shown)
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def answer_text(answer: Any) -> str:
    """``choices[0].message.content`` of a chat completion; "" for a message without content
    (a refusal); UnusableResponse when the body is no chat completion."""
    if not isinstance(answer, dict):
        raise UnusableResponse("bad_shape", f"expected a chat completion object, got {type(answer).__name__}")
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices:
        raise UnusableResponse("no_choices", "the chat completion holds no choices")
    first = choices[0]
    message = first.get("message") if isinstance(first, dict) else None
    if not isinstance(message, dict):
        raise UnusableResponse("bad_shape", "choices[0] has no message object")
    content = message.get("content")
    if content is None:
        return ""
    if not isinstance(content, str):
        raise UnusableResponse("bad_shape", f"choices[0].message.content is {type(content).__name__}, not text")
    return content


@dataclass
class Tally:
    """What one window's prompts came back with, for the log line and the counters."""

    prompts: int = 0
    usable: int = 0
    repairs: dict[str, int] = field(default_factory=dict)

    def add(self, repaired: Repaired) -> None:
        self.prompts += 1
        self.usable += repaired.usable
        for name in repaired.repairs:
            self.repairs[name] = self.repairs.get(name, 0) + 1
            announce_repair(name)


class ListwiseProvider:
    kind = "listwise"
    remote = True
    accepts_instruction = True
    scale: Scale | None = "rank"
    # The answer ranks the window's documents against each other: the cache keeps it per window.
    answers_subsets = True

    @staticmethod
    def check_config(member: MemberSettings) -> str:
        """The chat-completions URL; MemberConfigError naming the field for what can be wrong
        before anything is called."""
        base = check_base_url(member.url)
        assert base is not None
        for name, why in _NOT_FOR_LISTWISE.items():
            if getattr(member, name) is not None:
                raise MemberConfigError(name, why)
        if member.passages_per_prompt < 2:
            raise MemberConfigError("passages_per_prompt", f"must be at least 2, got {member.passages_per_prompt}")
        if member.prompt_step >= member.passages_per_prompt:
            raise MemberConfigError(
                "prompt_step",
                f"must be less than PASSAGES_PER_PROMPT ({member.passages_per_prompt}) so prompts overlap"
                f" and the best can rise to the top; got {member.prompt_step}",
            )
        check_member_numbers(member)
        return chat_url(base)

    def __init__(self, member: MemberSettings, settings: Settings) -> None:
        self.endpoint = self.check_config(member)
        self.member = member
        self.size = member.passages_per_prompt
        self.step = member.prompt_step
        self.words = member.words_per_passage
        self.cache_identity = cache_identity(
            self.kind,
            url=self.endpoint,
            model=member.model,
            scale=self.scale,
            prompt=PROMPT,
            passages_per_prompt=self.size,
            prompt_step=self.step,
            words_per_passage=self.words,
            control_strings=RULE,
        )
        self.client = RemoteClient(
            member,
            not_found=Remedy(
                "url",
                f"check {{variable}}: the member POSTs to {public_url(self.endpoint)}, the base URL"
                " plus /v1/chat/completions (a URL ending in /v1 or /chat/completions is used as it is)",
            ),
        )

    def body(self, chat: list[dict[str, str]], passages: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "messages": chat,
            "temperature": 0,
            "max_tokens": ANSWER_TOKENS_PER_PASSAGE * passages + ANSWER_TOKENS_EXTRA,
            "stream": False,
        }
        if self.member.model:
            body["model"] = self.member.model
        return body

    def score(self, request: ScoreRequest, *, deadline: float) -> list[float | None]:
        n = len(request.documents)
        passages = [cut_passage(d, self.words) for d in request.documents]
        headers = self.client.headers(request)
        order = list(range(n))
        tally = Tally()
        for start, end in prompt_spans(n, self.size, self.step):
            shown = order[start:end]
            chat = messages(request.query, [passages[i] for i in shown], request.instruction)
            answer = self.client.post_json(self.endpoint, self.body(chat, len(shown)), headers, deadline=deadline)
            repaired = repair(identifiers(answer_text(answer)), len(shown))
            tally.add(repaired)
            order[start:end] = [shown[p] for p in repaired.order]
        if tally.prompts and not tally.usable:
            raise UnusableResponse("no_permutation", f"none of the {tally.prompts} answers named a passage")
        if tally.repairs:
            # Counts only: an answer is the model's text, which may quote the documents.
            kept = tally.repairs.get("no_identifiers", 0)
            (log.warning if kept else log.info)(
                "listwise_answers_repaired",
                stream=request.stream_id,
                window=request.window,
                prompts=tally.prompts,
                prompts_kept_order=kept,
                repairs=tally.repairs,
            )
        scores: list[float | None] = [0.0] * n
        for place, i in enumerate(order):
            scores[i] = float(place)
        return scores

    def close(self) -> None:
        self.client.close()
