"""The transport's door: a message's envelope is checked before kombu builds a message of it.

kombu does work on a message as it builds it, before Celery or the task-message door
(``worker.task_message``) sees anything: it decodes the body by the envelope's
``body_encoding`` (an unknown one raised ``AttributeError`` out of the consumer and killed the
worker) and decompresses it by its ``compression`` header (a 2 KB message carrying a bz2 bomb
took a worker to 2 GB and stalled it a minute). rerankq sends neither: JSON bodies in UTF-8,
base64 in the Redis envelope, no compression. So before kombu's ``Message.__init__`` runs, a
message whose envelope is anything else is marked refused (``refusal``) and built with an
empty body, so nothing is decoded or decompressed; the consumer that receives it (a task
queue's, remote control's) refuses and counts it like any other refusal.

Sizes are bounded too: a rerankq message is about 1 KB, so a Redis list entry (or a pub/sub
message) over ``MAX_MESSAGE_BYTES`` is dropped before it is parsed, and an AMQP body over it is
refused before it is decoded. What a read itself may cost is the broker's to bound (Redis's
``proto-max-bulk-len``, RabbitMQ's ``max_message_size``: docs/guarantees.md).

On Redis, a list entry that cannot be an envelope at all (not JSON, no ``properties``, a
``delivery_tag`` kombu's ack emulation could not handle, a lone surrogate anywhere: JSON can
escape one, UTF-8 cannot carry it back to Redis) cannot be built into a message: it
was already taken off the list and recorded nowhere, so it is dropped and counted
(``envelope``). The transports here are ``kernel.redis_transport``'s (and kombu's pyamqp)
with these checks added; ``worker.app`` selects them for the worker only.
"""

from __future__ import annotations

import binascii
import json
import struct
from collections.abc import Callable
from typing import Annotated, Any

import amqp.basic_message
import amqp.method_framing
import amqp.serialization
import msgspec
import redis
from kombu.transport import base as kombu_base
from kombu.transport import pyamqp, virtual

from kernel import redis_transport
from kernel.kombu_private import GuardedReads, route_sentinel_scheme
from worker.refusal import Refused, log_refusal, quoted

#: The most a list entry, pub/sub message or AMQP body may be: rerankq's are about 1 KB.
MAX_MESSAGE_BYTES = 64 * 1024
CONTENT_TYPE = "application/json"
CONTENT_ENCODING = "utf-8"
#: How kombu's Redis envelope carries a body (kombu's default, what every rerankq client sends).
BODY_ENCODING = "base64"

REDIS_TRANSPORT = "worker.envelope:RedisTransport"
SENTINEL_TRANSPORT = "worker.envelope:SentinelTransport"
AMQP_TRANSPORT = "worker.envelope:AmqpTransport"


def envelope_refusal(
    headers: dict[str, Any], content_type: Any, content_encoding: Any, body_size: int
) -> Refused | None:
    """Why kombu must not open this body, or None: what kombu reads before it builds a message."""
    if body_size > MAX_MESSAGE_BYTES:
        return Refused("envelope", f"a body of {body_size} bytes; the bound is {MAX_MESSAGE_BYTES}")
    if "compression" in headers:
        return Refused("content", f"a compressed body ({quoted(headers['compression'], 60)}); rerankq sends none")
    if content_type != CONTENT_TYPE:
        return Refused("content", f"content type {quoted(content_type, 60)}; rerankq sends {CONTENT_TYPE}")
    if content_encoding != CONTENT_ENCODING:
        return Refused("content", f"content encoding {quoted(content_encoding, 60)}; rerankq sends {CONTENT_ENCODING}")
    return None


def _without_compression(headers: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in headers.items() if k != "compression"}


# -- RabbitMQ ------------------------------------------------------------------------------


#: What a content header whose properties do not decode carries instead (see ``readable_frames``).
UNREADABLE_PROPERTIES = "application/x-rerankq-unreadable-properties"
#: What a delivery's routing key, exchange or consumer tag that does not decode reads as.
UNREADABLE_TEXT = b"x-rerankq-unreadable"
_DELIVER = (60, 60)  # Basic.Deliver: consumer tag, delivery tag, redelivered, exchange, routing key


def _readable_header(buf: Any) -> Any:
    """A content header frame whose properties py-amqp can decode, else one that says they did not."""
    try:
        amqp.basic_message.Message().inbound_header(buf)
        return buf
    except Exception:  # noqa: BLE001 - any header it cannot read (bad UTF-8, a bad table) is replaced
        # Class, weight and body size stay (the body frames that follow are read as usual); the
        # properties are a content type alone (flag 0x8000), which the door below refuses.
        marker = UNREADABLE_PROPERTIES.encode()
        return bytes(buf[:12]) + struct.pack(">HB", 0x8000, len(marker)) + marker


def _readable_deliver(buf: Any) -> Any:
    """A Basic.Deliver whose text fields are UTF-8 (a publisher picks the routing key)."""
    try:
        amqp.serialization.loads("sLbss", buf, 4)
        return buf
    except UnicodeDecodeError:
        pass
    fields, offset = [], 4
    for kind in "sLbss":
        if kind == "s":
            size = buf[offset]
            text = bytes(buf[offset + 1 : offset + 1 + size])
            try:
                text.decode("utf-8")
            except UnicodeDecodeError:
                text = UNREADABLE_TEXT
            fields.append(struct.pack("B", len(text)) + text)
            offset += 1 + size
        else:
            width = 8 if kind == "L" else 1
            fields.append(bytes(buf[offset : offset + width]))
            offset += width
    return bytes(buf[:4]) + b"".join(fields) + bytes(buf[offset:])


def readable_frames(connection: Any, callback: Any, **kwargs: Any) -> Any:
    """py-amqp's frame reader, given only frames it can decode.

    py-amqp decodes a delivery's text as UTF-8 in the connection's frame reader, before kombu
    or any door: a ``content_type``, a header value or a routing key that is not UTF-8 raised
    ``UnicodeDecodeError`` out of the consumer loop, and the worker exited with the message
    unacknowledged (a crash loop; found by ``ops.probe.envelope_fuzz``). Here such a header is
    replaced by one the door refuses, and such a routing key by a marker.
    """
    on_frame = amqp.method_framing.frame_handler(connection, callback, **kwargs)

    def on_readable_frame(frame: Any) -> Any:
        frame_type, channel, buf = frame
        if frame_type == 2:
            buf = _readable_header(buf)
        elif frame_type == 1 and struct.unpack_from(">HH", buf, 0) == _DELIVER:
            buf = _readable_deliver(buf)
        return on_frame((frame_type, channel, buf))

    return on_readable_frame


class GuardedAmqpMessage(pyamqp.Message):
    """kombu's AMQP message, built with an empty body when its envelope is refused."""

    refusal: Refused | None = None

    def __init__(self, msg: Any, channel: Any = None, **kwargs: Any) -> None:
        props = msg.properties
        headers = props.get("application_headers") or {}
        refusal = (
            Refused("envelope", "AMQP properties that do not decode (text that is not UTF-8, a bad table)")
            if props.get("content_type") == UNREADABLE_PROPERTIES
            else envelope_refusal(
                headers, props.get("content_type"), props.get("content_encoding"), len(msg.body or b"")
            )
        )
        if refusal is None:
            super().__init__(msg, channel=channel, **kwargs)  # type: ignore[no-untyped-call]  # kombu's, unannotated
            return
        kombu_base.Message.__init__(
            self,
            body=b"",
            channel=channel,
            delivery_tag=msg.delivery_tag,
            content_type=props.get("content_type"),
            content_encoding=props.get("content_encoding"),
            delivery_info=msg.delivery_info,
            properties=props,
            headers=_without_compression(headers),
            **kwargs,
        )
        self.refusal = refusal


class AmqpChannel(pyamqp.Channel):
    Message = GuardedAmqpMessage


class AmqpConnection(pyamqp.Connection):
    Channel = AmqpChannel

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("frame_handler", readable_frames)
        super().__init__(*args, **kwargs)


class AmqpTransport(pyamqp.Transport):
    Connection = AmqpConnection


# -- Redis ---------------------------------------------------------------------------------


class DeliveryInfo(msgspec.Struct, forbid_unknown_fields=True):
    exchange: str
    routing_key: str
    redelivered: bool | None = None  # kombu's restore of an unacked message sets it


Priority = Annotated[int, msgspec.Meta(ge=0, le=255)]


class EnvelopeProperties(msgspec.Struct, forbid_unknown_fields=True):
    """The properties kombu's virtual transport sends and its ack emulation reads."""

    delivery_tag: str
    delivery_info: DeliveryInfo
    body_encoding: str | None = None
    priority: Priority | None = None
    delivery_mode: int | None = None
    correlation_id: str | None = None
    reply_to: str | None = None


class Envelope(msgspec.Struct, forbid_unknown_fields=True):
    """kombu's Redis envelope, as far as the transport and its ack emulation read it."""

    properties: EnvelopeProperties
    body: str = ""
    headers: dict[str, Any] | None = None
    content_type: str | None = msgspec.field(default=None, name="content-type")
    content_encoding: str | None = msgspec.field(default=None, name="content-encoding")


class UnreadableEnvelope(Exception):
    """A list entry no message can be built of: dropped (it is on no list and in no hash)."""


class GuardedMessage(virtual.Message):
    """kombu's message of a Redis envelope: an entry it would choke on (or choke its ack
    emulation on) is unreadable; one whose body it must not open is built empty and refused."""

    refusal: Refused | None = None

    def __init__(self, payload: Any, channel: Any = None, **kwargs: Any) -> None:
        try:
            # JSON may escape a lone surrogate ("\udcff"), which no UTF-8 encodes: kombu's ack
            # emulation writes the envelope back to Redis (its unacked hash) before anyone
            # checks it, and redis-py's encoding of it raised out of the consumer loop.
            json.dumps(payload, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise UnreadableEnvelope("text that is not Unicode (a lone surrogate)") from None
        try:
            envelope = msgspec.convert(payload, Envelope)
        except msgspec.ValidationError as exc:
            raise UnreadableEnvelope(f"not a kombu envelope: {str(exc)[:200]}") from None
        headers = envelope.headers or {}
        body_encoding = envelope.properties.body_encoding
        refusal = (
            Refused("envelope", f"body_encoding {quoted(body_encoding, 40)}; rerankq sends {BODY_ENCODING}")
            if body_encoding != BODY_ENCODING
            else envelope_refusal(headers, envelope.content_type, envelope.content_encoding, len(envelope.body))
        )
        if refusal is not None:
            payload = {**payload, "body": "", "headers": _without_compression(headers)}
        try:
            super().__init__(payload, channel=channel, **kwargs)  # type: ignore[no-untyped-call]  # kombu's, unannotated
        except binascii.Error as exc:
            raise UnreadableEnvelope(f"a body that is not base64: {str(exc)[:200]}") from None
        except (ValueError, TypeError, KeyError) as exc:
            raise UnreadableEnvelope(f"{type(exc).__name__}: {str(exc)[:200]}") from None
        self.refusal = refusal


class OversizedEntry(Exception):
    """A list entry or pub/sub message over ``MAX_MESSAGE_BYTES``, dropped before it is parsed."""


class BoundedRedis(redis.Redis):
    """The broker channel's client: a popped list entry over the bound is never parsed.

    Redis has already removed it from the list (BRPOP, RPOP), and kombu has not recorded it
    as unacked yet, so raising here drops it.
    """

    def parse_response(self, connection: Any, command_name: str | bytes, **options: Any) -> Any:
        reply = super().parse_response(connection, command_name, **options)  # type: ignore[no-untyped-call]  # redis-py's
        if command_name in ("BRPOP", "RPOP") and reply:
            entry = reply[1] if command_name == "BRPOP" else reply
            if isinstance(entry, (bytes, str)) and len(entry) > MAX_MESSAGE_BYTES:
                raise OversizedEntry(f"a list entry of {len(entry)} bytes; the bound is {MAX_MESSAGE_BYTES}")
        return reply


#: What a list entry or pub/sub message may fail with before it is a message: it is dropped.
UNREADABLE = (UnreadableEnvelope, OversizedEntry, json.JSONDecodeError, UnicodeDecodeError)


def _unreadable_detail(exc: Exception) -> str:
    if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)):
        return f"an entry that is not JSON: {type(exc).__name__}"
    return str(exc)


class _GuardedChannel(GuardedReads):
    Message = GuardedMessage
    unreadable = UNREADABLE
    client_class = BoundedRedis

    def drop_entry(self, exc: Exception) -> None:
        # BRPOP/RPOP/SUBSCRIBE already took the entry and nothing recorded it as unacked:
        # dropping it is not acting on it.
        log_refusal("task_message_refused", Refused("envelope", _unreadable_detail(exc)))
        self.connection.count_refusal("envelope")  # type: ignore[attr-defined]

    def check_broadcast(self, payload: Any) -> None:
        """A pub/sub message (remote control's broadcasts): bounded and parsed before kombu
        parses it, so junk is dropped and counted instead of logged with a traceback."""
        data = payload.get("data")
        if str(payload.get("type"), "utf-8", "replace").endswith("message") and isinstance(data, (bytes, str)):
            if len(data) > MAX_MESSAGE_BYTES:
                raise OversizedEntry(f"a pub/sub message of {len(data)} bytes; the bound is {MAX_MESSAGE_BYTES}")
            if data:
                json.loads(data)


class GuardedTransport:
    #: Replaced by the worker's consumer once it connects, so drops are counted.
    count_refusal: Callable[[str], None] = staticmethod(lambda reason: None)


class RedisChannel(_GuardedChannel, redis_transport.Channel):
    pass


class RedisTransport(GuardedTransport, redis_transport.Transport):
    Channel = RedisChannel


class SentinelChannel(_GuardedChannel, redis_transport.SentinelChannel):
    pass


class SentinelTransport(GuardedTransport, redis_transport.SentinelTransport):
    Channel = SentinelChannel


def guarded_transport(transport: str | None, broker_kind: str) -> str | None:
    """The guarded flavour of the transport a worker would use (kombu's pyamqp for RabbitMQ)."""
    if broker_kind == "amqp":
        return AMQP_TRANSPORT
    return {redis_transport.TRANSPORT: REDIS_TRANSPORT, redis_transport.SENTINEL_TRANSPORT: SENTINEL_TRANSPORT}.get(
        transport or "", transport
    )


def guard_sentinel_failover() -> None:
    """kombu takes the next ``sentinel://`` URL's transport from its scheme
    (``kernel.kombu_private.route_sentinel_scheme``): a worker keeps its guard across a failover too."""
    route_sentinel_scheme(SENTINEL_TRANSPORT)
