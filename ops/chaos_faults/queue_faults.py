"""Faults injected into the broker's queues: a lost message and a duplicate one.

Neither may help recovery, or a broken sweep would pass unseen:

- a lost message is a waiting message removed from its list, chosen among windows that
  have exactly one message waiting, so the window really has none left;
- a duplicate is either an exact copy of a message still waiting (pushed only while the
  original is in the list, checked in the same script), or a fresh message for a window
  that is already committed. A window whose message is gone is never sent anything.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict

import redis

from kernel.broker_queues import queue_lists
from kernel.dispatch import Dispatcher

# The window a message is for, from its task id (``rq:<stream>:<window>:<nonce>``).
_WINDOW = re.compile(rb'"rq:([^:"]+):(\d+):')

# Copy a message only while it is still waiting: a copy of a message a worker has already
# taken could stand in for it if that worker dies, doing the sweep's job for it.
_COPY_IF_WAITING = """
if redis.call('LPOS', KEYS[1], ARGV[1]) then
  return redis.call('LPUSH', KEYS[1], ARGV[1])
end
return 0
"""

Window = tuple[str, int]


class QueueFaults:
    def __init__(self, client: redis.Redis, queues: list[str], dispatcher: Dispatcher) -> None:
        self.client = client
        self.lists = [name for queue in queues for name in queue_lists(queue)]
        self.dispatcher = dispatcher
        self._copy = client.register_script(_COPY_IF_WAITING)

    def waiting(self) -> list[tuple[str, bytes, Window]]:
        """Every waiting message: its list, its exact payload and its window."""
        pipe = self.client.pipeline(transaction=False)
        for name in self.lists:
            pipe.lrange(name, 0, -1)
        found = []
        for name, items in zip(self.lists, pipe.execute()):
            for payload in items:
                match = _WINDOW.search(payload)
                if match:
                    found.append((name, payload, (match.group(1).decode(), int(match.group(2)))))
        return found

    def lose_one(self, rng: random.Random) -> Window | None:
        """Remove one waiting message whose window has no other message waiting."""
        messages = self.waiting()
        copies: dict[Window, int] = defaultdict(int)
        for _, _, window in messages:
            copies[window] += 1
        alone = [m for m in messages if copies[m[2]] == 1]
        if not alone:
            return None
        name, payload, window = rng.choice(alone)
        # Zero when a worker took it meanwhile: then nothing was lost.
        return window if self.client.lrem(name, 1, payload) == 1 else None

    def copy_waiting(self, rng: random.Random) -> Window | None:
        """Push an exact copy (same task id) of a waiting message, as a redelivery would."""
        messages = self.waiting()
        if not messages:
            return None
        name, payload, window = rng.choice(messages)
        return window if self._copy(keys=[name], args=[payload]) else None

    def resend_committed(self, window: Window, device: str = "cpu") -> Window:
        """A fresh message for a window already committed: a sweep's re-send racing a commit."""
        self.dispatcher.send(window[0], [window[1]], device)
        return window
