"""What is waiting in the broker's queues: which windows still have a message queued.

The sweep re-sends a window whose deadline passed without a commit. Under a backlog most
such windows are not lost at all, only still queued behind others; re-sending them every
period multiplies the backlog it is stuck in. So before re-sending, the sweep looks at the
queues: a window whose message is still waiting is left alone, a window with no message
anywhere (popped by a worker that died before recording it, lost with the last second of a
Redis crash, never sent by a producer that died) is re-sent.

Every message rerankq sends carries a task id ``rq:<stream>:<window>:<nonce>``; stream ids
never contain a colon, so one pattern finds the window in a message's headers without
decoding it. The queues are Redis lists (kombu's Redis transport, LPUSH in, BRPOP out);
they are scanned in chunks by a small script that returns the ids only, never the bodies.

Each device queue has two lanes, interactive and batch, as two Celery priorities. kombu's
Redis transport keeps one list per priority step (the plain queue for step 0,
``<queue>\x06\x16<step>`` for the others) and its BRPOP names every consumed queue's step-0
list before any list of a later step, whatever ``queue_order_strategy`` says (that only orders
queues within a step). So a worker that becomes free takes a waiting interactive window before
any batch window, and round robin between its device queues stays as it was. The steps are
pinned (``celery_config``) so producers, workers and this probe agree on the list names.
"""

from __future__ import annotations

import json
import time
import uuid

import msgspec
import redis

from kernel.wire import LANES, Lane

PRIORITY_SEPARATOR = "\x06\x16"
#: The Celery priority of each lane. On kombu's Redis transport 0 is consumed first.
LANE_PRIORITY: dict[Lane, int] = {"interactive": 0, "batch": 9}
PRIORITY_STEPS = (0, 9)
#: The message header that says when it was sent (epoch seconds), so an operator sees how
#: long the oldest message of a queue has waited.
SENT_AT_HEADER = "rerankq_sent_at"
SCAN_CHUNK = 1000

_SCAN = """
local items = redis.call('LRANGE', KEYS[1], ARGV[1], ARGV[2])
local found = {#items}
for _, item in ipairs(items) do
  local stream, window = string.match(item, '"rq:([^:"]+):(%d+):')
  if stream then table.insert(found, stream .. ':' .. window) end
end
return found
"""


def task_id(stream_id: str, window: int) -> str:
    """A fresh id for one message of one window (each re-send is a new delivery)."""
    return f"rq:{stream_id}:{window}:{uuid.uuid4().hex[:12]}"


def lane_list(queue: str, lane: Lane) -> str:
    """The Redis list kombu keeps this queue's messages of this lane in."""
    step = LANE_PRIORITY[lane]
    return f"{queue}{PRIORITY_SEPARATOR}{step}" if step else queue


def queue_lists(queue: str) -> list[str]:
    """Every Redis list kombu may hold this queue's messages in."""
    return [lane_list(queue, lane) for lane in LANES]


class LaneDepth(msgspec.Struct, frozen=True):
    """Messages waiting in one lane of one queue, and how long the oldest has waited."""

    queue: str
    lane: Lane
    waiting: int
    #: Seconds since the oldest waiting message was sent; None when none waits or it carries no time.
    oldest_age_s: float | None


def _sent_at(raw: bytes | None) -> float | None:
    if raw is None:
        return None
    try:
        sent = json.loads(raw).get("headers", {}).get(SENT_AT_HEADER)
    except (ValueError, AttributeError):
        return None
    return float(sent) if isinstance(sent, (int, float)) and not isinstance(sent, bool) else None


class QueueProbe:
    """Reads which windows have a message waiting in the given queues (a Redis broker)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._scan = client.register_script(_SCAN)

    def queued_windows(self, queues: list[str]) -> set[tuple[str, int]]:
        found: set[tuple[str, int]] = set()
        for name in (lst for queue in queues for lst in queue_lists(queue)):
            start = 0
            while True:
                reply = self._scan(keys=[name], args=[start, start + SCAN_CHUNK - 1])
                for entry in reply[1:]:
                    stream, _, window = entry.decode().rpartition(":")
                    found.add((stream, int(window)))
                # LPUSH in, BRPOP out: new messages shift old ones to higher indexes, so a
                # message is seen twice at worst, never skipped by a scan that walks up.
                if int(reply[0]) < SCAN_CHUNK:
                    break
                start += SCAN_CHUNK
        return found

    def depth(self, queues: list[str]) -> int:
        pipe = self.client.pipeline(transaction=False)
        for name in (lst for queue in queues for lst in queue_lists(queue)):
            pipe.llen(name)
        return sum(pipe.execute())

    def lane_depths(self, queues: list[str]) -> list[LaneDepth]:
        """Per queue and lane: messages waiting and the oldest one's age, in one round trip.

        LPUSH in, BRPOP out: the oldest message of a list is its last element.
        """
        lanes = [(queue, lane) for queue in queues for lane in LANES]
        pipe = self.client.pipeline(transaction=False)
        for queue, lane in lanes:
            pipe.llen(lane_list(queue, lane))
            pipe.lindex(lane_list(queue, lane), -1)
        replies = pipe.execute()
        now = time.time()
        out = []
        for (queue, lane), waiting, oldest in zip(lanes, replies[0::2], replies[1::2]):
            sent = _sent_at(oldest)
            out.append(
                LaneDepth(
                    queue=queue,
                    lane=lane,
                    waiting=int(waiting),
                    oldest_age_s=max(0.0, now - sent) if sent is not None else None,
                )
            )
        return out
