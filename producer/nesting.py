"""Which field of a JSON document nests too deeply, for the error that names it.

msgspec decodes recursively, and a body nested thousands of levels deep (a gateway body's
document object, ``metadata``, ``boosts``, a field TEI's shape ignores; a ``rerankq submit``
job line) ends in a ``RecursionError`` rather than a decode error with a path. Only then is the body scanned
here, token by token (strings skipped whole), for the first value nested past the bound,
and its field is named as ``producer.validation`` names one: ``documents[0].meta``.
"""

from __future__ import annotations

import re

import msgspec

from producer.validation import MAX_NESTING_DEPTH

#: How many levels of the path name the field (``candidates[0].metadata``); deeper labels
#: would only spell out the nesting itself.
FIELD_LEVELS = 3
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{},:]')


def too_deep_field(body: bytes, limit: int = MAX_NESTING_DEPTH) -> str | None:
    """The path of the first container nested more than ``limit`` levels deep, or None."""
    # One entry per open container: [is_object, label], the label being the key or index
    # the next value sits under.
    stack: list[list[object]] = []
    expect_key = False
    for match in _TOKEN.finditer(body):
        token = match.group()
        first = token[:1]
        if first == b'"':
            if expect_key:
                if len(stack) <= FIELD_LEVELS:
                    try:
                        stack[-1][1] = msgspec.json.decode(token, type=str)
                    except msgspec.DecodeError:
                        stack[-1][1] = "?"
                expect_key = False
        elif first in b"{[":
            stack.append([first == b"{", None if first == b"{" else 0])
            expect_key = first == b"{"
            if len(stack) > limit + 1:
                return _path(stack[:FIELD_LEVELS])
        elif first in b"}]":
            if stack:
                stack.pop()
            expect_key = False
        elif first == b"," and stack:
            if stack[-1][0]:
                expect_key = True
            elif isinstance(stack[-1][1], int):
                stack[-1][1] += 1
    return None


def _path(stack: list[list[object]]) -> str:
    """The labels down to the last named field: indexes past it only count the nesting."""
    labels = []
    for is_object, label in stack:
        if label is None:
            break
        labels.append(f".{label}" if is_object else f"[{label}]")
    while labels and labels[-1].startswith("["):
        labels.pop()
    return "".join(labels).lstrip(".") or "$"
