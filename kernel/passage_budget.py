"""What one passage, and one window of passages, may send: the bound ``open`` checks and the
worker's cut keeps, stated once for both.

A passage is the document's header and a span of its text. The span holds at most
``passage_tokens`` tokens (512 when the stream does not say: a member in process that reads
less cuts shorter, never longer); the header is clipped to half the document budget in code
points, as an excerpt's header is, and to as many tokens as the span may hold. So a passage
sends at most twice ``passage_tokens`` tokens, and a window at most ``window_size x
max_passages`` times that, which ``open`` holds under ``RERANKQ_MAX_WINDOW_PASSAGE_TOKENS``.
Tokens are those of the tokenizer the worker cuts with (``worker.scoring.passages``), counted
on the text as it is sent.
"""

from __future__ import annotations

import math

from kernel.limits import PASSAGE_FILL_SHARE, REMOTE_PASSAGE_TOKENS
from kernel.wire import StreamSpec


def text_tokens(spec: StreamSpec) -> int:
    """The most tokens of a document's text one passage holds (and its header too)."""
    return spec.passage_tokens or REMOTE_PASSAGE_TOKENS


def passage_tokens(spec: StreamSpec) -> int:
    """The most tokens one passage sends: its text and its header, each at most ``text_tokens``."""
    return 2 * text_tokens(spec)


def passage_fill(tokens: int) -> int:
    """The tokens under which a passage cut at a document's structure takes its next neighbour in."""
    return max(1, int(tokens * PASSAGE_FILL_SHARE))


def passage_count(spec: StreamSpec, chars: int) -> int:
    """The most passages a text of ``chars`` code points is cut into (a token covers at least one
    code point). Token windows: one per stride after the first. At the text's structure: a
    passage short of its fill was left so because its next neighbour did not fit beside it, so
    it and that neighbour hold more than a passage; each passage holds, on average, at least
    its fill or half a passage, whichever is less."""
    tokens = text_tokens(spec)
    if chars <= tokens:
        return 1
    if spec.passage_cut == "structure":
        count = 1 + math.ceil(chars / max(1, min(passage_fill(tokens), tokens // 2)))
    else:
        stride = spec.passage_stride or max(1, tokens // 2)
        count = 1 + math.ceil(max(0, chars - tokens) / stride)
    return min(spec.max_passages, count)


def header_chars(spec: StreamSpec) -> int:
    """The most code points of a passage's header: half the document budget."""
    return spec.document_budget // 2


def window_tokens(spec: StreamSpec) -> int:
    """The most tokens one window of a passages stream can send."""
    return spec.window_size * spec.max_passages * passage_tokens(spec)


def fitting_window_size(ceiling: int, max_passages: int, passage_tokens_asked: int | None = None) -> int:
    """The largest window whose passages stay under ``ceiling`` tokens (at least 1)."""
    per_document = max_passages * 2 * (passage_tokens_asked or REMOTE_PASSAGE_TOKENS)
    return max(1, ceiling // per_document)
