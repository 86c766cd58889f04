"""A worker (or any Celery command) in a subprocess: how the demo, the tests and the benchmarks start one."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


class WorkerNotReady(RuntimeError):
    """The worker was still starting when the wait ran out (it has been stopped)."""


class WorkerProcess:
    """Runs ``command``; ready once its log says `` ready.`` (Celery's banner line)."""

    def __init__(self, command: list[str], env: dict[str, str], log_path: Path, *, cwd: Path | None = None) -> None:
        self.command = command
        self.env = env
        self.log_path = log_path
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def rerankq(cls, env: dict[str, str], log_path: Path, *args: str, cwd: Path | None = None) -> WorkerProcess:
        """``python -m worker ARGS``, as an operator starts it."""
        return cls([sys.executable, "-m", "worker", *args], env, log_path, cwd=cwd)

    def start(self, timeout_s: float = 120.0) -> WorkerProcess:
        self.log_path.write_bytes(b"")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command, env=self.env, cwd=self.cwd, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if b" ready." in self.log_path.read_bytes():
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited {self.proc.returncode}:\n{self.log()[-4000:]}")
            time.sleep(0.1)
        self.stop()
        raise WorkerNotReady(f"worker not ready after {timeout_s:.0f} s:\n{self.log()[-4000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def rss_mb(self) -> dict[str, float]:
        """Resident memory of the worker's processes (the parent and its pool children)."""
        import psutil

        assert self.proc is not None
        parent = psutil.Process(self.proc.pid)
        out = {"parent": parent.memory_info().rss / 2**20}
        for i, child in enumerate(parent.children(recursive=True)):
            out[f"child{i}"] = child.memory_info().rss / 2**20
        return out

    def stop(self, timeout_s: float = 30.0) -> None:
        """Warm shutdown (SIGTERM): windows in hand finish, the broker gets its messages back."""
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """Stop at once (SIGKILL), for a caller that is done with the worker and its queues, as a
        test at teardown: a warm shutdown waits seconds for Celery's pool threads to notice.
        The pool processes die with it (Celery sets their parent-death signal)."""
        if self.proc is None:
            return
        self.proc.kill()
        self.proc.wait()
        self.proc = None
