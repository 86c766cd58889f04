"""A real gateway process on loopback (``python -m producer.gateway``), and API keys for it."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from delivery_helpers import patient

from producer.gateway.auth import digest, new_key
from worker.embedded.redis_server import free_port

ROOT = Path(__file__).resolve().parent.parent


def queue_env(redis_url: str, namespace: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RERANKQ_")}
    env.update(
        {
            "RERANKQ_REDIS_URL": redis_url,
            "RERANKQ_NAMESPACE": namespace,
            "RERANKQ_CPU_QUEUE": f"{namespace}.cpu",
            "RERANKQ_GPU_QUEUE": f"{namespace}.gpu",
            "RERANKQ_ANY_QUEUE": f"{namespace}.any",
            "PYTHONPATH": str(ROOT),
            **extra,
        }
    )
    return env


def write_keys(path: Path, entries: list[dict]) -> dict[str, str]:
    """Make a key per entry (``name`` is the test's handle for it); write their hashes only."""
    keys, stored = {}, []
    for entry in entries:
        entry = dict(entry)
        key = new_key()
        keys[entry.pop("name")] = key
        stored.append({"key_sha256": digest(key), **entry})
    path.write_text(json.dumps(stored))
    return keys


class GatewayProcess:
    def __init__(self, env: dict[str, str], log_path: Path, *args: str, program: list[str] | None = None) -> None:
        """``program``: how it is started, ``python -m producer.gateway`` unless given (``rerankq serve``)."""
        self.program = program or [sys.executable, "-m", "producer.gateway"]
        self.env = env
        self.log_path = log_path
        self.port = free_port()
        self.args = ["--port", str(self.port), *args]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> GatewayProcess:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([*self.program, *self.args], env=self.env, cwd=ROOT, stdout=log, stderr=log)
        deadline = time.monotonic() + patient(timeout_s)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                if httpx.get(self.url + "/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"gateway not ready after {timeout_s:.0f} s:\n{self.log()[-3000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


def sse_events(text: str) -> list[dict[str, str]]:
    """Server-sent events as dicts of their fields (comments dropped)."""
    events = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line.startswith(":") or ":" not in line:
                continue
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
        if fields:
            events.append(fields)
    return events


# -- raw connections, for what an HTTP client would not send ------------------------------------


def read_until_closed(sock: socket.socket, timeout_s: float) -> tuple[bytes, float | None]:
    """What the server sends until it closes the connection, and when it closed (None: it
    was still open after ``timeout_s``)."""
    started = time.monotonic()
    data = b""
    while True:
        remaining = timeout_s - (time.monotonic() - started)
        if remaining <= 0:
            return data, None
        ready, _, _ = select.select([sock], [], [], remaining)
        if not ready:
            continue
        try:
            part = sock.recv(65536)
        except ConnectionResetError:
            part = b""
        if not part:
            return data, time.monotonic() - started
        data += part


def send_until_answered(port: int, data: bytes, *, chunk: int = 256 * 1024, timeout_s: float = 30.0) -> bytes:
    """Send ``data`` in chunks, stopping as soon as the server answers or closes; its answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        view = memoryview(data)
        for at in range(0, len(data), chunk):
            if select.select([sock], [], [], 0)[0]:
                break
            try:
                sock.sendall(view[at : at + chunk])
            except OSError:
                break
        return read_until_closed(sock, timeout_s)[0]


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")
