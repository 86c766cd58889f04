"""The hostile queue messages the probes inject, each built from a real message rerankq sent.

``hostile_messages`` are task messages either broker carries (headers, body, content type and
encoding, compression); ``hostile_envelopes`` are Redis list entries whose kombu envelope
itself is hostile; ``hostile_amqp_messages`` are AMQP messages the Redis envelope has no
counterpart for. Each is named for what it is, as the probe prints it.
"""

from __future__ import annotations

import base64
import bz2
import functools
import json
from dataclasses import dataclass, field, replace
from typing import Any

from kernel.celery_config import TASK_NAME

FAR_FUTURE = "2999-01-01T00:00:00+00:00"
NO_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
JSON = "application/json"
UTF8 = "utf-8"
#: What the decompression bomb opens to: kombu decompressed the whole of it, in the consumer.
BOMB_BYTES = 256 * 2**20
#: Over the worker's bound on a list entry or body (64 KiB).
OVERSIZED_BYTES = 2**20


#: Refused by the task, not the door (only the store knows how many windows a stream has):
#: logged and counted the same, but acknowledged, so RabbitMQ does not dead-letter it.
ACKED_REFUSALS = frozenset({"arguments-window-out-of-range"})


@dataclass(frozen=True)
class TaskMessage:
    """What a broker carries for one task: its headers, its body's bytes, content type and
    encoding, and (on RabbitMQ) its other AMQP properties (``correlation_id``, ``priority``, ...)."""

    headers: dict[str, Any]
    body: bytes
    content_type: str = JSON
    content_encoding: str = UTF8
    properties: dict[str, Any] = field(default_factory=dict)

    def with_body(self, body: Any) -> TaskMessage:
        return replace(self, body=json.dumps(body).encode())

    def with_headers(self, body: Any | None = None, **headers: Any) -> TaskMessage:
        message = replace(self, headers={**self.headers, **headers})
        return message if body is None else message.with_body(body)

    def args(self) -> list[Any]:
        return json.loads(self.body)[0]


@functools.cache
def bz2_bomb() -> bytes:
    """About 200 bytes of bz2 that decompress to ``BOMB_BYTES`` of zeros (built once, ~2 s)."""
    compressor = bz2.BZ2Compressor(9)
    zeros = b"\0" * 2**20
    return b"".join(compressor.compress(zeros) for _ in range(BOMB_BYTES // 2**20)) + compressor.flush()


def body_cases(template: TaskMessage, args: list[Any]) -> list[tuple[str, TaskMessage]]:
    """Bodies that are not a task's (args, kwargs, embed) triple, or one with what rerankq never sends."""
    return [
        ("body-object", template.with_body({"a": 1})),
        ("body-pair", template.with_body([1, 2])),
        ("body-args-kwargs", template.with_body([args, {}])),
        ("body-string", template.with_body("hello")),
        ("body-null", template.with_body(None)),
        ("body-args-not-a-list", template.with_body([{"stream_id": 1}, {}, NO_EMBED])),
        ("body-embed-not-a-map", template.with_body([args, {}, [1]])),
        ("body-three-args", template.with_body([[*args, 1], {}, NO_EMBED])),
        # msgspec's array_like struct ignored the trailing element; Celery's unpacking did not.
        ("body-extra-elements", template.with_body([args, {}, {}, 1])),
        ("body-embed-unknown-key", template.with_body([args, {}, {**NO_EMBED, "group_id": "g"}])),
        (
            "body-callback",
            template.with_body(
                [
                    args,
                    {},
                    {**NO_EMBED, "callbacks": [{"task": "celery.accumulate", "args": [], "kwargs": {}, "options": {}}]},
                ]
            ),
        ),
        ("body-invalid-json", replace(template, body=b"{not json")),
    ]


def content_cases(template: TaskMessage) -> list[tuple[str, TaskMessage]]:
    """Content types, encodings and compressions rerankq never sends."""
    return [
        ("content-python-serialize", replace(template, content_type="application/x-python-serialize")),
        ("content-encoding-latin-1", replace(template, content_encoding="latin-1")),
        ("content-encoding-unknown", replace(template, content_encoding="rot13")),
        # kombu decompressed in Message.__init__, before any check: 2 GB of RSS for a 2 KB message.
        ("compression-bz2-bomb", replace(template, body=bz2_bomb()).with_headers(compression="application/x-bz2")),
        ("compression-unknown", template.with_headers(compression="application/x-bogus")),
    ]


def header_cases(template: TaskMessage) -> list[tuple[str, TaskMessage]]:
    """Celery's headers with values of the wrong type or shape, or that a rerankq task must not honour."""
    return [
        ("headers-timelimit", template.with_headers(timelimit=[1])),
        ("headers-timelimit-hostile", template.with_headers(timelimit=[0.1, 0.05])),
        ("headers-no-id", template.with_headers(id=None)),
        ("headers-id-with-newline", template.with_headers(id="x\n[critical] forged log line")),
        # Celery's Request.revoked() iterated it: TypeError, "Unrecoverable error", a crash loop.
        ("headers-stamped-headers-int", template.with_headers(stamped_headers=5)),
        ("headers-stamped-headers-named", template.with_headers(stamped_headers=["x"], stamps={"x": "y"})),
        ("headers-stamps-list", template.with_headers(stamps=[1])),
        ("headers-group-map", template.with_headers(group={"a": 1})),
        ("headers-group-index-string", template.with_headers(group_index="1")),
        ("headers-parent-id-list", template.with_headers(parent_id=[1])),
        ("headers-root-id-int", template.with_headers(root_id=5)),
        ("headers-origin-map", template.with_headers(origin={"a": 1})),
        ("headers-ignore-result-string", template.with_headers(ignore_result="yes")),
        ("headers-replaced-task-nesting-string", template.with_headers(replaced_task_nesting="x")),
        ("headers-argsrepr-huge", template.with_headers(argsrepr="x" * 20_000)),
        ("headers-kwargsrepr-list", template.with_headers(kwargsrepr=[1])),
        ("headers-lang", template.with_headers(lang="js")),
        ("headers-retries-string", template.with_headers(retries="3")),
        ("headers-retries-negative", template.with_headers(retries=-1)),
        ("headers-shadow", template.with_headers(shadow="celery.accumulate")),
        ("headers-unknown", template.with_headers(reply_to_task="celery.accumulate")),
        ("headers-sent-at-string", template.with_headers(rerankq_sent_at="now")),
        # Celery's consumer raised on a date it could not parse (an ERROR traceback).
        ("headers-expires-garbage", template.with_headers(expires="garbage")),
        ("headers-expires-past", template.with_headers(expires="2000-01-01T00:00:00+00:00")),
    ]


def task_cases(template: TaskMessage, args: list[Any]) -> list[tuple[str, TaskMessage]]:
    """Messages naming another task than rerankq's, or due in the far future."""
    return [
        ("task-celery.accumulate", template.with_headers([[1, 2], {}, NO_EMBED], task="celery.accumulate")),
        ("task-celery.backend_cleanup", template.with_headers([[], {}, NO_EMBED], task="celery.backend_cleanup")),
        (
            "task-celery.map",
            template.with_headers(
                [[{"task": TASK_NAME, "args": [], "kwargs": {}, "options": {}}, [args]], {}, NO_EMBED],
                task="celery.map",
            ),
        ),
        ("task-celery.chord_unlock", template.with_headers([["g"], {}, NO_EMBED], task="celery.chord_unlock")),
        ("task-unknown", template.with_headers(task="not.a.task")),
        ("eta-far-future", template.with_headers(eta=FAR_FUTURE)),
    ]


def argument_cases(template: TaskMessage, args: list[Any]) -> list[tuple[str, TaskMessage]]:
    """rerankq's own task with (stream id, window) arguments that are not one."""
    return [
        # The task refused these with a Reject traceback each, and counted none of them.
        ("arguments-window-true", template.with_body([[args[0], True], {}, NO_EMBED])),
        ("arguments-window-string", template.with_body([[args[0], "0"], {}, NO_EMBED])),
        ("arguments-window-negative", template.with_body([[args[0], -1], {}, NO_EMBED])),
        ("arguments-window-out-of-range", template.with_body([[args[0], 999], {}, NO_EMBED])),
        ("arguments-bad-stream-id", template.with_body([["s_x}:results", 0], {}, NO_EMBED])),
    ]


def hostile_messages(template: TaskMessage) -> list[tuple[str, TaskMessage]]:
    """(name, message) for each hostile task message, built from a real one; for either broker."""
    args = template.args()
    return [
        *body_cases(template, args),
        *content_cases(template),
        *header_cases(template),
        *task_cases(template, args),
        *argument_cases(template, args),
    ]


def redis_entry(envelope: dict[str, Any], message: TaskMessage) -> bytes:
    """A Redis list entry: kombu's envelope ``envelope`` carrying ``message``."""
    return json.dumps(
        {
            **envelope,
            "headers": message.headers,
            "content-type": message.content_type,
            "content-encoding": message.content_encoding,
            "body": base64.b64encode(message.body).decode(),
        }
    ).encode()


def hostile_envelopes(real: dict[str, Any]) -> list[tuple[str, bytes]]:
    """(name, Redis list entry) where the envelope itself is hostile (Redis only); ``real`` is a
    real list entry, decoded."""
    properties = real.get("properties", {})
    return [
        ("envelope-invalid-base64", json.dumps({**real, "body": "@@@@x"}).encode()),
        ("envelope-list", json.dumps([real, "x", "y"]).encode()),
        ("envelope-no-properties", json.dumps({k: v for k, v in real.items() if k != "properties"}).encode()),
        ("envelope-headers-list", json.dumps({**real, "headers": [1, 2]}).encode()),
        (
            "envelope-delivery-info-list",
            json.dumps({**real, "properties": {**properties, "delivery_info": [1]}}).encode(),
        ),
        # kombu's decode_body raised AttributeError for a codec it has not: the worker exited.
        (
            "envelope-body-encoding-unknown",
            json.dumps({**real, "properties": {**properties, "body_encoding": "rot13"}}).encode(),
        ),
        (
            "envelope-body-encoding-missing",
            json.dumps({**real, "properties": {k: v for k, v in properties.items() if k != "body_encoding"}}).encode(),
        ),
        ("envelope-priority-string", json.dumps({**real, "properties": {**properties, "priority": "x"}}).encode()),
        ("envelope-unknown-property", json.dumps({**real, "properties": {**properties, "x-evil": 1}}).encode()),
        ("envelope-oversized", json.dumps({**real, "body": "A" * OVERSIZED_BYTES}).encode()),
        # JSON may escape a lone surrogate, which no UTF-8 encodes: kombu's ack emulation wrote
        # the message to its unacked hash, redis-py could not encode it, and the worker exited
        # (found by ops.probe.envelope_fuzz).
        (
            "envelope-delivery-tag-lone-surrogate",
            json.dumps({**real, "properties": {**properties, "delivery_tag": "\udcff"}}).encode(),
        ),
        (
            "envelope-header-lone-surrogate",
            json.dumps({**real, "headers": {**real.get("headers", {}), "argsrepr": "\ud800"}}).encode(),
        ),
        ("raw-not-json", b"not json at all \xff"),
    ]


def hostile_amqp_messages(template: TaskMessage) -> list[tuple[str, TaskMessage]]:
    """(name, message) only an AMQP broker carries as such: a body over the worker's bound, and
    text that is not UTF-8 where py-amqp decodes it (its frame reader raised out of the consumer
    loop: the worker exited, and died again on the redelivery)."""
    not_utf8 = b"\xff\xfe not utf-8"
    return [
        ("amqp-oversized-body", replace(template, body=b" " * OVERSIZED_BYTES + template.body)),
        ("amqp-content-type-not-utf8", replace(template, content_type=not_utf8)),  # type: ignore[arg-type]
        ("amqp-content-encoding-not-utf8", replace(template, content_encoding=not_utf8)),  # type: ignore[arg-type]
        ("amqp-header-not-utf8", template.with_headers(argsrepr=not_utf8)),
        ("amqp-foreign-header-not-utf8", template.with_headers(x_note=not_utf8)),
    ]
