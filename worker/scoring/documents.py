"""Assemble the text a provider scores, which is also the text a reader gets back.

Scoring different text from what the reader is handed means the ranking is for a
document that does not exist, so there is exactly one assembly, used for both.
"""

from __future__ import annotations

import datetime as dt
import re
import unicodedata

from kernel.blank_text import is_blank
from kernel.wire import Candidate
from worker.scoring.boosts import effective_time

# Fixed English names: strftime's %B follows the process locale, and the text a
# model scores must not depend on which host's locale the worker started under.
_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
ELLIPSIS = "\u2026"
# Of the room left for the text, this much goes before the first query-term match,
# so the model sees what leads into it.
_LEAD_FRACTION = 0.25
_MIN_TERM_CHARS = 3
_STOPWORDS = frozenset(
    "the and for with from that this what when where which who why how are was were does did "
    "into onto about over under after before not but you your our their its".split()
)


def date_prefix(when: dt.datetime | None) -> str:
    # Both a written-out and an ISO date: cross-encoders read them differently.
    if when is None:
        return ""
    # Formatted by hand: strftime's %Y does not zero-pad years before 1000 on every platform.
    year, month, day = f"{when.year:04d}", f"{when.month:02d}", f"{when.day:02d}"
    return f"[Date: {_MONTHS[when.month - 1]} {day}, {year} ({year}-{month}-{day})] "


# -- cutting without splitting a character -----------------------------------


def _extends_previous(ch: str) -> bool:
    """True when ``ch`` belongs to the character before it (a mark, joiner, selector, modifier)."""
    code = ord(ch)
    return (
        unicodedata.category(ch) in ("Mn", "Me", "Mc")
        or code == 0x200D  # zero-width joiner
        or 0xFE00 <= code <= 0xFE0F  # variation selectors
        or 0x1F3FB <= code <= 0x1F3FF  # skin-tone modifiers
        or 0xE0020 <= code <= 0xE007F  # emoji tag sequence
        or 0xDC00 <= code <= 0xDFFF  # a low surrogate (only in text decoded with surrogatepass)
    )


def _is_regional_indicator(ch: str) -> bool:
    return 0x1F1E6 <= ord(ch) <= 0x1F1FF


def is_boundary(text: str, pos: int) -> bool:
    """Whether cutting ``text`` at ``pos`` leaves every user-visible character whole.

    Python strings index code points, so no code point is ever split; this also keeps
    combining accents, ZWJ emoji sequences, skin tones and flag pairs together.
    """
    if pos <= 0 or pos >= len(text):
        return True
    if _extends_previous(text[pos]) or text[pos - 1] == "\u200d":
        return False
    if _is_regional_indicator(text[pos]) and _is_regional_indicator(text[pos - 1]):
        run = 0
        i = pos - 1
        while i >= 0 and _is_regional_indicator(text[i]):
            run += 1
            i -= 1
        return run % 2 == 0  # flags are pairs: cut only between pairs
    return True


def _back_to_boundary(text: str, pos: int) -> int:
    while pos > 0 and not is_boundary(text, pos):
        pos -= 1
    return pos


def _forward_to_boundary(text: str, pos: int) -> int:
    while pos < len(text) and not is_boundary(text, pos):
        pos += 1
    return pos


def clip(text: str, budget: int) -> str:
    """The head of ``text`` in at most ``budget`` code points, cut between whole characters."""
    if len(text) <= budget:
        return text
    return text[: _back_to_boundary(text, max(budget, 0))]


# -- keeping the part that matches the query ---------------------------------


def query_terms(query: str) -> list[str]:
    terms = []
    for word in re.findall(r"\w+", query):
        lowered = word.lower()
        # Short and function words match everywhere and would pin every window to the start.
        if (len(word) >= _MIN_TERM_CHARS or not word.isascii()) and lowered not in _STOPWORDS:
            terms.append(word)
    return list(dict.fromkeys(terms))


def first_match(text: str, query: str) -> int | None:
    """Code-point offset of the first query term in ``text`` (case-insensitive), or None."""
    terms = query_terms(query)
    if not terms:
        return None
    # Longest first, so "payments" is preferred over its prefix "pay" at the same spot.
    pattern = "|".join(re.escape(t) for t in sorted(terms, key=len, reverse=True))
    match = re.search(pattern, text, flags=re.IGNORECASE)
    return match.start() if match else None


def excerpt(text: str, query: str, budget: int) -> str:
    """At most ``budget`` code points of ``text``, around the first query-term match.

    Without a match (or when the match is near the start) this is the head of the
    text. A cut end is marked with an ellipsis, counted in the budget.
    """
    if len(text) <= budget:
        return text
    if budget <= 1:
        return clip(text, budget)
    match = first_match(text, query)
    room = budget - 1  # one code point for the trailing ellipsis
    lead = int(room * _LEAD_FRACTION)
    if match is None or match <= lead:
        return clip(text, room) + ELLIPSIS
    room -= 1  # and one for the leading ellipsis
    start = _forward_to_boundary(text, max(0, match - int(room * _LEAD_FRACTION)))
    # Prefer to start at a word: skip forward to just after a space if one is near.
    space = text.find(" ", start, match)
    if space != -1 and space - start < 32:
        # What follows the space may be a mark that belongs to it: start at the next boundary.
        start = _forward_to_boundary(text, space + 1)
    end = start + room
    if end >= len(text):
        # The match sits in the tail: take the whole tail, as much lead as fits.
        start = _forward_to_boundary(text, len(text) - (budget - 1))
        return ELLIPSIS + text[start:]
    end = _back_to_boundary(text, end)
    return ELLIPSIS + text[start:end] + ELLIPSIS


# -- the assembled document --------------------------------------------------


def has_text(candidate: Candidate) -> bool:
    """Whether there is anything to score (``kernel.blank_text``: white space, control and
    format characters alone are no text; they would get a confident-looking score for nothing)."""
    return not is_blank(candidate.text)


def header(candidate: Candidate) -> str:
    """Everything before the candidate's text: date, heading path, context."""
    parts = date_prefix(effective_time(candidate))
    heading = " > ".join(h for h in candidate.heading_path if h)
    if heading:
        parts += f"{heading}\n\n"
    if candidate.context:
        parts += f"{candidate.context}: "
    return parts


def assemble(candidate: Candidate, query: str, *, budget: int) -> str:
    """``[Date: …] heading > path\\n\\n{context}: {text}``, at most ``budget`` code points.

    When too long the header is kept (it is short and grounds the text) and the text
    is cut to the part around the first query-term match.
    """
    head = header(candidate)
    if not has_text(candidate):
        return clip(head.rstrip(), budget)
    if len(head) + len(candidate.text) <= budget:
        return head + candidate.text
    if len(head) >= budget // 2:
        # A header that eats half the budget is itself the problem; keep the text instead.
        return clip(head, budget // 2) + excerpt(candidate.text, query, budget - len(clip(head, budget // 2)))
    return head + excerpt(candidate.text, query, budget - len(head))
