"""What is waiting, per device queue, read from Redis without scanning streams.

Each read is a fixed number of commands however many streams are live:

- per queue (``QueueSettings.all_queues()``, every priority list kombu keeps for it): its length,
  and its oldest message, the list's tail (kombu pushes on the left and pops on the right),
  whose ``rerankq_sent_at`` header (``kernel.dispatch``) gives the age of the oldest wait;
- unacknowledged messages per queue: kombu's ``unacked`` hash, counted by routing key in a
  script. It holds one entry per message a worker has fetched and not acked, so it is as
  large as the fleet's busy pool processes, not as the backlog;
- on RabbitMQ instead: each lane queue's ready messages (a passive declare); no unacked count
  per queue and no oldest age (neither can be read without taking messages);
- per shard (``kernel.keys.SHARDS`` of them, pipelined): the live entries of the active-stream
  index and of each device's uncommitted-window index, both scored by their stream's expiry,
  so streams that expired are not counted and nothing is walked one by one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import redis

from kernel.amqp_broker import AmqpQueueProbe
from kernel.broker_queues import SENT_AT_HEADER, queue_lists
from kernel.keys import DEVICES, Keys
from kernel.settings import Settings

#: kombu's Redis transport keeps unacked messages here (its ``unacked_key`` default), as
#: JSON ``[message, exchange, routing_key]``; rerankq publishes with the queue as routing key.
UNACKED_KEY = "unacked"

_UNACKED_BY_QUEUE = """
local wanted = {}
for i = 1, #ARGV do wanted[ARGV[i]] = 0 end
for _, entry in ipairs(redis.call('HVALS', KEYS[1])) do
  local routing_key = string.match(entry, '"([^"]*)"%s*%]%s*$')
  if routing_key and wanted[routing_key] then wanted[routing_key] = wanted[routing_key] + 1 end
end
local out = {}
for i = 1, #ARGV do table.insert(out, wanted[ARGV[i]]) end
return out
"""


@dataclass(frozen=True)
class QueueBacklog:
    queue: str
    #: The device kind this queue serves (``cpu``, ``gpu``, ``any``); empty for a queue of no device.
    device: str
    messages: int
    unacked: int
    #: Seconds since the oldest waiting message was sent; 0 when none waits.
    oldest_age_s: float


@dataclass(frozen=True)
class Backlog:
    queues: list[QueueBacklog]
    #: Admitted, uncommitted windows of live streams, per device the streams asked for.
    uncommitted: dict[str, int]
    active_streams: int


def queue_devices(settings: Settings) -> dict[str, str]:
    """Every queue the workers consume, with the device kind it serves."""
    by_queue = {settings.queues.queue_for(device): device for device in DEVICES}
    return {queue: by_queue.get(queue, "") for queue in settings.queues.all_queues()}


def sent_at(raw: bytes | None) -> float | None:
    """The send time a message carries, or None (no message, or one without the header)."""
    if raw is None:
        return None
    try:
        value = json.loads(raw).get("headers", {}).get(SENT_AT_HEADER)
    except (ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class BacklogReader:
    def __init__(
        self,
        settings: Settings,
        store_client: redis.Redis,
        broker_client: redis.Redis | None,
        amqp: AmqpQueueProbe | None = None,
    ) -> None:
        self.settings = settings
        self.keys = Keys(settings.store.namespace)
        self.store_client = store_client
        self.broker_client = broker_client
        #: Set when the broker is RabbitMQ (``kernel.amqp_broker``); then broker_client is None.
        self.amqp = amqp
        if broker_client is not None:
            self._unacked = broker_client.register_script(_UNACKED_BY_QUEUE)

    def read(self) -> Backlog:
        # Windows before queues: a window is admitted before its message is sent and its
        # message popped before it commits, so read in this order a draining queue never
        # shows more messages than uncommitted windows.
        windows = self.read_windows()
        return Backlog(queues=self.read_queues(), **windows)

    def read_queues(self) -> list[QueueBacklog]:
        devices = queue_devices(self.settings)
        queues = list(devices)
        if self.amqp is not None:
            return self.read_amqp_queues(devices)
        assert self.broker_client is not None  # None only on RabbitMQ, answered above
        pipe = self.broker_client.pipeline(transaction=False)
        for queue in queues:
            for name in queue_lists(queue):
                pipe.llen(name)
                pipe.lindex(name, -1)
        replies = pipe.execute()
        unacked = [int(n) for n in self._unacked(keys=[UNACKED_KEY], args=queues)] if queues else []
        now = time.time()
        out = []
        per_queue = 2 * len(queue_lists(""))
        for i, queue in enumerate(queues):
            chunk = replies[i * per_queue : (i + 1) * per_queue]
            lengths, tails = chunk[0::2], chunk[1::2]
            times = [t for t in (sent_at(raw) for raw in tails) if t is not None]
            oldest = max(0.0, now - min(times)) if times else 0.0
            out.append(
                QueueBacklog(
                    queue=queue,
                    device=devices[queue],
                    messages=sum(int(n) for n in lengths),
                    unacked=unacked[i],
                    oldest_age_s=oldest,
                )
            )
        return out

    def read_amqp_queues(self, devices: dict[str, str]) -> list[QueueBacklog]:
        """RabbitMQ's ready-message counts of both lanes. It tells neither the unacked count per
        queue nor the oldest message's age without taking messages, so both read 0 there."""
        assert self.amqp is not None
        waiting = dict.fromkeys(devices, 0)
        for count in self.amqp.counts(list(devices)):
            waiting[count.queue] += count.waiting
        return [
            QueueBacklog(queue=queue, device=device, messages=waiting[queue], unacked=0, oldest_age_s=0.0)
            for queue, device in devices.items()
        ]

    def read_windows(self) -> dict[str, Any]:
        now_ms = int(time.time() * 1000)
        tags = self.keys.shard_tags()
        pipe = self.store_client.pipeline(transaction=False)
        for tag in tags:
            pipe.zcount(self.keys.active(tag), f"({now_ms}", "+inf")
            for device in DEVICES:
                pipe.zcount(self.keys.uncommitted(tag, device), f"({now_ms}", "+inf")
        replies = pipe.execute()
        step = 1 + len(DEVICES)
        active = sum(int(n) for n in replies[0::step])
        uncommitted = {device: sum(int(n) for n in replies[1 + d :: step]) for d, device in enumerate(DEVICES)}
        return {"uncommitted": uncommitted, "active_streams": active}
