"""The kombu internals rerankq overrides are still there, shaped as they were written against.

``kernel.kombu_private`` holds every override of a private name of kombu's (and every call
of one) and lists them in ``PRIVATE_NAMES`` with the signature each was written against. An
upgrade that renames one would leave the override silently unused (the guard it carries,
gone: an unreadable entry that stops the worker, a client made per message); one that
reshapes it would fail at the first message. Here either fails at once, naming the version.
"""

from __future__ import annotations

import inspect

import kombu.transport
import pytest

from kernel import kombu_private
from kernel.kombu_private import PRIVATE_NAMES, kombu_version


@pytest.mark.parametrize(
    ("owner", "name", "written_against"),
    PRIVATE_NAMES,
    ids=[f"{owner.__name__}.{name}" for owner, name, _ in PRIVATE_NAMES],
)
def test_every_private_name_overridden_is_still_kombus(owner: type, name: str, written_against: str) -> None:
    where = f"kombu {kombu_version()}: {owner.__module__}.{owner.__qualname__}.{name}"
    # Looked up on kombu's own class hierarchy: an override of ours must not answer for it.
    found = next((vars(k)[name] for k in owner.__mro__ if name in vars(k)), None)
    assert found is not None, f"{where} is gone; kernel/kombu_private.py overrides it (see its comment)"
    assert callable(found), f"{where} is no longer a method"
    assert str(inspect.signature(found)) == written_against, (
        f"{where} is now {inspect.signature(found)}; kernel/kombu_private.py was written against {written_against}"
    )


def test_every_override_in_the_module_is_listed() -> None:
    """An override added to ``kernel.kombu_private`` without its row would go unchecked."""
    listed = {name for _, name, _ in PRIVATE_NAMES}
    overridden = {
        name
        for _, cls in inspect.getmembers(kombu_private, inspect.isclass)
        if cls.__module__ == kombu_private.__name__
        for name in vars(cls)
        if name.startswith("_") and not name.startswith("__") and callable(vars(cls)[name])
    }
    assert overridden <= listed, f"not in PRIVATE_NAMES: {sorted(overridden - listed)}"


def test_the_sentinel_scheme_names_rerankqs_transport() -> None:
    """kombu's failover to the next ``sentinel://`` URL reads its transport from this table."""
    from kernel import redis_transport

    aliases = getattr(kombu.transport, "TRANSPORT_ALIASES", None)
    assert isinstance(aliases, dict), f"kombu {kombu_version()} has no kombu.transport.TRANSPORT_ALIASES table"
    assert aliases.get("sentinel") in (redis_transport.SENTINEL_TRANSPORT, "worker.envelope:SentinelTransport"), (
        f"kombu {kombu_version()}: sentinel:// names {aliases.get('sentinel')!r}"
    )
    resolved = kombu.transport.resolve_transport("sentinel")
    assert resolved.__module__ in ("kernel.redis_transport", "worker.envelope"), (
        f"kombu {kombu_version()} resolves sentinel:// to {resolved!r}"
    )
