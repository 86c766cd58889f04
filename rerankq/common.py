"""What every command shares: settings and a client from the environment, ``--json`` output."""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
import msgspec

F = TypeVar("F", bound=Callable[..., Any])


def json_option(help_text: str = "print one JSON document for scripts instead of tables") -> Callable[[F], F]:
    return click.option("--json", "as_json", is_flag=True, help=help_text)


def client() -> Any:
    """A ``RerankClient`` configured like the workers: ``RERANKQ_*`` variables and ``RERANKQ_CONFIG_FILE``."""
    from producer import RerankClient, load_settings

    return RerankClient(load_settings())


def _plain(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    raise NotImplementedError(type(value))


def to_builtins(value: Any) -> Any:
    """JSON-ready data with every field, defaults included (the wire structs omit them), so a
    script finds the same keys in every row."""
    if isinstance(value, msgspec.Struct):
        config = type(value).__struct_config__
        out = {config.tag_field: config.tag} if config.tag is not None else {}
        out.update((name, to_builtins(getattr(value, name))) for name in value.__struct_fields__)
        return out
    if isinstance(value, dict):
        return {k: to_builtins(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_builtins(v) for v in value]
    return msgspec.to_builtins(value, enc_hook=_plain)


def print_json(value: Any) -> None:
    sys.stdout.write(msgspec.json.encode(to_builtins(value)).decode() + "\n")
    sys.stdout.flush()


def printable(text: str) -> str:
    """``text`` safe to print to a terminal: control characters (ESC, BEL, ...) and format
    characters (bidirectional overrides such as U+202E, zero-width ones) as ``\\x1b`` or
    ``\\u202e``. Text from a stream is data; written raw, an escape sequence would drive the
    terminal (set its title, clear it) and an override would reorder what the reader sees."""
    if text.isprintable():
        return text
    return "".join(
        ch if ch.isprintable() or ch == " " else (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")
        for ch in text
    )


def console(stderr: bool = False) -> Any:
    """A rich console; when not a terminal, wide enough that a table is not squeezed to 80 columns."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=None if stream.isatty() else 200)


def age(seconds: float | None) -> str:
    """``42s``, ``3m05s``, ``2h10m``; ``-`` for unknown."""
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
