"""A prefork worker consumes nothing until a pool process says its chain scores.

Each pool process loads its chain when it starts (``worker.app``), which is where a model that
is not there, or torch that is not installed, shows. It tells the parent over a pipe the parent
made before forking: ``ok``, or the reason it cannot score. A bootstep between the pool and the
consumer (Celery starts the consumer last) waits for the first ``ok`` and lets the consumer
start; when every pool process says it cannot score, or all of them died first, the parent logs
``worker_cannot_score`` and exits 1 before it has taken a message. So the models load once, in
the processes that serve them, rather than once more in a check of their own.

Writes are short (under ``PIPE_BUF``, so each is whole) and never block a pool process: one
started after the verdict (a replacement) writes into a pipe nobody reads any more, and a full
pipe is ignored.
"""

from __future__ import annotations

import os
import select
from typing import Any

import structlog
from celery import bootsteps

log = structlog.get_logger("rerankq.worker")

#: The longest verdict line a pool process writes (pipe writes up to PIPE_BUF are atomic).
MAX_VERDICT_BYTES = 3000
#: How often the wait looks whether the pool's processes are still alive.
POLL_S = 0.5
OK = b"ok"
NO = b"no "


class ChildGate:
    """The pipe from the pool's processes to the parent, made before the pool forks."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)
        self._buffer = b""

    # -- in a pool process ------------------------------------------------------

    def report(self, problem: str | None) -> None:
        """Say whether this process's chain scores (None) or why it cannot."""
        try:
            os.close(self.read_fd)  # a pool process only writes
        except OSError:
            pass
        line = OK if problem is None else NO + problem.replace("\n", " ").encode()[:MAX_VERDICT_BYTES]
        try:
            os.write(self.write_fd, line + b"\n")
        except OSError:
            pass  # the parent decided already, or the pipe is full: nobody waits for this one

    # -- in the parent ------------------------------------------------------------

    def wait(self, processes: int, alive: Any) -> str | None:
        """Block until a pool process can score (None), or every one of ``processes`` cannot, or
        ``alive()`` says none is left (the reason). The read end stays open: a pool process
        started later writes into the pipe's buffer, never into a closed pipe (SIGPIPE)."""
        problems: list[str] = []
        while True:
            for line in self._lines(POLL_S):
                if line == OK:
                    return None
                problems.append(line.removeprefix(NO).decode(errors="replace"))
            if len(problems) >= processes:
                return problems[-1]
            if not alive():
                return problems[-1] if problems else "the pool's processes exited before their chain loaded"

    def _lines(self, timeout_s: float) -> list[bytes]:
        ready, _, _ = select.select([self.read_fd], [], [], timeout_s)
        if not ready:
            return []
        self._buffer += os.read(self.read_fd, 65536)  # never empty: the parent holds a write end
        *lines, self._buffer = self._buffer.split(b"\n")
        return lines


def gate_step(gate: ChildGate) -> type[bootsteps.StartStopStep]:
    """A worker bootstep that holds the consumer back until ``gate`` opens (or exits 1)."""

    class WaitForAScoringProcess(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery's bootsteps are untyped
        requires = ("celery.worker.components:Pool",)

        def start(self, worker: Any) -> None:
            pool = worker.pool
            processes = int(getattr(pool, "limit", None) or worker.concurrency or 1)
            problem = gate.wait(processes, lambda: _any_alive(pool))
            if problem is not None:
                log.error("worker_cannot_score", problem=problem)
                raise SystemExit(1)

    return WaitForAScoringProcess


def _any_alive(pool: Any) -> bool:
    processes = getattr(getattr(pool, "_pool", None), "_pool", None)
    if processes is None:
        return True  # nothing to look at: the verdicts decide
    return any(p.exitcode is None for p in processes)
