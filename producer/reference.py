"""The tables of docs/concepts.md that are generated from the structs: a candidate's fields
(``kernel.wire.Candidate``) and a stream's options (``producer.options.StreamOptions``).

``python -m producer.reference`` rewrites them in docs/concepts.md between their markers;
``--check`` exits 1 when the page differs from the structs (a test runs the same check). Each
row's words are the field's ``Meta`` description, so a field is documented where it is declared.
"""

from __future__ import annotations

import re
import sys
import typing
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi

from kernel.field_errors import NOT_BLANK_PATTERN, TOKEN_PATTERN
from kernel.wire import Candidate
from producer.options import StreamOptions

PAGE = Path(__file__).resolve().parent.parent / "docs" / "concepts.md"
_PATTERN_LIMITS = {TOKEN_PATTERN: "1-64 of `A-Z a-z 0-9 _ . -`", NOT_BLANK_PATTERN: "not blank"}
_MARKER = "<!-- {edge} generated table: {name} (python -m producer.reference); edit the struct, not the table -->"


def _literal_order(hint: Any) -> dict[frozenset[Any], tuple[Any, ...]]:
    """Each Literal in a type hint, in its declared order (msgspec's inspection sorts them)."""
    found: dict[frozenset[Any], tuple[Any, ...]] = {}
    if typing.get_origin(hint) is typing.Literal:
        found[frozenset(typing.get_args(hint))] = typing.get_args(hint)
    for arg in typing.get_args(hint):
        if not isinstance(arg, (str, int, float)) or typing.get_origin(hint) is not typing.Literal:
            found.update(_literal_order(arg))
    return found


def _bounds(kind: Any) -> list[str]:
    out = []
    for name, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
        value = getattr(kind, name, None)
        if value is not None:
            out.append(f"{sign} {value}")
    return out


#: Types whose name in a table is fixed, with the limits each always states.
_PLAIN: tuple[tuple[type, str, list[str]], ...] = (
    (mi.BoolType, "bool", []),
    (mi.DateTimeType, "datetime", ["RFC 3339"]),
    (mi.DictType, "mapping", []),
    (mi.AnyType, "any", []),
)


def _str_limits(kind: mi.StrType) -> list[str]:
    limits = []
    if kind.pattern in _PATTERN_LIMITS:
        limits.append(_PATTERN_LIMITS[kind.pattern])
    elif kind.pattern is not None:
        limits.append(f"matches `{kind.pattern}`")
    if kind.min_length is not None or kind.max_length is not None:
        limits.append(f"{kind.min_length or 0}-{kind.max_length} characters")
    return limits


def _shape(kind: Any, literals: dict[frozenset[Any], tuple[Any, ...]]) -> tuple[str, list[str]]:
    """A type's name in a table, and the limits it states."""
    if isinstance(kind, mi.Metadata):
        return _shape(kind.type, literals)
    if isinstance(kind, mi.UnionType):
        parts = [_shape(t, literals) for t in kind.types if not isinstance(t, mi.NoneType)]
        names = " or ".join(dict.fromkeys(name for name, _ in parts))
        return names, [limit for _, limits in parts for limit in limits]
    if isinstance(kind, mi.LiteralType):
        values = literals.get(frozenset(kind.values), kind.values)
        return " \\| ".join(f"`{v}`" for v in values), []
    if isinstance(kind, (mi.IntType, mi.FloatType)):
        return ("int" if isinstance(kind, mi.IntType) else "float"), _bounds(kind)
    if isinstance(kind, mi.StrType):
        return "str", _str_limits(kind)
    if isinstance(kind, mi.ListType):
        item, _ = _shape(kind.item_type, literals)
        return f"list of {item}", []
    if isinstance(kind, mi.StructType):
        return kind.cls.__name__, []
    for plain, name, limits in _PLAIN:
        if isinstance(kind, plain):
            return name, list(limits)
    return type(kind).__name__.removesuffix("Type").lower(), []


def _description(kind: Any) -> str:
    if isinstance(kind, mi.Metadata) and kind.extra_json_schema:
        return str(kind.extra_json_schema.get("description", "")).replace("  [", " [")
    return ""


def _rows(struct: type[msgspec.Struct]) -> list[tuple[str, str, str, str, mi.Field]]:
    hints = typing.get_type_hints(struct, include_extras=True)
    info = mi.type_info(struct)
    assert isinstance(info, mi.StructType)
    rows = []
    for field in info.fields:
        name, limits = _shape(field.type, _literal_order(hints[field.name]))
        rows.append((field.name, name, ", ".join(limits), _description(field.type), field))
    return rows


def options_table() -> str:
    lines = ["| option | type | limits | what it does [default] |", "|---|---|---|---|"]
    for name, kind, limits, words, _ in _rows(StreamOptions):
        lines.append(f"| `{name}` | {kind} | {limits} | {words} |")
    return "\n".join(lines)


def candidate_table() -> str:
    lines = ["| field | type | default | what it is |", "|---|---|---|---|"]
    for name, kind, _limits, words, field in _rows(Candidate):
        if field.required:
            default = "required"
        else:
            value = field.default if field.default is not msgspec.NODEFAULT else field.default_factory()
            default = "`" + msgspec.json.encode(value).decode() + "`"
        lines.append(f"| `{name}` | {kind} | {default} | {words} |")
    return "\n".join(lines)


TABLES = {"candidate fields": candidate_table, "stream options": options_table}


def render(page: str) -> str:
    """``page`` with every generated table between its markers made anew."""
    for name, table in TABLES.items():
        begin, end = (_MARKER.format(edge=edge, name=name) for edge in ("BEGIN", "END"))
        found = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S).search(page)
        if found is None:
            raise ValueError(f"{PAGE.name} has no markers for the {name} table: {begin}")
        page = page[: found.start()] + f"{begin}\n{table()}\n{end}" + page[found.end() :]
    return page


def main(argv: list[str]) -> int:
    page = PAGE.read_text()
    fresh = render(page)
    if "--check" in argv:
        if fresh != page:
            sys.stderr.write(f"{PAGE} is stale: python -m producer.reference\n")
            return 1
        return 0
    PAGE.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
