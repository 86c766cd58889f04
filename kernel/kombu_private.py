"""Every place rerankq reaches into kombu below its public API, in one module.

kombu's Redis transport offers no hook for what rerankq needs at three points: a client
reused per channel, a list entry or pub/sub message that cannot become a message dropped
before kombu parses it, and a ``sentinel://`` failover that keeps rerankq's transport. So
its private methods are overridden here, each with the public API that was ruled out named
beside it, and ``PRIVATE_NAMES`` lists every private name of kombu's this module overrides
or calls, with the signature it was written against: ``tests/test_private_overrides.py``
fails, naming the installed kombu version, when an upgrade renames or reshapes one.
"""

from __future__ import annotations

from queue import Empty
from typing import Any

import kombu
import kombu.transport as kombu_transport
import redis
from kombu.transport import redis as kombu_redis

#: (kombu's class, the private name, its signature as written against, kombu 5.7).
PRIVATE_NAMES: tuple[tuple[type, str, str], ...] = (
    (kombu_redis.Channel, "_create_client", "(self, asynchronous=False)"),
    (kombu_redis.Channel, "_get_client", "(self)"),
    (kombu_redis.Channel, "_brpop_read", "(self, **options)"),
    (kombu_redis.Channel, "_get", "(self, queue)"),
    (kombu_redis.Channel, "_handle_message", "(self, client, r)"),
    (kombu_redis.Channel, "_receive_one", "(self, c)"),
    (kombu_redis.QoS, "_remove_from_indices", "(self, delivery_tag, pipe=None)"),
)


def kombu_version() -> str:
    return str(kombu.__version__)


# -- the unacked bookkeeping -------------------------------------------------------------------


def remove_from_unacked(qos: kombu_redis.QoS, delivery_tag: str) -> None:
    """Remove a delivery from the unacked hash and index, raising what Redis refused.

    Public alternative ruled out: ``QoS.ack`` does this and then forgets the delivery locally
    in one call, so a refused removal (a full Redis, NOREPLICAS) would also leak the local
    entry; the caller needs the Redis step alone to catch its refusal and still forget it.
    """
    qos._remove_from_indices(delivery_tag).execute()


# -- one client per channel --------------------------------------------------------------------


class OneClientPerChannel(kombu_redis.Channel):
    _sync_client: tuple[object, object] | None = None  # (the pool it was made for, the client)

    def _create_client(self, asynchronous: bool = False) -> Any:
        """One client per channel and pool for publishes, acks and the unacked bookkeeping.

        kombu builds a new ``redis.Redis`` for each of them (its ``conn_or_acquire``), about a
        tenth of a millisecond a message in the client's own setup; the connections already come
        from the channel's pool, and a client over a pool is safe to share between threads. A new
        pool (after a reconnect) gets a new client.

        Public alternative ruled out: ``Channel.client`` is the asynchronous client (BRPOP and
        the like), not this one; ``conn_or_acquire``, which every publish and ack goes through,
        calls this method for a fresh client each time, and kombu has no setting to reuse one.
        """
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[no-untyped-call]  # kombu's, unannotated
        pool = self.pool
        cached = self._sync_client
        if cached is not None and cached[0] is pool:
            return cached[1]
        client = super()._create_client()  # type: ignore[no-untyped-call]  # kombu's, unannotated
        self._sync_client = (pool, client)
        return client


# -- reads that may not become messages --------------------------------------------------------


class GuardedReads:
    """kombu's Redis channel reads, with what cannot become a message dropped, not raised.

    A subclass (with a kombu Redis channel after it) sets ``unreadable``, ``client_class`` and
    ``drop_entry``, and may check a broadcast in ``check_broadcast``.

    Public alternative ruled out: kombu's only public say over a read is the ``Message`` class
    a channel builds (which ``worker.envelope`` also sets); an error raised while an entry is
    read or built goes up through ``drain_events`` to Celery's consumer, which logs
    "Unrecoverable error" and stops the worker. The entry is already off its list and in no
    hash, so these private read steps are where it can be dropped.
    """

    #: What a read may fail with before it is a message: the entry is dropped.
    unreadable: tuple[type[Exception], ...] = ()
    #: The client class the channel builds its clients of (in place of ``redis.Redis``).
    client_class: type[redis.Redis] = redis.Redis

    def drop_entry(self, exc: Exception) -> None:
        """An entry that could not be read, already taken off the broker: count it, log it."""
        raise NotImplementedError

    def check_broadcast(self, payload: Any) -> None:
        """A pub/sub message as kombu's ``_handle_message`` gives it; raise one of ``unreadable`` to drop it."""

    def _get_client(self) -> Any:
        # Public alternative ruled out: ``Channel.Client``, which kombu's ``Channel.__init__``
        # assigns from this method, so a class attribute of that name would be overwritten.
        client = super()._get_client()  # type: ignore[misc]
        # kombu returns a partial for a global key prefix, which rerankq never sets.
        assert client is redis.Redis, f"unexpected Redis client class {client!r}"
        return self.client_class

    def _brpop_read(self, **options: Any) -> Any:
        try:
            return super()._brpop_read(**options)  # type: ignore[misc]
        except self.unreadable as exc:
            self.drop_entry(exc)
        return True

    def _get(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return super()._get(queue, *args, **kwargs)  # type: ignore[misc]
        except self.unreadable as exc:
            self.drop_entry(exc)
            raise Empty() from None

    def _handle_message(self, client: Any, r: Any) -> Any:
        payload = super()._handle_message(client, r)  # type: ignore[misc]
        self.check_broadcast(payload)
        return payload

    def _receive_one(self, c: Any) -> Any:
        try:
            return super()._receive_one(c)  # type: ignore[misc]
        except self.unreadable as exc:
            self.drop_entry(exc)
            return True


# -- the sentinel:// scheme --------------------------------------------------------------------


def route_sentinel_scheme(transport: str) -> None:
    """Make ``sentinel://`` URLs name ``transport`` (a ``module:Class`` path).

    kombu moves to the next of the ``sentinel://h1;sentinel://h2`` URLs when one fails, and then
    takes the transport from that URL's scheme (``kombu.Connection.switch``), which would swap
    rerankq's transport for kombu's own for good: no QoS of ``kernel.redis_transport``, no
    NOREPLICAS handling, and a worker that dies of the first refusal.

    Public alternative ruled out: ``Connection(transport=...)``, which Celery's
    ``broker_transport`` sets, names the first transport only; ``switch`` re-reads the scheme
    of each failover URL through ``kombu.transport.TRANSPORT_ALIASES``, the one place to say it.
    """
    kombu_transport.TRANSPORT_ALIASES["sentinel"] = transport
