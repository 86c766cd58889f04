"""Field paths, and msgspec's validation errors as ``ValidationError(field=...)``.

msgspec says where a value failed only in its message text (``... - at `$.boosts.recency_alpha```),
so this is the one place that reads that text. Every decoder and converter that takes input
(``open``'s options and candidates, the gateway's bodies, ``rerankq submit``'s job lines,
settings) raises through ``from_msgspec``, so a field is named the same way everywhere.
"""

from __future__ import annotations

import difflib
import functools
import re
import typing
from collections.abc import Iterable
from typing import Any, Literal

import msgspec

from kernel.errors import ValidationError

#: A token of safe characters: idempotency keys, tenants, chain profiles. ``(?![\s\S])``
#: ends the match at the end of the string: msgspec searches with Python's ``re``, whose ``$``
#: also matches before a trailing newline, and JSON Schema readers take the same pattern.
TOKEN_PATTERN = r"^[A-Za-z0-9_.\-]{1,64}(?![\s\S])"
#: Some text that is not only whitespace.
NOT_BLANK_PATTERN = r"\S"
#: Names separated by commas (remote-control commands): lower-case identifiers, or nothing.
NAME_LIST_PATTERN = r"^([a-z_][a-z0-9_]*(, *[a-z_][a-z0-9_]*)*)?(?![\s\S])"
#: What a pattern means, in the words an error uses instead of the regular expression.
PATTERN_WORDS = {
    TOKEN_PATTERN: "must be 1-64 characters of A-Z a-z 0-9 _ . -",
    NOT_BLANK_PATTERN: "must not be empty or only whitespace (leave it out instead)",
    NAME_LIST_PATTERN: "must be names of a-z 0-9 _ separated by commas",
}

_AT_KEY = re.compile(r"(?s)(.*) - at `key` in `\$(.*)`")
_AT = re.compile(r"(?s)(.*) - at `\$(.*)`")
_NAMED = re.compile(r"(?s)Object (missing required|contains unknown) field `(.*)`")
_PATTERN = re.compile(r"(?s)Expected `str` matching regex '(.*)'")


def show(value: Any) -> str:
    """A value for an error message: bounded, and ASCII-safe for lone surrogates (repr escapes them)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def child(path: str, key: Any) -> str:
    """``path.key`` for a name, ``path[3]`` for an index, ``path['a key']`` for anything else."""
    if isinstance(key, str) and key.isascii() and key.isidentifier():
        return f"{path}.{key}" if path else key
    if isinstance(key, int) and not isinstance(key, bool):
        return f"{path}[{key}]"
    return f"{path}[{show(key)}]"


def from_msgspec(exc: msgspec.ValidationError, prefix: str = "", *, known: Iterable[str] = ()) -> ValidationError:
    """msgspec's ``... - at `$[2].text``` as ``ValidationError("prefix[2].text", ...)``.

    A missing or unknown field joins the path; an unknown one that is close to a name in
    ``known`` says which was meant. A failed pattern says what it means, not the expression.
    """
    text = str(exc)
    key_error = _AT_KEY.fullmatch(text)
    located = key_error or _AT.fullmatch(text)
    message, path = (located.group(1), located.group(2)) if located else (text, "")
    path = prefix + path
    if key_error:
        message += " (a mapping key)"
    named = _NAMED.fullmatch(message)
    if named:
        parent = path.lstrip(".")
        path = child(parent, named.group(2))
        if named.group(1) == "contains unknown":
            message = "unknown field" + _suggestion(named.group(2), parent, known)
    enum = _ENUM.fullmatch(message)
    if enum:
        values = _enum_values().get(_last_name(path))
        if values:
            message += "; valid values: " + ", ".join(values)
    pattern = _PATTERN.fullmatch(message)
    if pattern:
        # msgspec quotes the pattern as repr() would, doubling its backslashes.
        message = PATTERN_WORDS.get(pattern.group(1).replace("\\\\", "\\"), message)
    return ValidationError(path.lstrip("."), message)


_ENUM = re.compile(r"(?s)Invalid enum value .*")

#: Names people reach for that a candidate spells otherwise: what to say instead of nothing.
CANDIDATE_SYNONYMS = {
    "title": "context or heading_path",
    "heading": "heading_path",
    "headings": "heading_path",
    "body": "text",
    "content": "text",
    "document": "text",
    "score": "fusion_score",
    "url": "source or metadata",
    "tags": "metadata",
    "date": "occurred_start or mentioned_at",
    "timestamp": "occurred_start or mentioned_at",
    "created_at": "occurred_start or mentioned_at",
}


def _last_name(path: str) -> str:
    """The last name of a field path, indexes dropped: ``candidates[2]`` -> ``candidates``."""
    return re.sub(r"(\[[^\]]*\])+$", "", path).rsplit(".", 1)[-1]


@functools.cache
def _nested_fields() -> dict[str, tuple[str, ...]]:
    """The fields of the structs that input nests, by the name they are nested under."""
    from kernel.wire import Boosts, Candidate, TimeRange

    return {
        "candidates": Candidate.__struct_fields__,
        "boosts": Boosts.__struct_fields__,
        "query_range": TimeRange.__struct_fields__,
    }


@functools.cache
def _enum_values() -> dict[str, tuple[str, ...]]:
    """Each input field that takes one of a few words, by name, and those words."""
    from kernel.wire import Boosts, BudgetLevel, Lane, StreamSpec

    values: dict[str, tuple[str, ...]] = {"lane": typing.get_args(Lane), "budget": typing.get_args(BudgetLevel)}
    for struct in (StreamSpec, Boosts):
        for name, hint in typing.get_type_hints(struct).items():
            for option in (hint, *typing.get_args(hint)):
                if typing.get_origin(option) is Literal:
                    values[name] = typing.get_args(option)
    return values


def _suggestion(name: str, parent: str, known: Iterable[str]) -> str:
    """``; did you mean X?`` for an unknown field ``name`` of the struct at ``parent``, or ''."""
    nested = _nested_fields().get(_last_name(parent)) if parent else None
    names = list(nested) if nested else list(known)
    if nested is not None and _last_name(parent) == "candidates" and name.lower() in CANDIDATE_SYNONYMS:
        return f"; did you mean {CANDIDATE_SYNONYMS[name.lower()]}? (a candidate's fields: docs/concepts.md)"
    close = difflib.get_close_matches(name, names, n=1)
    return f"; did you mean {close[0]}?" if close else ""
