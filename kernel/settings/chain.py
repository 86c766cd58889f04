"""The provider chain: its members, named subsets of them, the checks on their answers, the pair cache."""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec

from kernel.settings.default_chain import default_members
from kernel.settings.members import MemberSettings
from kernel.settings.types import NonNegativeFloat, PositiveInt, Seconds, WholeSeconds, doc


class ChainSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    prefix: ClassVar[str] = ""
    #: Fields read from a family of variables rather than one each (the loader reads them).
    families: ClassVar[tuple[str, ...]] = ("members", "profiles", "calibration_profiles")

    #: Configured members in order (RERANKQ_RERANKER_*, RERANKQ_RERANKER_<n>_*); empty: the default chain.
    members: list[MemberSettings] = []
    #: Named subsets a stream may ask for (StreamSpec.chain): RERANKQ_CHAIN_<NAME>="0,2" -> {"name": [0, 2]}.
    profiles: dict[str, list[int]] = {}
    # An answer whose scores span less than flat_range across at least flat_min_window
    # documents is a broken model, not a judgement.
    flat_min_window: Annotated[
        PositiveInt, doc("scores flat across a window of at least this many documents are refused")
    ] = 8
    flat_range: Annotated[NonNegativeFloat, doc("scores whose range is under this are flat")] = 1e-6
    member_restart_s: Annotated[
        Seconds, doc("a member that failed to start (a missing model) is tried again after this long")
    ] = 30.0
    pair_cache: Annotated[
        bool, doc("keep each (member, query, document) score in Redis, so a repeat is not paid for twice")
    ] = True
    # Where a stream has a tenant its pair scores are that tenant's own: a hit would tell one
    # tenant what another sent. A member with send_tenant stays per tenant either way.
    pair_cache_shared_across_tenants: Annotated[
        bool, doc("share cached pair scores across tenants (one fleet, one trust domain)")
    ] = False
    cache_ttl_s: Annotated[WholeSeconds, doc("how long a cached pair score is kept")] = 86400

    # Written by rerankq calibrate: per-member maps from score to P(relevant).
    calibration: Annotated[
        str | None,
        doc(
            "a calibration file (rerankq calibrate writes one): each member's "
            "scores mapped to the probability of relevance"
        ),
    ] = None
    #: A chain profile's own calibration file: RERANKQ_CALIBRATION_<PROFILE>=path -> {"profile": path}.
    calibration_profiles: dict[str, str] = {}

    def effective_members(self) -> list[MemberSettings]:
        """The members a worker runs: the configured ones, else the default chain."""
        return list(self.members) if self.members else default_members()
