"""The circuit breaker every worker process shares, per remote member."""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec

from kernel.settings.types import PositiveInt, Seconds, doc


class BreakerSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    prefix: ClassVar[str] = "BREAKER_"

    failures: Annotated[
        PositiveInt, doc("a remote member that fails this many times in a row is skipped, by every worker process")
    ] = 3
    cooldown_s: Annotated[
        Seconds, doc("how long an open breaker skips its member before one probe call is let through")
    ] = 30.0
