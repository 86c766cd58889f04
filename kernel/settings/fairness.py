"""Each tenant's share of a device queue, counted by cost, and the cost a window may have.

A tenant (a stream without one is a tenant of its own) may have this much sent to a device
queue and not yet committed, per lane; its windows past it wait in Redis and are sent as its
earlier ones commit (``kernel.fair_share``). The sizes are the fleet's: a tenant alone uses
at most its share, and another tenant's window waits behind at most each other tenant's share
(and what is running). Size the windows to the worker processes serving a queue (one fewer
leaves a process free for other tenants), and the tokens to what they score in the wait one
tenant may cost another.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec

from kernel.settings.types import doc

#: A share or a rate large enough for any fleet, small enough to stay an integer Redis counts.
_MAX = 2**40


class FairnessSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    prefix: ClassVar[str] = ""

    tenant_queued_windows: Annotated[
        Annotated[int, msgspec.Meta(ge=1, le=1_000_000)],
        doc(
            "per tenant, device queue and lane: windows sent and not yet committed; the rest wait in Redis, in "
            "order (at most the worker processes that serve the queue; one fewer leaves a process to the other "
            "tenants while one floods)"
        ),
    ] = 16
    tenant_queued_tokens: Annotated[
        Annotated[int, msgspec.Meta(ge=1, le=_MAX)],
        doc(
            "per tenant, device queue and lane: the cost (tokens, as open estimates them) of the windows sent "
            "and not yet committed; a tenant with nothing queued may always send one window (about what the "
            "queue's workers score in the wait one tenant may cost another)"
        ),
    ] = 262_144
    scoring_tokens_per_s: Annotated[
        Annotated[int, msgspec.Meta(ge=1, le=_MAX)],
        doc(
            "the cost one worker process scores per second, at the slowest; a window that would take longer "
            "than 90% of RERANKQ_REDELIVER_AFTER_S at this rate is refused at open"
        ),
    ] = 10_000
    tenant_max_waiting: Annotated[
        Annotated[int, msgspec.Meta(ge=1, le=1_000_000_000)],
        doc(
            "the gateway: a tenant with more windows than this waiting for its share of a device queue is answered 429"
        ),
    ] = 5000
    tenant_max_waiting_tokens: Annotated[
        Annotated[int, msgspec.Meta(ge=1, le=_MAX)],
        doc(
            "the gateway: a tenant whose windows waiting for its share of a device queue cost more than this "
            "is answered 429"
        ),
    ] = 16_777_216
