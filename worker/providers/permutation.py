"""A listwise answer read as a permutation, repaired as rank_llm repairs it, and the prompts'
sliding windows.

A model asked for ``[2] > [1] > [3]`` answers what it likes: prose around the ids, an id it was
never shown, one id twice, too few ids, or nothing usable. ``identifiers`` reads the ids it
named and ``repair`` turns them into a permutation of the prompt's passages the way rank_llm's
``receive_permutation`` does: repeated ids dropped (the first mention counts), ids out of range
dropped, and the ids it left out appended in the order they were given in. An answer naming no
usable id keeps the prompt's order (``Repaired.usable`` is False), and the caller says so.

Reading ids: what follows the last ``</think>`` (a reasoning model's answer after its thoughts,
as rank_llm cuts it), NFKC-normalised so full-width and superscript digits read as digits
(rank_llm maps them by a table), then every bracketed id (``[12]``, ``[ 12 ]``: the template's
own ``output_extraction_regex``). An answer with no bracketed id that holds nothing but numbers
and separators (``2 > 1 > 3``) is read by its numbers. Any other prose is not: rank_llm would
read "the 20 passages" as passage 20, which is in range in a prompt of 20.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

THINKING_END = "</think>"
# At most 6 digits: no prompt holds a million passages, and int() of a huge digit run is slow.
_BRACKETED = re.compile(r"\[\s*([0-9]{1,6})\s*\]", re.ASCII)
_NUMBER = re.compile(r"[0-9]{1,6}", re.ASCII)
_ONLY_NUMBERS = re.compile(r"[0-9\s>,;|.\-]+", re.ASCII)


def identifiers(answer: str) -> list[int]:
    """The 1-based ids an answer names, in the order it names them (repeats and strays included)."""
    text = unicodedata.normalize("NFKC", answer)
    if THINKING_END in text:
        text = text.rsplit(THINKING_END, 1)[1]
    found = _BRACKETED.findall(text)
    if not found and _ONLY_NUMBERS.fullmatch(text.strip() or "x"):
        found = _NUMBER.findall(text)
    return [int(i) for i in found]


@dataclass(frozen=True)
class Repaired:
    #: The prompt's passages in the answer's order: positions 0..m-1, each once.
    order: list[int]
    #: How many ids were dropped as out of range or repeated, and how many passages were
    #: missing and appended in their given order.
    out_of_range: int
    repeated: int
    missing: int

    @property
    def usable(self) -> bool:
        """Whether the answer named at least one passage of the prompt."""
        return self.missing < len(self.order)

    @property
    def repairs(self) -> list[str]:
        """What was repaired, by name (the metrics' ``repair`` label); empty for a clean answer."""
        if not self.usable:
            return ["no_identifiers"]
        counts = (("out_of_range", self.out_of_range), ("repeated", self.repeated), ("missing", self.missing))
        return [name for name, count in counts if count]


def repair(ids: list[int], size: int) -> Repaired:
    """The permutation of ``size`` passages that 1-based ``ids`` name, repaired (module doc)."""
    order: list[int] = []
    seen: set[int] = set()
    out_of_range = repeated = 0
    for identifier in ids:
        position = identifier - 1
        if not 0 <= position < size:
            out_of_range += 1
        elif position in seen:
            repeated += 1
        else:
            seen.add(position)
            order.append(position)
    missing = [p for p in range(size) if p not in seen]
    return Repaired(order=order + missing, out_of_range=out_of_range, repeated=repeated, missing=len(missing))


def prompt_spans(n: int, size: int, step: int) -> list[tuple[int, int]]:
    """The ``[start, end)`` spans of a list of ``n`` the prompts rank, in the order they are sent:
    from the bottom of the list up, ``step`` apart, so with ``step < size`` each overlaps the
    next and a passage can rise from the bottom to the top. The last span starts at 0, and a span
    of fewer than two passages is not sent (there is nothing to order).

    As rank_llm's ``sliding_windows`` (``end > 0``), less its window redundant with one already
    sent from the top (for 25 at 20 and 10: ``[5, 25)``, ``[0, 15)``, not then ``[0, 5)``).
    """
    spans: list[tuple[int, int]] = []
    end = n
    while end > 0:
        start = max(0, end - size)
        if end - start >= 2:
            spans.append((start, end))
        if start == 0:
            break
        end -= step
    return spans
