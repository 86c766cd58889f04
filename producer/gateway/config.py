"""The gateway's settings: the ``gateway`` section (``kernel.settings.gateway``), then command-line overrides."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kernel.settings import load_settings
from kernel.settings.gateway import Device, GatewaySettings
from kernel.settings.variables import variable_name

PREFIX = "RERANKQ_GATEWAY_"


def variable(field: str) -> str:
    return variable_name("gateway", field)


def load_gateway_settings(environ: Mapping[str, str] | None = None, **overrides: Any) -> GatewaySettings:
    """The gateway section; keyword overrides (the command line, by field name) win. A bad value names its variable."""
    given = {f"gateway_{name}": value for name, value in overrides.items() if value is not None}
    return load_settings(environ, **given).gateway


__all__ = ["PREFIX", "Device", "GatewaySettings", "load_gateway_settings", "variable"]
