"""``rerankq config``: the settings this host would run with, and where each came from."""

from __future__ import annotations

from typing import Any

import click
import msgspec

from rerankq.common import console, json_option, print_json

#: Fields shown masked whatever their type: the gateway's inline keys (hashes, but a key file's worth).
_MASKED_FIELDS = {"gateway.keys"}


class Row(msgspec.Struct, kw_only=True):
    path: str
    variable: str
    value: Any
    source: str


def shown(path: str, value: Any) -> Any:
    """The value as it may be printed: secrets masked, and in any URL its credentials and
    secret query values (``kernel.masking``, as every log line and message masks them)."""
    from kernel.masking import mask_text
    from kernel.settings import Secret

    if isinstance(value, Secret) or (path in _MASKED_FIELDS and value is not None):
        return "***"
    if isinstance(value, str):
        return mask_text(value)
    return value


def effective_rows(loaded: Any) -> list[Row]:
    """Every setting of ``loaded`` (a ``kernel.settings.Loaded``), members and profiles included."""
    from kernel.settings.loader import DEFAULT
    from kernel.settings.variables import MEMBER_FIELDS, VARIABLES, chain_profile_variable, member_variable

    settings = loaded.settings
    rows = []
    for var in VARIABLES.values():
        value = getattr(getattr(settings, var.section), var.field.name)
        rows.append(
            Row(
                path=var.path,
                variable=loaded.names.get(var.path, var.name),
                value=shown(var.path, value),
                source=loaded.sources.get(var.path, DEFAULT),
            )
        )
    configured = bool(settings.chain.members)
    for index, member in enumerate(settings.chain.effective_members()):
        for name in MEMBER_FIELDS:
            path = f"chain.members[{index}].{name}"
            source = loaded.sources.get(path, loaded.sources.get("chain.members", DEFAULT))
            rows.append(
                Row(
                    path=path,
                    variable=loaded.names.get(path, member_variable(index, name)),
                    value=shown(path, getattr(member, name)),
                    source=source if configured else "default chain",
                )
            )
    for name, indexes in settings.chain.profiles.items():
        path = f"chain.profiles.{name}"
        rows.append(
            Row(
                path=path,
                variable=loaded.names.get(path, chain_profile_variable(name)),
                value=",".join(str(i) for i in indexes),
                source=loaded.sources.get(path, DEFAULT),
            )
        )
    return rows


@click.command(
    epilog="""\b
Examples:
  rerankq config                          # every setting, its value and where it came from
  rerankq config --changed                # only what the environment or the file set
  rerankq config --json | jq '.settings[] | select(.source == "environment")'
"""
)
@click.option("--changed", is_flag=True, help="only the settings not at their default")
@json_option()
def config(changed: bool, as_json: bool) -> int:
    """The effective settings: each variable, its value (secrets masked) and where it came from:
    default, environment, or file (RERANKQ_CONFIG_FILE). An unknown RERANKQ_* name, or a bad
    value, fails here as it would fail a worker's start."""
    from kernel.settings import read_settings
    from worker.scoring.calibration import Calibrations

    loaded = read_settings()
    # The calibration files as a worker's start reads them: one it would refuse fails here first.
    Calibrations.from_settings(loaded.settings)
    rows = effective_rows(loaded)
    if changed:
        rows = [row for row in rows if not row.source.startswith("default")]
    if as_json:
        print_json({"file": loaded.file, "settings": rows})
        return 0
    from rich.table import Table

    table = Table(title=f"settings (file: {loaded.file})" if loaded.file else "settings", title_justify="left")
    for column in ("variable", "value", "source", "path"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(row.variable, "unset" if row.value is None else str(row.value), row.source, row.path)
    console().print(table)
    return 0
