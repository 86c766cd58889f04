"""Queues and delivery: the device queues, and how long a window may take before it is sent again."""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec

from kernel.settings.types import Name, PositiveInt, Seconds, WholeSeconds, doc


class QueueSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    prefix: ClassVar[str] = ""

    cpu_queue: Annotated[Name, doc("the CPU workers' queue")] = "rerankq.cpu"
    gpu_queue: Annotated[Name, doc("the GPU workers' queue")] = "rerankq.gpu"
    any_queue: Annotated[Name, doc("the queue every worker also serves (a stream's device=any)")] = "rerankq.any"
    max_attempts: Annotated[PositiveInt, doc("deliveries of one window before it commits as failed")] = 3
    redeliver_after_s: Annotated[
        WholeSeconds, doc("an admitted window not committed by then is sent again (its lease and time limit)")
    ] = 300
    visibility_timeout_s: Annotated[
        WholeSeconds, doc("Redis broker only: Celery's visibility timeout; must exceed RERANKQ_REDELIVER_AFTER_S")
    ] = 3600
    # Asked per consumer where the server allows it (3.11.15+), else the server's own
    # consumer_timeout as the operator set it (RabbitMQ's default is 30 minutes).
    amqp_consumer_timeout_s: Annotated[
        WholeSeconds,
        doc("RabbitMQ broker only: the delivery acknowledgement timeout; must exceed RERANKQ_REDELIVER_AFTER_S"),
    ] = 1800
    queued_max_age_s: Annotated[
        WholeSeconds,
        doc(
            "RabbitMQ broker only: how long the sweep trusts that a "
            "window's message is still queued before it sends it "
            "again"
        ),
    ] = 3600
    sweep_interval_s: Annotated[
        Seconds, doc("how often the workers' sweep re-sends overdue windows (one worker at a time)")
    ] = 30.0

    def queue_for(self, device: str) -> str:
        return {"cpu": self.cpu_queue, "gpu": self.gpu_queue, "any": self.any_queue}[device]

    def all_queues(self) -> list[str]:
        return [self.cpu_queue, self.gpu_queue, self.any_queue]
