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
"""

from __future__ import annotations

import uuid

import redis

#: kombu's Redis transport keeps one list per priority step besides the plain queue
#: (``<queue>\x06\x16<priority>`` for the default steps 0, 3, 6, 9).
PRIORITY_SEPARATOR = "\x06\x16"
PRIORITY_STEPS = (3, 6, 9)
SCAN_CHUNK = 1000
#: A message header every rerankq message carries: when it was sent (epoch seconds).
SENT_AT_HEADER = "rerankq_sent_at"

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


def queue_lists(queue: str) -> list[str]:
    """Every Redis list kombu may hold this queue's messages in."""
    return [queue, *(f"{queue}{PRIORITY_SEPARATOR}{step}" for step in PRIORITY_STEPS)]


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
