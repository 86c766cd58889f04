"""kombu's Redis transport, made to wait out a full Redis instead of dying of it.

At ``maxmemory`` (``noeviction``) Redis refuses every command queued in a MULTI. kombu's
ack emulation keeps its unacked bookkeeping with MULTI pipelines, so an ack, a reject or the
record of a delivery raises ``OutOfMemoryError``; Celery does not count that among the
connection errors it survives, logs "Unrecoverable error" and the worker exits with its
in-flight windows stranded. Here each of those steps keeps the local state right and
leaves the Redis side to recover on its own:

- a delivery that cannot be recorded in the unacked hash is still handed to the worker:
  if that worker then dies, the window's lease expires and the sweep re-sends it;
- an ack that cannot remove the unacked entry drops the message locally (so the channel's
  prefetch window is not leaked); the stale entry is restored after the visibility timeout
  as a duplicate that ``begin`` turns away, the window being committed;
- a reject-with-requeue that cannot restore the message leaves it in the unacked hash,
  restored after the visibility timeout, or re-sent by the sweep once its lease runs out;
- a periodic restore of old unacked messages that cannot run is skipped until next time.

It also reuses one Redis client per channel where kombu makes one per message. What it does
through kombu's private names lives in ``kernel.kombu_private``.

Selected for ``redis://``, ``rediss://`` brokers by ``kernel.celery_config``; the same QoS
on kombu's Sentinel channel (``SentinelTransport``) for ``redis+sentinel://`` brokers, where a
failover adds one more way to meet these errors (a demoted master answers READONLY, which
redis-py turns into a reconnect to the new master). A master run with
``min-replicas-to-write`` refuses the same steps with ``NOREPLICAS`` while its replicas are
out of sync - in a Sentinel failover, from the moment its replica is promoted until the
sentinels demote it: its connections raise ``NoReplicasError`` (dropping themselves, so the
next command asks Sentinel for the master again), and each step above treats it as it treats
a full Redis.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from redis.exceptions import OutOfMemoryError
from redis.sentinel import SentinelManagedConnection, SentinelManagedSSLConnection

from kernel.kombu_private import OneClientPerChannel, remove_from_unacked, route_sentinel_scheme
from kernel.redis_clients import NoReplicasError, refusal_reconnects

log = logging.getLogger("rerankq.broker")

#: What keeps a bookkeeping write from landing for a while; the message is handled locally.
REFUSED = (OutOfMemoryError, NoReplicasError)

TRANSPORT = "kernel.redis_transport:Transport"
SENTINEL_TRANSPORT = "kernel.redis_transport:SentinelTransport"


def _event(exc: Exception) -> str:
    return "redis_no_replicas" if isinstance(exc, NoReplicasError) else "redis_full"


class QoS(kombu_redis.QoS):
    def append(self, message: Any, delivery_tag: str) -> None:
        try:
            super().append(message, delivery_tag)  # type: ignore[no-untyped-call]  # kombu's, unannotated
        except REFUSED as exc:
            log.warning("%s: delivery %s not recorded as unacked; the sweep covers it", _event(exc), delivery_tag)
            virtual.QoS.append(self, message, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        try:
            remove_from_unacked(self, delivery_tag)
        except REFUSED as exc:
            log.warning(
                "%s: ack of %s kept locally; its unacked entry is restored later and turned away",
                _event(exc),
                delivery_tag,
            )
        virtual.QoS.ack(self, delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        try:
            super().reject(delivery_tag, requeue=requeue)  # type: ignore[no-untyped-call]  # kombu's, unannotated
        except REFUSED as exc:
            log.warning(
                "%s: reject of %s kept locally; the message stays unacked until restored", _event(exc), delivery_tag
            )
            virtual.QoS.ack(self, delivery_tag)

    def restore_visible(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().restore_visible(*args, **kwargs)  # type: ignore[no-untyped-call]  # kombu's, unannotated
        except REFUSED as exc:
            log.warning("%s: restore of old unacked messages skipped until the next period", _event(exc))
            return None


class Channel(OneClientPerChannel, kombu_redis.Channel):
    QoS = QoS
    connection_class = refusal_reconnects(redis.Connection)
    connection_class_ssl = refusal_reconnects(redis.SSLConnection)


class Transport(kombu_redis.Transport):
    Channel = Channel


class SentinelChannel(OneClientPerChannel, kombu_redis.SentinelChannel):
    QoS = QoS
    connection_class = refusal_reconnects(SentinelManagedConnection)
    # redis-py's Sentinel-over-TLS connection; kombu's annotation names its own class of the same two bases.
    connection_class_ssl = refusal_reconnects(SentinelManagedSSLConnection)  # type: ignore[assignment]


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel


# A failover to the next sentinel:// URL keeps this transport (see kernel.kombu_private).
route_sentinel_scheme(SENTINEL_TRANSPORT)
