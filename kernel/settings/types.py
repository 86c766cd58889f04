"""The value types settings share, each with its limit stated in the type (``msgspec.Meta``).

A field is ``Annotated[<one of these>, doc("...")]``: the loader checks the limit, and the
generated reference (``kernel.settings.reference``) prints the description. A setting that
is the default of a stream option has the option's own type (``StreamTtl``, ``Probability``),
so a deployment cannot default to a value no caller could ask for.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from kernel.field_errors import TOKEN_PATTERN

#: What Redis, msgpack and the Lua scripts hold: a count past it would fail at its first use.
MAX_INT64 = 2**63 - 1
#: The longest a stream may be kept (the ``ttl_s`` option's ceiling and its setting's).
MAX_TTL_S = 7 * 24 * 3600
#: The longest duration a setting may state, a year: past it a timer overflows (asyncio,
#: threading, Redis's milliseconds) or "inf" means "never", which no setting says on purpose.
MAX_SECONDS = 365 * 24 * 3600
#: The shortest, a millisecond: a timeout of 1e-300 s would fail every call it bounds.
MIN_SECONDS = 0.001

PositiveInt = Annotated[int, msgspec.Meta(gt=0, le=MAX_INT64)]
#: 0 means "off" (or "use the general limit"); never negative.
CountOrOff = Annotated[int, msgspec.Meta(ge=0, le=MAX_INT64)]
NonNegativeFloat = Annotated[float, msgspec.Meta(ge=0)]
Port = Annotated[int, msgspec.Meta(ge=1, le=65535)]
#: A timeout, an interval, a grace: finite, from a millisecond to a year.
Seconds = Annotated[float, msgspec.Meta(ge=MIN_SECONDS, le=MAX_SECONDS)]
#: The same in whole seconds (TTLs, leases), as Redis and the broker take them.
WholeSeconds = Annotated[int, msgspec.Meta(ge=1, le=MAX_SECONDS)]
#: A delay in milliseconds, at most a minute.
Milliseconds = Annotated[float, msgspec.Meta(gt=0, le=60_000)]
#: How long a stream is kept: the ``ttl_s`` option's type.
StreamTtl = Annotated[int, msgspec.Meta(ge=1, le=MAX_TTL_S)]
#: A normalised score threshold: the ``min_score`` option's type.
Probability = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
#: Key namespaces and queue names: spliced into Redis keys and broker names, so a short token.
Name = Annotated[str, msgspec.Meta(pattern=TOKEN_PATTERN)]


def doc(description: str) -> msgspec.Meta:
    """A field's one-line description, as the configuration reference prints it."""
    return msgspec.Meta(description=description)
