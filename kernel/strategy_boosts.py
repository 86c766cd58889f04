"""``source:level`` strategy boosts: read once, for a setting's default and for a stream's option."""

from __future__ import annotations

from collections.abc import Mapping

from kernel.errors import ValidationError
from kernel.wire import BudgetLevel

LEVELS: tuple[BudgetLevel, ...] = ("low", "mid", "high")


def parse_strategy_boosts(
    value: str | Mapping[str, str] | None, *, field_name: str = "strategy_boosts"
) -> dict[str, BudgetLevel]:
    """``"graph:high,bm25:low"`` (or a mapping) into ``{"graph": "high", "bm25": "low"}``.

    A named level rather than a raw number: the two places it applies (before the cap,
    after scoring) work on different score scales.
    """
    if value is None or value == "":
        return {}
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif isinstance(value, str):
        pairs = []
        for item in value.split(","):
            item = item.strip()
            if not item:
                continue
            source, sep, level = item.partition(":")
            if not sep:
                raise ValidationError(field_name, f"{item!r} is not source:level")
            pairs.append((source.strip(), level.strip()))
    else:
        raise ValidationError(field_name, "must be 'source:level,...' or a mapping")
    out: dict[str, BudgetLevel] = {}
    for source, level in pairs:
        if not isinstance(source, str) or not source:
            raise ValidationError(field_name, "a source name must not be empty")
        if level not in LEVELS:
            raise ValidationError(field_name, f"level for {source!r} must be low, mid or high, got {level!r}")
        out[source] = level
    return out
