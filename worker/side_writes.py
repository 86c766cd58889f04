"""Writes a window's scoring makes on the side, sent in its commit's round trip.

Scoring a window writes a little besides its result: the pair cache's fresh scores (one
script call), counters (``provider_calls:<member>``, failovers, cache hits) and, for a remote
member, the breaker's record of a success. Sent one by one, each would be a round trip the
window's task waits for; so while a window is scored they are held here and the commit sends
them ahead of itself in one pipeline (no MULTI: each
command is still atomic on its own, and a full Redis refuses none of the reads a MULTI would
take down with it). A window that ends without a commit sends what it holds on its way out.

What holds back: the counts land with the commit, a moment after the call, and a process
killed between its provider call and its commit loses that call's count (its cache entries
too, which costs a provider call later, nothing worse; a probe's success not recorded lets its
lease lapse and another probe go). Outside a window (no collector), every write goes at once.
Each writer must write to the store's Redis, whose pipeline carries it: the
worker's runtime gives the cache and the breaker the store's client.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import redis

_held: ContextVar[list[SideWrite] | None] = ContextVar("rerankq_side_writes", default=None)


class SideWrite:
    """One command: queued on the commit's pipeline, or run at once; ``done`` hears it landed."""

    def __init__(
        self, queue: Callable[[Any], Any], run: Callable[[], Any], done: Callable[[Any], None] | None = None
    ) -> None:
        self._queue = queue
        self._run = run
        self._done = done

    def queue(self, pipe: Any) -> None:
        self._queue(pipe)

    def settle(self, reply: Any) -> None:
        """Its reply from the pipeline. One that failed (a script Redis no longer holds after a
        restart, a blip) is run once more on its own; if that fails too, the write is lost:
        a count missed or a score not cached, never the window."""
        if isinstance(reply, Exception):
            self.run_now()
        elif self._done is not None:
            self._done(reply)

    def run_now(self) -> None:
        try:
            reply = self._run()
        except redis.RedisError:
            return
        if self._done is not None:
            self._done(reply)


def write(side_write: SideWrite) -> None:
    """Hold ``side_write`` for the window being scored, or run it now when none is."""
    held = _held.get()
    if held is None:
        side_write.run_now()
    else:
        held.append(side_write)


def holding() -> bool:
    return _held.get() is not None


@contextlib.contextmanager
def held_for_commit() -> Iterator[list[SideWrite]]:
    """Hold side writes while the block runs; what is left in the list at its end is run then."""
    held: list[SideWrite] = []
    token = _held.set(held)
    try:
        yield held
    finally:
        _held.reset(token)
        for side_write in held:
            side_write.run_now()
        held.clear()
