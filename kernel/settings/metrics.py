"""A worker's monitoring endpoint: /metrics, /healthz and /readyz."""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec

from kernel.settings.types import Port, doc


class MetricsSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    prefix: ClassVar[str] = "METRICS_"

    port: Annotated[Port | None, doc("a worker serves /metrics, /healthz, /readyz on this port (unset: off)")] = None
    # Loopback unless said otherwise: a container sets 0.0.0.0 so Prometheus reaches it.
    host: Annotated[str, doc("address the worker's metrics port listens on")] = "127.0.0.1"
    # One folder per worker; its pool processes share it (prometheus-client multiprocess mode).
    dir: Annotated[
        str | None,
        doc("where a worker keeps its pool processes' metric files (default: the system's temporary folder)"),
    ] = None
