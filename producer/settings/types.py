"""The value types settings share, each with its limit stated in the type (``msgspec.Meta``).

A field is ``Annotated[<one of these>, doc("...")]``: the loader checks the limit, and the
generated reference (``producer.settings.reference``) prints the description.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from producer.field_errors import TOKEN_PATTERN

PositiveInt = Annotated[int, msgspec.Meta(gt=0)]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
#: 0 means "off" (or "use the general limit"); never negative.
CountOrOff = Annotated[int, msgspec.Meta(ge=0)]
NonNegativeFloat = Annotated[float, msgspec.Meta(ge=0)]
Port = Annotated[int, msgspec.Meta(ge=1, le=65535)]
#: Key namespaces and queue names: spliced into Redis keys and broker names, so a short token.
Name = Annotated[str, msgspec.Meta(pattern=TOKEN_PATTERN)]


def doc(description: str) -> msgspec.Meta:
    """A field's one-line description, as the configuration reference prints it."""
    return msgspec.Meta(description=description)
