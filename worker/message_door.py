"""The worker's door: every message it takes from the broker is checked before Celery acts on it.

A queue is an input like any other; anyone who can write to it can write anything. Celery
trusts what it reads: a header of the wrong type, a body that is not ``[args, kwargs, embed]``
or an envelope kombu cannot open raises in its consumer ("Unrecoverable error") and the worker
exits with the message unacknowledged, so the next start takes it again and dies again (both
brokers hand an unacknowledged message back); a message naming one of Celery's built-in tasks
runs it; one with an ETA is held in memory until then; a remote-control broadcast can stop or
stall every worker.

Here a message is acted on only if it is what rerankq sends, checked in three layers, each
before the next one reads it:

- the transport (``worker.envelope``): the envelope, before kombu decodes or decompresses a
  body (``broker_transport``: Redis, Sentinel and RabbitMQ alike);
- this consumer (``worker_consumer``): a task message's headers, body and arguments
  (``worker.task_message``), before Celery's strategy reads any of them;
- remote control (``worker.control_door``): only the read-only commands rerankq's tools use.

Anything else is refused: rejected without requeue (the Redis broker drops it; RabbitMQ
dead-letters it to ``<queue>.dead``), logged once at WARNING and counted once on
``rerankq_task_messages_refused_total`` by ``reason`` (``worker.refusal.REASONS``), and never
begun, so it costs no window an attempt; the worker goes on serving. Whatever the check of one
message raises is a refusal too: no exception of a message's making reaches the consumer loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer
from vine import promise

from worker.envelope import GuardedTransport
from worker.refusal import DETAIL_CHARS, Refused, log, log_refusal, quoted
from worker.task_message import check_task_message

CELERY_CONTROL_STEP = "celery.worker.consumer.control:Control"
CONTROL_STEP = "worker.control_door:Control"
#: The window count a worker checks arguments against when it has no settings (a bare app).
DEFAULT_MAX_CANDIDATES = 10_000


def _describe(message: Any) -> dict[str, str]:
    headers = getattr(message, "headers", None)
    headers = headers if isinstance(headers, dict) else {}
    info = getattr(message, "delivery_info", None)
    queue = info.get("routing_key") if isinstance(info, dict) else None
    return {
        "task": quoted(headers.get("task")),
        "message_id": quoted(headers.get("id")),
        "queue": quoted(queue, 200),
    }


class Consumer(CeleryConsumer):  # type: ignore[misc]  # Celery's, unannotated
    """Celery's consumer; a task message reaches Celery's handler only once it is checked."""

    class Blueprint(CeleryConsumer.Blueprint):  # type: ignore[misc]  # Celery's, unannotated
        default_steps = [
            CONTROL_STEP if step == CELERY_CONTROL_STEP else step for step in CeleryConsumer.Blueprint.default_steps
        ]

    def create_task_handler(self, promise: Any = promise) -> Callable[[Any], Any]:
        handle = super().create_task_handler(promise)
        refuse = self.refuse_message
        settings = getattr(self.app, "rerankq_settings", None)
        max_candidates = settings.streams.max_candidates if settings is not None else DEFAULT_MAX_CANDIDATES

        def on_task_received(message: Any) -> Any:
            try:
                refusal = getattr(message, "refusal", None)
                if refusal is not None:  # the transport's door refused its envelope
                    raise refusal
                check_task_message(message, max_candidates)
            except Refused as refused:
                return refuse(message, refused)
            except Exception as exc:  # noqa: BLE001 - nothing of a message's making reaches the loop
                return refuse(message, Refused("envelope", f"unreadable: {type(exc).__name__}: {str(exc)[:200]}"))
            return handle(message)

        return on_task_received

    def refuse_message(self, message: Any, refusal: Refused) -> None:
        log_refusal("task_message_refused", refusal, **_describe(message))
        if hasattr(message, "reject_log_error"):
            if not message.acknowledged:
                message.reject_log_error(log, self.connection_errors, requeue=False)
        else:
            # kombu could not build a message (an AMQP one): reject the broker's own.
            message.channel.basic_reject(message.delivery_tag, requeue=False)
        self.count_refusal(refusal.reason)

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        """kombu could not build or decode a message: a refusal like any other (Celery's own logs
        CRITICAL with a traceback and the body, and acks)."""
        self.refuse_message(
            message, Refused("envelope", f"undecodable: {type(exc).__name__}: {str(exc)[:DETAIL_CHARS]}")
        )

    def count_refusal(self, reason: str) -> None:
        recorder = getattr(self.app, "rerankq_recorder", None)
        if recorder is not None:
            recorder.message_refused(reason)

    def connect(self) -> Any:
        connection = super().connect()
        transport = connection.transport
        if isinstance(transport, GuardedTransport):
            transport.count_refusal = self.count_refusal
        return connection
