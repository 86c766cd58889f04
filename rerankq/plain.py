"""The chain's words for a person: which member served, and why an earlier one did not.

A failover is recorded as ``"<index>:<provider>: <reason>"`` (``0:local: not_started``); the
reasons are the chain's own tokens. These functions say the same in a sentence.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

#: The chain's reason tokens, in words. A token not listed is shown as it is.
REASONS = {
    "not_started": "could not start (its model could not load: no network to fetch it, or a wrong path)",
    "model_load": "could not load its model",
    "start_error": "failed to start",
    "device": "cannot run on this device",
    "backend_refused": "was refused: its backend did not keep the reference ranking",
    "backend_unavailable": "needs a backend that is not installed",
    "timeout": "did not answer in time",
    "connect_error": "could not be reached",
    "breaker_open": "is switched off for a while after failing repeatedly (circuit breaker)",
    "wrong_count": "answered with the wrong number of scores",
    "non_finite": "answered NaN or infinite scores",
    "out_of_scale": "answered scores outside its declared range",
    "flat_scores": "gave every document the same score",
    "bad_shape": "answered in a shape it should not",
    "unparsable": "answered something that does not parse",
    "no_choices": "answered a chat completion without choices",
    "no_permutation": "named no passage in any of its answers",
    "not_a_ranking": "answered places that are not a ranking",
    "unknown_profile": "is not in the chain profile asked for",
}

PROVIDERS = {
    "local": "the cross-encoder in process",
    "embedding": "the packaged bi-encoder (all-MiniLM-L6-v2, cosine similarity)",
    "rrf": "no model: the fusion order kept",
    "tei": "a TEI server",
    "cohere": "a Cohere-compatible API",
    "http": "an HTTP reranker",
    "vllm": "a vLLM server",
    "listwise": "a chat model ranking passages listwise",
}


def member_words(label: str) -> str:
    """``1:embedding`` -> ``member 1, the packaged bi-encoder (...)``."""
    index, _, provider = label.partition(":")
    what = PROVIDERS.get(provider, provider)
    return f"member {index}, {provider} ({what})" if index.isdigit() else label


def reason_words(reason: str) -> str:
    token = reason.split(None, 1)[0].rstrip(":,;") if reason else reason
    if token.startswith("http_") and token[5:].isdigit():
        return f"answered HTTP {token[5:]}"
    return REASONS.get(token, reason)


def failover_words(failover: str) -> str:
    """``0:local: not_started`` -> ``member 0, local (...): it could not start (...)``."""
    label, _, reason = failover.partition(": ")
    return f"{member_words(label)}: it {reason_words(reason.strip())}"


def expected_offline(served: Iterable[str], failovers: Iterable[str]) -> bool:
    """The default chain on a host that cannot fetch the cross-encoder: member 0 never started and the
    packaged bi-encoder served. Expected offline; not a fault."""
    return any(s.endswith(":embedding") for s in served) and any(
        f.split(": ", 1)[0].endswith(":local") and "not_started" in f for f in failovers
    )


def served_summary(served: Counter[str], failovers: Counter[str], *, sampled: bool = False) -> list[str]:
    """Lines saying who served how many windows and why the earlier members did not.
    ``sampled``: the failovers were read from a few jobs only, so they are reasons, not counts."""
    lines = []
    for label, n in served.most_common():
        lines.append(f"{n} window(s) served by {member_words(label)}")
    for failover, n in failovers.most_common(5):
        lines.append(
            f"why: {failover_words(failover)}" if sampled else f"{n} window(s) passed over {failover_words(failover)}"
        )
    if expected_offline(served, failovers):
        lines.append(
            "This is the expected fall-through on a machine without network: the cross-encoder cannot be "
            "downloaded, so the packaged bi-encoder scored instead (a real model, a little weaker). "
            "Set RERANKQ_RERANKER_MODEL to a cross-encoder on disk to use one."
        )
    return lines
