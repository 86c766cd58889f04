"""``rerankq submit``'s flags for the stream's options, generated from ``StreamOptions``.

One flag a field, ``--window-size`` for ``window_size``: its type and limits from the field's
type and ``Meta`` (an integer range, a choice of literals, a switch for a boolean), its help
from the field's description. A field holding a struct (``boosts``, ``query_range``) takes
``NAME=VALUE`` pairs, repeated. Values are checked by ``StreamOptions`` itself, as ``open``
checks them, so the command line refuses exactly what ``open`` refuses, naming the flag.

Where submit means more than ``open`` does, it says so here: a run's windows go to the batch
lane unless told, a job's first windows are all of them, and ``--idempotency-key`` (also
``--run-id``) is the run's key, from which each job's own key is derived.
"""

from __future__ import annotations

import datetime as dt
import re
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal, Union

import click
import msgspec
from msgspec import Meta

from producer.options import StreamOptions, description, option_types

#: What an option means to submit where it differs from open's, and its default here.
SUBMIT_HELP = {
    "idempotency_key": "the run's key: each job's idempotency key is a digest of it and the job id, so the same "
    "command run again opens nothing twice (a job line's own idempotency_key is used as it is)  "
    "[default: a digest of the input and output paths and the job options]",
    "first_windows": "windows each job admits and sends when it opens; the rest follow at once  "
    "[default: every window of the job]",
}
SUBMIT_DEFAULTS: dict[str, Any] = {"lane": "batch"}
#: Names kept for the flags as they were first spelled.
ALIASES = {"boosts": ("--boost",), "idempotency_key": ("--run-id",)}


def flag_of(field: str) -> str:
    """The flag that sets a field's path (``boosts.recency_alpha`` is set by ``--boosts``)."""
    root = re.split(r"[.\[]", field, maxsplit=1)[0]
    return "--" + root.replace("_", "-")


def _unwrap(annotation: Any) -> tuple[Any, dict[str, Any]]:
    """The type under ``Annotated`` and ``Optional``, and the limits its ``Meta`` states."""
    limits: dict[str, Any] = {}
    while True:
        if typing.get_origin(annotation) is Annotated:
            for meta in annotation.__metadata__:
                if isinstance(meta, Meta):
                    limits.update(
                        {k: getattr(meta, k) for k in ("ge", "le", "gt", "lt") if getattr(meta, k) is not None}
                    )
            annotation = typing.get_args(annotation)[0]
            continue
        if typing.get_origin(annotation) in (Union, types.UnionType):
            rest = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(rest) == 1:
                annotation = rest[0]
                continue
        return annotation, limits


def _pairs(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, Any] | None:
    """``NAME=VALUE`` pairs as a mapping; a number is read as one, anything else stays text."""
    found: dict[str, Any] = {}
    for item in values:
        name, sep, raw = item.partition("=")
        if not sep or not name.strip():
            raise click.BadParameter(f"{item!r}: expected NAME=VALUE", param=param)
        try:
            found[name.strip()] = float(raw)
        except ValueError:
            found[name.strip()] = raw.strip()
    return found or None


def _option(name: str, annotation: Any) -> Callable[[Any], Any]:
    kind, limits = _unwrap(annotation)
    names = ("--" + name.replace("_", "-"), *ALIASES.get(name, ()), name)
    help_text = SUBMIT_HELP.get(name) or description(annotation)
    default = SUBMIT_DEFAULTS.get(name)
    extra: dict[str, Any] = {"default": default, "show_default": default is not None}
    if default is not None:
        help_text = re.sub(r"\s*\[default: [^]]*\]$", "", help_text)
    if typing.get_origin(kind) is Literal:
        extra["type"] = click.Choice([str(v) for v in typing.get_args(kind)])
    elif kind is bool:
        extra.update(is_flag=True, flag_value=True)
    elif kind is int:
        extra["type"] = click.IntRange(min=limits.get("ge"), max=limits.get("le")) if limits else int
    elif kind is float:
        extra["type"] = click.FloatRange(min=limits.get("ge"), max=limits.get("le")) if limits else float
    elif isinstance(kind, type) and issubclass(kind, msgspec.Struct):
        extra.update(multiple=True, callback=_pairs, metavar="NAME=VALUE", default=())
        help_text += "; repeat NAME=VALUE for each field"
    elif kind is dt.datetime:
        extra["metavar"] = "DATETIME"
    else:  # text, or text-or-mapping (strategy_boosts): the text form
        extra["type"] = str
    return click.option(*names, help=help_text, **extra)


def stream_option_flags(options: type[StreamOptions] = StreamOptions) -> Callable[[Any], Any]:
    """A decorator adding a flag for every field of ``options``, in its order."""
    hints = option_types(options)

    def decorate(command: Any) -> Any:
        for name in reversed(options.__struct_fields__):
            command = _option(name, hints[name])(command)
        return command

    return decorate


def given_flags(values: dict[str, Any], options: type[StreamOptions] = StreamOptions) -> dict[str, Any]:
    """The option flags given on the command line (or defaulted by submit), by field name."""
    return {name: values[name] for name in options.__struct_fields__ if values.get(name) is not None}
