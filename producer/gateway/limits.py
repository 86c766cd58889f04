"""Bounds on what a request may bring, and backpressure from the device queues.

**Backpressure.** New work for a device is refused (429) while its queue holds more than
``RERANKQ_GATEWAY_MAX_BACKLOG`` waiting windows, rather than queueing without limit. The
depth is the queue's Redis lists (``kernel.broker_queues.queue_lists``: the queue and its
priority steps), or on RabbitMQ both lane queues' message counts (``kernel.amqp_broker``),
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

**A tenant's own backlog.** A device queue holds at most a share of each tenant
(``kernel.fair_share``); what a tenant sends past its share waits in Redis, so it fills no
queue and the depth above stays low. A tenant with more than ``RERANKQ_TENANT_MAX_WAITING``
windows, or ``RERANKQ_TENANT_MAX_WAITING_TOKENS`` of cost, waiting is answered 429 while the
other tenants are served; the counts are the ledgers', read with each sample.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections import Counter
from typing import Any, NamedTuple

from starlette.requests import Request

from kernel.amqp_broker import AsyncAmqpBroker
from kernel.broker_queues import queue_lists
from kernel.dispatch import Dispatcher
from kernel.fair_share import bucket_for
from kernel.keys import Keys
from kernel.settings import Settings
from kernel.wire import Lane
from producer.gateway.config import Device, GatewaySettings
from producer.gateway.problems import Problem

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
    """The client's dispatcher, counting the windows it sends per queue, for the drain rate."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._lock = threading.Lock()
        self._per_queue: Counter[str] = Counter()

    def send(self, stream_id: str, windows: list[int], device: str, lane: Lane = "interactive") -> None:
        super().send(stream_id, windows, device, lane)
        with self._lock:
            self._per_queue[self.settings.queues.queue_for(device)] += len(windows)

    def take_sent(self) -> Counter[str]:
        with self._lock:
            sent, self._per_queue = self._per_queue, Counter()
        return sent


class Waiting(NamedTuple):
    """A bucket's windows waiting for its share, and what they cost."""

    windows: int
    tokens: int


NOTHING_WAITING = Waiting(0, 0)


class Backlog:
    """Queue depths per device (sampled), the drain rate each queue shows, and the 429 they lead to;
    and each tenant's windows waiting for its share (``kernel.fair_share``), sampled too, so a
    tenant whose own backlog is past its bound is answered 429 while the others are served."""

    def __init__(
        self,
        broker: Any,
        dispatcher: CountingDispatcher,
        settings: Settings,
        gateway: GatewaySettings,
        store: Any = None,
    ) -> None:
        self.broker = broker
        self.store = store
        self.dispatcher = dispatcher
        self.queues: dict[str, str] = {device: settings.queues.queue_for(device) for device in ("cpu", "gpu", "any")}
        self.ledgers = {device: Keys(settings.store.namespace).fair_share(device).queued for device in self.queues}
        self.bound = gateway.max_backlog
        self.tenant_bound = settings.fairness.tenant_max_waiting
        self.tenant_bound_tokens = settings.fairness.tenant_max_waiting_tokens
        self.max_retry_after_s = gateway.max_retry_after_s
        self.sample_s = gateway.drain_sample_s
        self._last: dict[str, tuple[float, int]] = {}
        #: windows per second each queue drained; None until an interval with work was seen.
        self.rate: dict[str, float | None] = dict.fromkeys(self.queues.values())
        #: per device: each bucket's windows waiting for its share and their cost, at the last sample.
        self.waiting: dict[str, dict[str, Waiting]] = {device: {} for device in self.queues}
        self._stopped = asyncio.Event()

    def depth(self, device: str) -> int:
        last = self._last.get(self.queues[device])
        return last[1] if last else 0

    def tenant_waiting(self, device: str, tenant: str | None, lane: Lane) -> Waiting:
        """The tenant's windows waiting for its share of the device's queue, and their cost (none
        without a tenant: a stream without one is a bucket of its own)."""
        if tenant is None:
            return NOTHING_WAITING
        return self.waiting[device].get(bucket_for(tenant, lane, ""), NOTHING_WAITING)

    def tenant_excess(self, device: str, tenant: str | None, lane: Lane) -> tuple[Waiting, int]:
        """The tenant's waiting windows, and how many of them are past its bounds (in windows, or
        the part of its windows whose cost is past the bound in tokens)."""
        waiting = self.tenant_waiting(device, tenant, lane)
        excess = waiting.windows - self.tenant_bound
        if waiting.tokens > self.tenant_bound_tokens:
            excess = max(excess, math.ceil(waiting.windows * (1 - self.tenant_bound_tokens / waiting.tokens)))
        return waiting, excess

    def over_bound(self, device: str, tenant: str | None = None, lane: Lane = "interactive") -> bool:
        return self.depth(device) > self.bound or self.tenant_excess(device, tenant, lane)[1] > 0

    def check(self, device: Device, tenant: str | None = None, lane: Lane = "interactive") -> None:
        depth = self.depth(device)
        if depth > self.bound:
            wait = self.retry_after_s(self.queues[device], depth - self.bound)
            raise Problem(
                "overloaded",
                f"too many requests: the {device} queue holds {depth} waiting windows, over the "
                f"bound of {self.bound}; retry after {wait} s",
                retry_after_s=wait,
            )
        waiting, excess = self.tenant_excess(device, tenant, lane)
        if excess > 0:
            wait = self.retry_after_s(self.queues[device], excess)
            raise Problem(
                "overloaded",
                f"too many requests: this API key's tenant has {waiting.windows} windows (about "
                f"{waiting.tokens} tokens) waiting for its share of the {device} queue, over its bound of "
                f"{self.tenant_bound} windows or {self.tenant_bound_tokens} tokens; retry after {wait} s",
                retry_after_s=wait,
            )

    def retry_after_s(self, queue: str, excess: int) -> int:
        """How long the queue's measured drain rate takes to work off ``excess`` windows."""
        rate = self.rate.get(queue)
        if not rate:
            return self.max_retry_after_s
        return max(1, min(self.max_retry_after_s, math.ceil(excess / rate)))

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

    async def read_waiting(self) -> None:
        """Each bucket's waiting windows and their cost, from the devices' fair-share ledgers
        (``'<bucket> n'`` and ``'<bucket> c'``)."""
        if self.store is None:
            return
        pipe = self.store.pipeline(transaction=False)
        for key in self.ledgers.values():
            pipe.hgetall(key)
        for device, fields in zip(self.ledgers, await pipe.execute()):
            counts: dict[str, dict[str, int]] = {}
            for name, value in fields.items():
                bucket, _, kind = name.decode().rpartition(" ")
                if kind in ("n", "c"):
                    counts.setdefault(bucket, {})[kind] = int(value)
            self.waiting[device] = {
                bucket: Waiting(windows=count.get("n", 0), tokens=count.get("c", 0)) for bucket, count in counts.items()
            }

    async def sample(self) -> None:
        await self.read_waiting()
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
