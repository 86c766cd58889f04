"""The worker's door: every message it takes from the queue is checked before Celery acts on it.

A queue is an input like any other; anyone who can write to it can write anything. Celery
trusts what it reads: a body that is not ``[args, kwargs, embed]`` raises in its consumer
("Unrecoverable error") and the worker exits with the message unacknowledged, so the next
start takes it again and dies again; an envelope kombu cannot parse does the same; a message
naming one of Celery's built-in tasks runs it; one with an ETA is held in memory until then.

Here a message is run only if it is what rerankq sends: the task ``rerankq.score_window``, no
ETA, JSON ``[[stream_id, window], {}, {no callbacks, chain or chord}]``. Anything else is
refused: rejected without requeue (the Redis broker drops it; RabbitMQ dead-letters it to
``<queue>.dead``), logged at WARNING and counted on ``rerankq_task_messages_refused_total``
by ``reason`` (``envelope``, ``headers``, ``task``, ``eta``, ``content``, ``body``); the worker
goes on serving. What the two arguments name (a real stream, a window in range) the task
checks, refusing the same way (``arguments``).

Two layers, because the Redis transport parses each list entry before Celery sees it:

- ``Consumer``: Celery's consumer with the task-message check in front of its handler
  (both brokers; ``worker_consumer``);
- ``RedisTransport`` / ``SentinelTransport``: ``producer.redis_transport``'s, whose channel
  drops a list entry that is not JSON or not a kombu envelope (``broker_transport``).
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Callable
from queue import Empty
from typing import Any

import kombu.transport as kombu_transport
import msgspec
import structlog
from celery.worker.consumer import Consumer as CeleryConsumer
from kombu.exceptions import ContentDisallowed
from kombu.transport import virtual
from vine import promise

from producer import redis_transport
from producer.celery_config import TASK_NAME

log = structlog.get_logger("rerankq.door")

#: The task names a worker runs; every other name is refused.
RERANKQ_TASKS = frozenset({TASK_NAME})
REASONS = ("envelope", "headers", "task", "eta", "content", "body", "arguments")
REDIS_TRANSPORT = "worker.message_door:RedisTransport"
SENTINEL_TRANSPORT = "worker.message_door:SentinelTransport"


# -- what a task message must be -------------------------------------------------------------


class TaskHeaders(msgspec.Struct):
    """The protocol-2 headers Celery's consumer reads before the task runs (others pass)."""

    task: str
    id: str
    eta: str | None = None
    expires: str | None = None
    timelimit: tuple[float | None, float | None] | None = None
    retries: int = 0
    shadow: str | None = None


class Embed(msgspec.Struct):
    """What Celery would run after, or around, the task: rerankq sends none of it."""

    callbacks: None = None
    errbacks: None = None
    chain: None = None
    chord: None = None


class TaskBody(msgspec.Struct, array_like=True):
    """``[[stream_id, window], {}, embed]``: what ``producer.dispatch`` sends. What the two
    arguments name the task checks (``arguments`` when they name no window)."""

    args: tuple[Any, Any]
    kwargs: dict[str, Any]
    embed: Embed | None


class Refused(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def check_task_message(message: Any) -> None:
    """Raise ``Refused`` unless ``message`` (a kombu message) is a rerankq task message."""
    raw_headers = message.headers
    try:
        headers = msgspec.convert(raw_headers, TaskHeaders)
    except msgspec.ValidationError as exc:
        raise Refused("headers", str(exc)) from None
    if headers.task not in RERANKQ_TASKS:
        raise Refused("task", f"not a rerankq task: {headers.task[:100]!r}")
    if headers.eta is not None:
        # A window is due now; a message for later would be held in memory, not acked,
        # and handed back at every shutdown until then.
        raise Refused("eta", f"a message due later ({headers.eta[:40]!r}); rerankq sends none")
    try:
        decoded = message.decode()
    except ContentDisallowed as exc:
        raise Refused("content", str(exc)[:200]) from None
    except Exception as exc:  # noqa: BLE001 - any body kombu cannot decode is a bad body
        raise Refused("body", f"undecodable: {type(exc).__name__}") from None
    try:
        body = msgspec.convert(decoded, TaskBody)
    except msgspec.ValidationError as exc:
        raise Refused("body", f"not [[stream_id, window], {{}}, embed]: {exc}") from None
    if body.kwargs:
        raise Refused("body", "keyword arguments; rerankq sends none")


def _describe(message: Any) -> dict[str, str]:
    headers = message.headers if isinstance(getattr(message, "headers", None), dict) else {}
    return {"task": repr(headers.get("task"))[:100], "message_id": repr(headers.get("id"))[:100]}


# -- the consumer --------------------------------------------------------------------------


class Consumer(CeleryConsumer):
    """Celery's consumer; a task message reaches Celery's handler only once it is checked."""

    def create_task_handler(self, promise: Any = promise) -> Callable[[Any], Any]:
        handle = super().create_task_handler(promise)
        refuse = self.refuse_message

        def on_task_received(message: Any) -> Any:
            try:
                check_task_message(message)
            except Refused as refusal:
                return refuse(message, refusal)
            return handle(message)

        return on_task_received

    def refuse_message(self, message: Any, refusal: Refused) -> None:
        log.warning(
            "task_message_refused",
            reason=refusal.reason,
            detail=refusal.detail[:300],
            queue=str((message.delivery_info or {}).get("routing_key"))[:200],
            **_describe(message),
        )
        if not message.acknowledged:
            message.reject_log_error(log, self.connection_errors, requeue=False)
        self.count_refusal(refusal.reason)

    def count_refusal(self, reason: str) -> None:
        recorder = getattr(self.app, "rerankq_recorder", None)
        if recorder is not None:
            recorder.message_refused(reason)

    def connect(self) -> Any:
        connection = super().connect()
        transport = connection.transport
        if isinstance(transport, _GuardedTransport):
            transport.count_refusal = self.count_refusal
        return connection


# -- the Redis transport ---------------------------------------------------------------------


class DeliveryInfo(msgspec.Struct):
    exchange: str
    routing_key: str


class EnvelopeProperties(msgspec.Struct):
    delivery_tag: str
    delivery_info: DeliveryInfo
    body_encoding: str | None = None


class Envelope(msgspec.Struct):
    """kombu's Redis envelope, as far as the transport and its ack emulation read it."""

    properties: EnvelopeProperties
    body: str = ""
    headers: dict[str, Any] | None = None
    content_type: str | None = msgspec.field(default=None, name="content-type")
    content_encoding: str | None = msgspec.field(default=None, name="content-encoding")


class UnreadableEnvelope(Exception):
    pass


class GuardedMessage(virtual.Message):
    """kombu's message, refusing an envelope it would choke on (or choke the ack emulation)."""

    def __init__(self, payload: Any, channel: Any = None, **kwargs: Any) -> None:
        try:
            msgspec.convert(payload, Envelope)
            super().__init__(payload, channel=channel, **kwargs)
        except binascii.Error as exc:
            raise UnreadableEnvelope(f"a body that is not base64: {str(exc)[:200]}") from None
        except (msgspec.ValidationError, ValueError, TypeError, KeyError) as exc:
            raise UnreadableEnvelope(f"{type(exc).__name__}: {str(exc)[:200]}") from None


class _GuardedChannel:
    Message = GuardedMessage

    def _drop_entry(self, detail: str) -> None:
        # BRPOP/RPOP already took the entry off the list and nothing recorded it as unacked:
        # dropping it is not acting on it.
        log.warning("task_message_refused", reason="envelope", detail=detail)
        self.connection.count_refusal("envelope")  # type: ignore[attr-defined]

    def _brpop_read(self, **options: Any) -> Any:
        try:
            return super()._brpop_read(**options)  # type: ignore[misc]
        except UnreadableEnvelope as exc:
            self._drop_entry(str(exc))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            self._drop_entry(f"a list entry that is not JSON: {type(exc).__name__}")
        return True

    def _get(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return super()._get(queue, *args, **kwargs)  # type: ignore[misc]
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            self._drop_entry(f"a list entry that is not JSON: {type(exc).__name__}")
            raise Empty() from None


class _GuardedTransport:
    #: Replaced by the worker's consumer once it connects, so drops are counted.
    count_refusal: Callable[[str], None] = staticmethod(lambda reason: None)  # type: ignore[assignment]


class RedisChannel(_GuardedChannel, redis_transport.Channel):
    pass


class RedisTransport(_GuardedTransport, redis_transport.Transport):
    Channel = RedisChannel


class SentinelChannel(_GuardedChannel, redis_transport.SentinelChannel):
    pass


class SentinelTransport(_GuardedTransport, redis_transport.SentinelTransport):
    Channel = SentinelChannel


def guarded_transport(transport: str | None) -> str | None:
    """The guarded flavour of one of ``producer.redis_transport``'s transports (others as they are)."""
    return {redis_transport.TRANSPORT: REDIS_TRANSPORT, redis_transport.SENTINEL_TRANSPORT: SENTINEL_TRANSPORT}.get(
        transport or "", transport
    )


def guard_sentinel_failover() -> None:
    """kombu takes the next ``sentinel://`` URL's transport from this alias (see
    ``producer.redis_transport``): a worker keeps its guard across a failover too."""
    kombu_transport.TRANSPORT_ALIASES["sentinel"] = SENTINEL_TRANSPORT
