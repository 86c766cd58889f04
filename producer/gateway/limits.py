"""Bounds on what a request may bring, and backpressure from the device queues.

**Backpressure.** New work for a device is refused (429) while its queue holds more than
``RERANKQ_GATEWAY_MAX_BACKLOG`` waiting windows, rather than queueing without limit. The
depth is the queue's Redis lists (``producer.broker_queues.queue_lists``: the queue and its
priority steps), or on RabbitMQ both lane queues' message counts (``producer.amqp_broker``),
sampled every ``RERANKQ_GATEWAY_DRAIN_SAMPLE_S`` (0.5 s) by one background
task; a request compares against the latest sample, so it costs no Redis call of its own, and
a sudden burst can pass the bound by what arrives within one sample.

``Retry-After`` is the time the workers need to bring the backlog back under the bound at
the rate they have been draining it: ``ceil((depth - bound) / rate)``, at least 1 s and at
most ``RERANKQ_GATEWAY_MAX_RETRY_AFTER_S`` (also what a queue that is not draining at all
gets). The rate is measured, not configured: over a sample interval in which a queue never
ran dry, ``(depth before + windows sent - depth after) / interval`` is what the workers
took, smoothed by an exponential average. "Windows sent" are the messages this process's
dispatcher sent (``CountingDispatcher``), so windows other producers (or other gateway
processes) sent in an interval count as not drained: the estimate can only err low, and
Retry-After long; while every gateway refuses work, nothing is being sent and it is exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections import Counter
from typing import Any

from starlette.requests import Request

from producer.amqp_broker import AsyncAmqpBroker
from producer.broker_queues import queue_lists
from producer.dispatch import Dispatcher
from producer.gateway.config import Device, GatewaySettings
from producer.gateway.problems import Problem
from producer.settings import Settings
from producer.wire import Lane

#: Weight of the newest interval in the drain-rate average.
SMOOTHING = 0.3


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, refused (``too_large``) as soon as it passes ``max_bytes``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise Problem("too_large", f"the body is {int(declared)} bytes, over the limit of {max_bytes}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise Problem("too_large", f"the body is over the limit of {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


class CountingDispatcher(Dispatcher):
    """The client's dispatcher, counting the windows it sends: per queue for the drain rate,
    and per thread, so the call that opened a stream knows whether it sent its windows (it
    created the stream) or sent none (the stream was there already)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._lock = threading.Lock()
        self._per_queue: Counter[str] = Counter()
        self._thread = threading.local()

    def send(self, stream_id: str, windows: list[int], device: str, lane: Lane = "interactive") -> None:
        super().send(stream_id, windows, device, lane)
        with self._lock:
            self._per_queue[self.settings.queues.queue_for(device)] += len(windows)
        self._thread.sent = getattr(self._thread, "sent", 0) + len(windows)

    def take_thread_sent(self) -> int:
        """Windows this thread sent since it last asked."""
        sent, self._thread.sent = getattr(self._thread, "sent", 0), 0
        return sent

    def take_sent(self) -> Counter[str]:
        with self._lock:
            sent, self._per_queue = self._per_queue, Counter()
        return sent


class Backlog:
    """Queue depths per device (sampled), the drain rate each queue shows, and the 429 they lead to."""

    def __init__(
        self, broker: Any, dispatcher: CountingDispatcher, settings: Settings, gateway: GatewaySettings
    ) -> None:
        self.broker = broker
        self.dispatcher = dispatcher
        self.queues: dict[str, str] = {device: settings.queues.queue_for(device) for device in ("cpu", "gpu", "any")}
        self.bound = gateway.max_backlog
        self.max_retry_after_s = gateway.max_retry_after_s
        self.sample_s = gateway.drain_sample_s
        self._last: dict[str, tuple[float, int]] = {}
        #: windows per second each queue drained; None until an interval with work was seen.
        self.rate: dict[str, float | None] = dict.fromkeys(self.queues.values())
        self._stopped = asyncio.Event()

    def depth(self, device: str) -> int:
        last = self._last.get(self.queues[device])
        return last[1] if last else 0

    def over_bound(self, device: str) -> bool:
        return self.depth(device) > self.bound

    def check(self, device: Device) -> None:
        depth = self.depth(device)
        if depth <= self.bound:
            return
        wait = self.retry_after_s(self.queues[device], depth)
        raise Problem(
            "overloaded",
            f"too many requests: the {device} queue holds {depth} waiting windows, over the "
            f"bound of {self.bound}; retry after {wait} s",
            retry_after_s=wait,
        )

    def retry_after_s(self, queue: str, depth: int) -> int:
        rate = self.rate.get(queue)
        if not rate:
            return self.max_retry_after_s
        return max(1, min(self.max_retry_after_s, math.ceil((depth - self.bound) / rate)))

    async def read_depths(self) -> dict[str, int]:
        """Messages waiting per device queue, both lanes: Redis lists, or RabbitMQ's counts."""
        if isinstance(self.broker, AsyncAmqpBroker):
            return await self.broker.depths(list(self.queues.values()))
        pipe = self.broker.pipeline(transaction=False)
        counts = {queue: len(queue_lists(queue)) for queue in self.queues.values()}
        for queue in self.queues.values():
            for name in queue_lists(queue):
                pipe.llen(name)
        replies = await pipe.execute()
        depths, at = {}, 0
        for queue, n in counts.items():
            depths[queue] = sum(replies[at : at + n])
            at += n
        return depths

    async def sample(self) -> None:
        depths = await self.read_depths()
        now = time.monotonic()
        sent_by_queue = self.dispatcher.take_sent()
        for queue, depth in depths.items():
            last = self._last.get(queue)
            self._last[queue] = (now, depth)
            if last is None or last[1] == 0 or depth == 0 or now <= last[0]:
                continue  # an idle or emptied queue shows how much came, not how fast workers take it
            drained = max(0.0, (last[1] + sent_by_queue[queue] - depth) / (now - last[0]))
            previous = self.rate[queue]
            self.rate[queue] = drained if previous is None else (1 - SMOOTHING) * previous + SMOOTHING * drained

    async def sample_forever(self) -> None:
        """Sample every ``sample_s`` until ``stop()``. Stopping is a flag as well as a
        cancellation: redis-py (8.1) can swallow a cancel that lands while it opens a
        connection, and the gateway's shutdown, which waits for this task, would wait forever."""
        while not self._stopped.is_set():
            try:
                await self.sample()
            except Exception:  # noqa: BLE001 - a Redis blip skips a sample; /ready reports Redis itself
                pass
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), self.sample_s)

    def stop(self) -> None:
        self._stopped.set()
