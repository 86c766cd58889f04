"""The map between a setting's field path and its environment variable, built from the structs.

A field ``<section>.<field>`` is the variable ``RERANKQ_`` + the section's prefix + the field
in capitals: ``breaker.failures`` is ``RERANKQ_BREAKER_FAILURES``, ``queues.cpu_queue`` is
``RERANKQ_CPU_QUEUE``. Two families are read by pattern instead: chain members
(``RERANKQ_RERANKER_<FIELD>``, ``RERANKQ_RERANKER_<n>_<FIELD>``) and chain profiles
(``RERANKQ_CHAIN_<NAME>``). A keyword override of ``load_settings`` is the variable's name
without the prefix, in lower case (``breaker_failures=5``).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from types import NoneType, UnionType
from typing import Any, Literal, Union

import msgspec

from kernel.field_errors import NAME_LIST_PATTERN
from kernel.settings.members import MemberSettings
from kernel.settings.model import SECTIONS, Settings
from kernel.settings.types import MAX_INT64

PREFIX = "RERANKQ_"
#: Names the file to read settings from; read by the loader itself, not a field.
CONFIG_FILE = PREFIX + "CONFIG_FILE"
MEMBER_PREFIX = PREFIX + MemberSettings.prefix
CHAIN_PROFILE_PREFIX = PREFIX + "CHAIN_"
CALIBRATION_PROFILE_PREFIX = PREFIX + "CALIBRATION_"
#: ``RERANKQ_*`` names that are no setting of rerankq's but the deployment's own: the loader
#: accepts and ignores them, so a shell that exports them for docker compose still runs rerankq.
DEPLOYMENT_NAMES = {
    PREFIX + "REDIS_PASSWORD": "docker-compose.yml: the password of its Redis (its store URL carries it)",
    PREFIX + "RABBITMQ_PASSWORD": "docker-compose.yml: the password of its RabbitMQ (its broker URL carries it)",
}


@dataclass(frozen=True)
class Field:
    """One field of a struct: what the reference prints and the loader checks."""

    name: str
    annotation: Any
    default: Any
    description: str

    @property
    def nullable(self) -> bool:
        return _nullable(self.annotation)


@dataclass(frozen=True)
class Variable:
    name: str
    section: str
    field: Field

    @property
    def path(self) -> str:
        return f"{self.section}.{self.field.name}"


def _nullable(annotation: Any) -> bool:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (Union, UnionType):
        return NoneType in typing.get_args(annotation)
    return annotation is NoneType


def _description(annotation: Any) -> str:
    if typing.get_origin(annotation) is typing.Annotated:
        for meta in reversed(annotation.__metadata__):
            if isinstance(meta, msgspec.Meta) and meta.description:
                return meta.description
    return ""


def struct_fields(struct: type[msgspec.Struct]) -> list[Field]:
    hints = typing.get_type_hints(struct, include_extras=True)
    info = {f.name: f for f in msgspec.structs.fields(struct)}
    families = getattr(struct, "families", ())
    return [
        Field(name, hints[name], info[name].default, _description(hints[name]))
        for name in struct.__struct_fields__
        if name not in families
    ]


def section_prefix(section: str) -> str:
    """What follows ``RERANKQ_`` in every variable of a section (``BREAKER_``; empty for most)."""
    prefix: str = SECTIONS[section].prefix  # type: ignore[attr-defined]
    return prefix


def variable_name(section: str, field: str) -> str:
    return PREFIX + section_prefix(section) + field.upper()


def _variables() -> dict[str, Variable]:
    table: dict[str, Variable] = {}
    for section, struct in SECTIONS.items():
        for field in struct_fields(struct):
            name = variable_name(section, field.name)
            if name in table or name == CONFIG_FILE:
                raise RuntimeError(f"{name} names both {table[name].path} and {section}.{field.name}")
            table[name] = Variable(name, section, field)
    return table


#: Every single-valued setting, by variable name.
VARIABLES: dict[str, Variable] = _variables()
#: The same, by field path (``breaker.failures``).
BY_PATH: dict[str, Variable] = {v.path: v for v in VARIABLES.values()}
MEMBER_FIELDS: dict[str, Field] = {f.name: f for f in struct_fields(MemberSettings)}
#: ``load_settings`` keyword -> field path: the variable's name without the prefix, lower case.
OVERRIDES: dict[str, str] = {name[len(PREFIX) :].lower(): v.path for name, v in VARIABLES.items()}


def variable(path: str) -> str:
    """The variable behind a field path: ``variable("breaker.failures") == "RERANKQ_BREAKER_FAILURES"``."""
    return BY_PATH[path].name


def member_variable(index: int, field: str) -> str:
    """The environment variable behind one member setting: RERANKQ_RERANKER_1_URL (member 0 unindexed)."""
    prefix = MEMBER_PREFIX if index == 0 else f"{MEMBER_PREFIX}{index}_"
    return prefix + field.upper()


def chain_profile_variable(name: str) -> str:
    return CHAIN_PROFILE_PREFIX + name.upper()


def calibration_profile_variable(name: str) -> str:
    return CALIBRATION_PROFILE_PREFIX + name.upper()


def type_text(annotation: Any) -> str:
    """A field's type as the reference prints it: ``int > 0``, ``v1 | v2``, ``float | unset``."""
    limits: list[str] = []
    while typing.get_origin(annotation) is typing.Annotated:
        for meta in annotation.__metadata__:
            if isinstance(meta, msgspec.Meta):
                for attr, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
                    bound = getattr(meta, attr)
                    # A 64-bit ceiling is what every count has: said once in the reference's intro.
                    if bound is not None and bound != MAX_INT64:
                        limits.append(f"{sign} {bound}")
                if meta.pattern == NAME_LIST_PATTERN:
                    return "names, comma-separated (a-z 0-9 _)"
                if meta.pattern:
                    return "name (1-64 of A-Z a-z 0-9 _ . -)"  # field_errors.TOKEN_PATTERN
        annotation = typing.get_args(annotation)[0]
    origin = typing.get_origin(annotation)
    if origin in (Union, UnionType):
        parts = [type_text(a) for a in typing.get_args(annotation) if a is not NoneType]
        text = " | ".join(parts) + (" | unset" if NoneType in typing.get_args(annotation) else "")
    elif origin is Literal:
        text = " | ".join(str(a) for a in typing.get_args(annotation))
    else:
        text = {"Secret": "secret"}.get(
            getattr(annotation, "__name__", ""), getattr(annotation, "__name__", str(annotation))
        )
    return f"{text} {' '.join(limits)}" if limits else text


__all__ = [
    "BY_PATH",
    "CALIBRATION_PROFILE_PREFIX",
    "CHAIN_PROFILE_PREFIX",
    "CONFIG_FILE",
    "DEPLOYMENT_NAMES",
    "MEMBER_FIELDS",
    "MEMBER_PREFIX",
    "OVERRIDES",
    "PREFIX",
    "VARIABLES",
    "Field",
    "Settings",
    "Variable",
    "calibration_profile_variable",
    "chain_profile_variable",
    "member_variable",
    "struct_fields",
    "type_text",
    "variable",
    "variable_name",
]
