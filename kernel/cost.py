"""What a window costs, estimated at open from what it will send: the unit a tenant's share of a
device queue is counted in (``kernel.fair_share``), and what keeps a window inside the task's
time limit.

A window's cost is the tokens it sends, bounded from code points: each pair is the query and
its document as the worker assembles it, cut to the document budget (a passages stream: each
passage's text at its bound and the document's header as clipped, ``kernel.passage_budget``, as
many passages as the text can have). A token covers
at least one code point in WordPiece, SentencePiece and word tokenizers, so this is an upper
bound there and an estimate for byte-level ones. A candidate without text is never sent: it
costs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from kernel.errors import ValidationError
from kernel.passage_budget import header_chars, passage_count, text_tokens
from kernel.settings import Settings
from kernel.wire import Candidate, StreamSpec

#: The part of a window's lease its work may take (the rest is the commit's and the waits').
WORK_SHARE_OF_LEASE = 0.9
#: What the header adds to a document at most, besides its context and heading path: the date
#: prefix and the separators.
_HEADER_EXTRA = 48


def candidate_cost(spec: StreamSpec, candidate: Candidate) -> int:
    text = candidate.text or ""
    if not text.strip():
        return 0
    query = len(spec.query)
    head = len(candidate.context or "") + sum(len(h) + 3 for h in candidate.heading_path) + _HEADER_EXTRA
    if spec.long_documents == "passages":
        # Each passage: its text and the header, clipped to the passage's tokens and to half the
        # document budget (kernel.passage_budget); a header is never longer than it is.
        tokens = text_tokens(spec)
        per_passage = query + tokens + min(head, tokens, header_chars(spec))
        return passage_count(spec, len(text)) * per_passage
    return query + min(spec.document_budget, head + len(text))


def candidate_pairs(spec: StreamSpec, candidate: Candidate) -> int:
    """The pairs a candidate is sent as at most: its passages in a passages stream, else one (none
    without text). What a cascade stage's ``max_pairs`` counts."""
    text = candidate.text or ""
    if not text.strip():
        return 0
    return passage_count(spec, len(text)) if spec.long_documents == "passages" else 1


def window_costs(spec: StreamSpec, candidates: Sequence[Candidate]) -> list[int]:
    """Each window's cost, in window order."""
    size = spec.window_size
    return [sum(candidate_cost(spec, c) for c in candidates[i : i + size]) for i in range(0, len(candidates), size)]


def most_window_cost(settings: Settings) -> int:
    """The cost one worker process scores within a window's time limit, at the declared rate."""
    return int(settings.fairness.scoring_tokens_per_s * settings.queues.redeliver_after_s * WORK_SHARE_OF_LEASE)


def check_window_costs(spec: StreamSpec, costs: Sequence[int], settings: Settings) -> None:
    """Refuse, naming the field to lower, a stream with a window that could outlive the task's
    time limit (``RERANKQ_REDELIVER_AFTER_S``) at ``RERANKQ_SCORING_TOKENS_PER_S``."""
    limit = most_window_cost(settings)
    worst = max(costs, default=0)
    if worst <= limit:
        return
    rate = settings.fairness.scoring_tokens_per_s
    field = "max_passages" if spec.long_documents == "passages" else "window_size"
    raise ValidationError(
        field,
        f"window {costs.index(worst)} would cost about {worst} tokens, {worst / rate:.0f} s at "
        f"RERANKQ_SCORING_TOKENS_PER_S ({rate}): past the task's time limit "
        f"({WORK_SHARE_OF_LEASE:.0%} of RERANKQ_REDELIVER_AFTER_S={settings.queues.redeliver_after_s}); "
        "lower window_size" + (", max_passages or passage_tokens" if field == "max_passages" else ""),
    )


def window_size_within(settings: Settings, spec: StreamSpec, candidates: Sequence[Candidate]) -> int:
    """The largest window size, at most ``spec.window_size``, whose every window stays inside the
    time limit: the gateway's choice for a rerank call (at least 1)."""
    costliest = max((candidate_cost(spec, c) for c in candidates), default=0)
    if costliest == 0:
        return spec.window_size
    return max(1, min(spec.window_size, most_window_cost(settings) // costliest))
