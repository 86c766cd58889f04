"""The backlog exporter (``rerankq exporter``): queue depth per device, even with no worker."""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec

from kernel.settings.types import Port, doc


class ExporterSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    prefix: ClassVar[str] = "EXPORTER_"

    port: Annotated[Port, doc("port of the backlog exporter")] = 9808
