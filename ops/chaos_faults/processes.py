"""The processes a chaos run starts and kills: workers (each in its own session, so a
whole-worker kill takes its pool with it) and the private redis-server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from worker.embedded.redis_server import EmbeddedRedis


class Worker:
    """``python -m worker --device cpu`` with JSON logs, one pool process."""

    def __init__(self, env: dict[str, str], log_path: Path, cwd: Path) -> None:
        self.log_path = log_path
        self._ready = False
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "worker",
                    "--device",
                    "cpu",
                    "--processes",
                    "1",
                    "--json-logs",
                    "--loglevel",
                    "INFO",
                ],
                env=env,
                cwd=cwd,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def ready(self) -> bool:
        """Celery's banner line (`` ready.``) is in the log: it consumes from its queues."""
        if not self._ready:
            try:
                self._ready = b" ready." in self.log_path.read_bytes()
            except OSError:
                pass
        return self._ready

    def pool_pids(self) -> list[int]:
        try:
            text = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        except OSError:
            return []
        return [int(p) for p in text.split()]

    def kill(self) -> None:
        """SIGKILL the worker and its pool at once: nothing is acked, nothing restored."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def stop(self, timeout_s: float = 20.0) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL the whole group: nothing of it outlives the run."""
        if self.alive:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


def kill_pool_process(worker: Worker, pick) -> bool:  # type: ignore[no-untyped-def]
    """SIGKILL one pool process of ``worker`` (the parent notices, requeues its message and forks another)."""
    pids = worker.pool_pids()
    if not pids:
        return False
    try:
        os.kill(pick(pids), signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def restart_redis(server: EmbeddedRedis, *, sigkill: bool) -> None:
    """Stop Redis (SIGTERM: it flushes and fsyncs the AOF first; SIGKILL: it gets no say) and
    start it again on the same port and directory, so it reloads its AOF."""
    if sigkill:
        server.kill()
    else:
        server.stop()
    server.start(timeout_s=60.0)
