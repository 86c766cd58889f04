"""What every door of the worker says when it refuses a message: one reason, one WARNING line, one count.

The doors are the transport's (``worker.envelope``: a Redis list entry or an AMQP message before
kombu builds it), the task message's (``worker.task_message``: headers, body, arguments) and
remote control's (``worker.control_door``). Each refusal is logged once at WARNING and counted
once on ``rerankq_task_messages_refused_total{reason}``; none reaches Celery, so none ends in a
traceback, an exit or a redelivery loop.
"""

from __future__ import annotations

from typing import Any

import structlog

log = structlog.get_logger("rerankq.door")

#: Every ``reason`` label a refusal can carry (docs/guarantees.md lists what each means).
REASONS = ("envelope", "headers", "task", "eta", "content", "body", "arguments", "control")
#: How long a detail or a value quoted from a message may be in a log line.
DETAIL_CHARS = 300


class Refused(Exception):
    """A message the worker will not act on: ``reason`` is one of ``REASONS``."""

    def __init__(self, reason: str, detail: str) -> None:
        assert reason in REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def quoted(value: Any, limit: int = 100) -> str:
    """A value from a message as a log line may show it: its repr, cut to ``limit``."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def log_refusal(event: str, refusal: Refused, **fields: Any) -> None:
    log.warning(event, reason=refusal.reason, detail=refusal.detail[:DETAIL_CHARS], **fields)
