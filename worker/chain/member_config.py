"""Whether each chain member can be configured at all, checked once before a worker starts.

A member that cannot be configured (an unknown provider, a ``tei`` member with no URL, the
hosted Cohere API with no key) would commit every window it is asked for as a failover, for
as long as the worker runs: it fails the start instead, with the variable to fix. A member
that cannot *load* (a model that is not there, a server that is down) is not checked here:
the chain logs it and tries again later (``Member``).
"""

from __future__ import annotations

from collections.abc import Mapping

from kernel.errors import ConfigError
from kernel.settings import MemberSettings, Settings, member_variable
from worker.providers import provider_class
from worker.providers.base import MemberConfigError, ProviderStartError


def check_member_config(index: int, member: MemberSettings, names: Mapping[str, str] | None = None) -> None:
    """Raise ConfigError naming member ``index``'s variable when its settings cannot work.

    ``names``: field path -> the variable it was read from (``Loaded.names``), so member 0
    given as ``RERANKQ_RERANKER_0_URL`` is named so.
    """

    def name(field: str) -> str:
        return (names or {}).get(f"chain.members[{index}].{field}") or member_variable(index, field)

    try:
        cls = provider_class(member.provider)
    except ProviderStartError as exc:
        raise ConfigError(name("provider"), exc.detail) from None
    check = getattr(cls, "check_config", None)
    if check is None:
        return
    try:
        check(member)
    except MemberConfigError as exc:
        raise ConfigError(name(exc.field), exc.message) from None


def check_member_configs(settings: Settings, names: Mapping[str, str] | None = None) -> None:
    for index, member in enumerate(settings.chain.effective_members()):
        check_member_config(index, member, names)
