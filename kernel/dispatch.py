"""Sends window triggers to the device queues. Carries ids only, never data."""

from __future__ import annotations

import functools
import time
from typing import Any

from celery import Celery

from kernel.amqp_broker import ConfirmedBursts, lane_queue, transport_options
from kernel.broker_queues import LANE_PRIORITY, SENT_AT_HEADER, task_id
from kernel.celery_config import TASK_NAME, celery_config
from kernel.settings import Settings
from kernel.wire import Lane


class Dispatcher:
    def __init__(self, settings: Settings, app: Celery | None = None, *, confirm_bursts: bool = True) -> None:
        """``confirm_bursts=False`` sends through Celery's own publish on RabbitMQ, one confirm
        wait per message (what ``ops/bench/deployments.py`` compares the bursts with)."""
        self.settings = settings
        if app is None:
            app = Celery("rerankq-producer", set_as_current=False)
            app.conf.update(celery_config(settings))
        self.app = app
        self._bursts = (
            ConfirmedBursts(settings.store.broker, transport_options(settings))
            if settings.store.broker_kind == "amqp" and confirm_bursts
            else None
        )

    def send(self, stream_id: str, windows: list[int], device: str, lane: Lane = "interactive") -> None:
        """One message per window to the device's queue, in the stream's lane: a Celery priority on
        Redis, a queue of its own on RabbitMQ (``kernel.amqp_broker``)."""
        queue = self.settings.queues.queue_for(device)
        priority: int | None = LANE_PRIORITY[lane]
        if self.settings.store.broker_kind == "amqp":
            queue, priority = lane_queue(queue, lane), None
        if self._bursts is not None:
            # RabbitMQ: publish all, then wait once for their confirms.
            self._bursts.publish(
                [
                    functools.partial(self._send_one, stream_id, window, queue, priority, retry=False)
                    for window in windows
                ]
            )
            return
        for window in windows:
            self._send_one(stream_id, window, queue, priority)

    def _send_one(self, stream_id: str, window: int, queue: str, priority: int | None, **options: Any) -> None:
        # The task id names the window, so the sweep can tell a queued message from a lost one;
        # the send time lets the exporter age the oldest waiting message without a scan.
        self.app.send_task(
            TASK_NAME,
            args=[stream_id, window],
            queue=queue,
            task_id=task_id(stream_id, window),
            priority=priority,
            headers={SENT_AT_HEADER: time.time()},
            **options,
        )

    def close(self) -> None:
        if self._bursts is not None:
            self._bursts.close()
        self.app.close()
