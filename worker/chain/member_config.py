"""Whether each chain member can be configured at all, checked once before a worker starts.

A member that cannot be configured (an unknown provider, a ``tei`` member with no URL, the
hosted Cohere API with no key) would commit every window it is asked for as a failover, for
as long as the worker runs: it fails the start instead, with the variable to fix. A member
that cannot *load* (a model that is not there, a server that is down) is not checked here:
the chain logs it and tries again later (``Member``).
"""

from __future__ import annotations

from producer.errors import ConfigError
from producer.settings import MemberSettings, Settings, member_variable
from worker.providers import provider_class
from worker.providers.base import MemberConfigError, ProviderStartError


def check_member_config(index: int, member: MemberSettings) -> None:
    """Raise ConfigError naming member ``index``'s variable when its settings cannot work."""
    try:
        cls = provider_class(member.provider)
    except ProviderStartError as exc:
        raise ConfigError(member_variable(index, "provider"), exc.detail) from None
    check = getattr(cls, "check_config", None)
    if check is None:
        return
    try:
        check(member)
    except MemberConfigError as exc:
        raise ConfigError(member_variable(index, exc.field), exc.message) from None


def check_member_configs(settings: Settings) -> None:
    for index, member in enumerate(settings.chain.effective_members()):
        check_member_config(index, member)
