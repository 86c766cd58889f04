"""Where a long document is cut into passages: at its own breaks first, token windows last.

``cut_on_structure`` reads the document's structure: a blank line or a Markdown heading ends a
block; a block longer than a passage is cut at its sentences (``.``, ``!``, ``?`` before a
space; ``。``, ``！``, ``？`` in scripts written without spaces); a sentence longer than a passage
is cut into token windows. Neighbouring pieces are then merged while a passage is shorter
than its fill (``PASSAGE_FILL_SHARE`` of a passage: all of it as shipped) and the merged one
still fits, so a heading travels with its paragraph (a heading always starts a passage) and
a one-line paragraph does not stand alone. Where the passages would number more than a
document may have, a fill under a whole passage doubles until they cover it
(or every passage is full, and the rest of the document is not read: the spans say where
reading stopped). A text without any break is cut into overlapping token windows, as
``cut_token_windows`` does.

Spans are code points into the text, trimmed of the whitespace around them; tokens are the
tokenizer's offsets into the same text, so a span's tokens are those that start inside it.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator

from kernel.passage_budget import passage_fill
from worker.scoring.documents import _back_to_boundary

Span = tuple[int, int]

# A blank line (spaces allowed on it) ends a block; so does a heading line, which is a block
# of its own.
_BLANK_LINE = re.compile(r"\n[^\S\n]*\n")
_HEADING = re.compile(r"^[^\S\n]{0,3}#{1,6}[^\S\n].*$", re.MULTILINE)
# The end of a sentence: its punctuation and any closing quote or bracket, then a space; in
# CJK text the full-width punctuation alone.
_SENTENCE_END = re.compile(r"[.!?…]+[\"'”’)\]]*(?=\s)|[。！？]+[」』”’）]*")


def cut_token_windows(text: str, offsets: list[Span], *, tokens: int, stride: int, max_passages: int) -> list[Span]:
    """Spans of ``text``, each of at most ``tokens`` tokens, ``stride`` tokens apart, the first
    ``max_passages``. A text that fits in one passage is one span: the whole text.

    A span keeps whole characters: where a cut would split one (a ZWJ emoji, a flag pair, an
    accent several tokens long), its start moves back to the character's start and its end
    back to the character's start before it, so the span never holds more than ``tokens``
    tokens; the next span starts no later than the first token this one left out, so every
    token is read. Only a character longer than a whole passage is cut inside.
    """
    if len(offsets) <= tokens:
        return [(0, len(text))]
    ends = [b for _, b in offsets]
    spans: list[Span] = []
    first = 0
    while len(spans) < max_passages:
        start = _back_to_boundary(text, offsets[first][0])
        # Tokens before `first` that the move back takes in come off the end.
        taken = first - bisect.bisect_right(ends, start)
        last = min(first + tokens - taken, len(offsets)) - 1
        if last < first:  # one character longer than the passage: cut inside it
            start, last = offsets[first][0], min(first + tokens, len(offsets)) - 1
        end = offsets[last][1] if last == len(offsets) - 1 else _back_to_boundary(text, offsets[last][1])
        if end <= start:
            end = offsets[last][1]
        spans.append((start, end))
        if last == len(offsets) - 1 and end >= offsets[-1][1]:
            break
        # The next span starts `stride` on, or at the first token this one did not read whole.
        # (At least one on: a token that runs past the end of a character is read in part.)
        first = max(first + 1, min(first + stride, bisect.bisect_right(ends, end)))
    return spans


class DocumentTokens:
    """How many of the text's tokens a span holds: those that start inside it."""

    def __init__(self, offsets: list[Span]) -> None:
        self.offsets = offsets
        self.starts = [a for a, _ in offsets]

    def count(self, start: int, end: int) -> int:
        return bisect.bisect_left(self.starts, end) - bisect.bisect_left(self.starts, start)

    def within(self, start: int, end: int) -> list[Span]:
        """The span's tokens, as offsets into ``text[start:end]``."""
        first, last = bisect.bisect_left(self.starts, start), bisect.bisect_left(self.starts, end)
        return [(a - start, min(b, end) - start) for a, b in self.offsets[first:last]]


def _trimmed(text: str, start: int, end: int) -> Span | None:
    piece = text[start:end]
    if not piece.strip():
        return None
    return start + len(piece) - len(piece.lstrip()), end - (len(piece) - len(piece.rstrip()))


def _pieces(text: str, start: int, end: int, breaks: Iterator[re.Match[str]]) -> list[Span]:
    """``text[start:end]`` cut after each break (a break's own text stays with the piece before
    it), each piece trimmed; blank pieces dropped."""
    spans, at = [], start
    for match in breaks:
        spans.append(_trimmed(text, at, match.end()))
        at = match.end()
    spans.append(_trimmed(text, at, end))
    return [s for s in spans if s is not None]


def heading_starts(text: str) -> set[int]:
    return {span[0] for m in _HEADING.finditer(text) if (span := _trimmed(text, *m.span()))}


def blocks(text: str) -> list[Span]:
    """The text's blocks: paragraphs between blank lines, each heading line one of its own."""
    out: list[Span] = []
    for start, end in _pieces(text, 0, len(text), _BLANK_LINE.finditer(text)):
        at = start
        for heading in _HEADING.finditer(text, start, end):
            out.extend(s for s in (_trimmed(text, at, heading.start()), _trimmed(text, *heading.span())) if s)
            at = heading.end()
        out.extend(s for s in (_trimmed(text, at, end),) if s)
    return out


def sentences(text: str, start: int, end: int) -> list[Span]:
    return _pieces(text, start, end, _SENTENCE_END.finditer(text, start, end))


def units(text: str, text_blocks: list[Span], counted: DocumentTokens, tokens: int) -> list[Span]:
    """The smallest pieces a passage is made of: blocks that fit, else their sentences that fit,
    else a sentence's token windows (side by side, none overlapping)."""
    out: list[Span] = []
    for block in text_blocks:
        if counted.count(*block) <= tokens:
            out.append(block)
            continue
        for sentence in sentences(text, *block):
            if counted.count(*sentence) <= tokens:
                out.append(sentence)
                continue
            start = sentence[0]
            piece = text[start : sentence[1]]
            windows = cut_token_windows(
                piece, counted.within(*sentence), tokens=tokens, stride=tokens, max_passages=len(piece)
            )
            out.extend((start + a, start + b) for a, b in windows)
    return out


def merged(pieces: list[Span], counted: DocumentTokens, *, tokens: int, fill: int, headings: set[int]) -> list[Span]:
    """Neighbouring pieces joined while a passage holds fewer than ``fill`` tokens and the joined
    one holds at most ``tokens``; a heading (its start in ``headings``) starts a passage."""
    out = [pieces[0]]
    for start, end in pieces[1:]:
        head, _ = out[-1]
        if start not in headings and counted.count(*out[-1]) < fill and counted.count(head, end) <= tokens:
            out[-1] = (head, end)
        else:
            out.append((start, end))
    return out


def cut_on_structure(text: str, offsets: list[Span], *, tokens: int, stride: int, max_passages: int) -> list[Span]:
    """The document's passages cut at its blocks and sentences (see the module's docstring), at
    most ``max_passages`` of them, the first ones kept when even full passages are more."""
    if len(offsets) <= tokens:
        return [(0, len(text))]
    text_blocks = blocks(text)
    if len(text_blocks) == 1 and len(sentences(text, *text_blocks[0])) == 1:
        # No break anywhere: overlapping windows, so what a cut splits is read whole in the next.
        return cut_token_windows(text, offsets, tokens=tokens, stride=stride, max_passages=max_passages)
    counted = DocumentTokens(offsets)
    pieces = units(text, text_blocks, counted, tokens)
    headings = heading_starts(text)
    fill = passage_fill(tokens)
    passages = merged(pieces, counted, tokens=tokens, fill=fill, headings=headings)
    while len(passages) > max_passages and fill < tokens:
        fill = min(tokens, fill * 2)
        passages = merged(pieces, counted, tokens=tokens, fill=fill, headings=headings)
    return passages[:max_passages]
