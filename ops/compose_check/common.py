"""What every job of the check shares: the checkout, its constants, commands run and waited on, HTTP."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ("default", "amqp", "cluster", "sentinel", "flower")
BUILT = ("worker-cpu", "exporter", "gateway")  # the Dockerfile targets docker-compose.yml names
PROJECT = "rerankqcheck"
# 4 windows of 25 per job; keeping 25 of 100 admits them all (the over-fetch rule: 4 x 25), so
# every row of every window is in the output.
JOBS, CANDIDATES, KEEP = 12, 100, 25
HEALTH_TIMEOUT_S = 240


class CheckFailed(Exception):
    pass


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(
    cmd: list[str],
    *,
    check: bool = True,
    env: dict[str, str] | None = None,
    timeout: float | None = 900,
    capture: bool = True,
    input: str | None = None,
) -> subprocess.CompletedProcess:
    result = subprocess.run(
        cmd,
        check=False,
        env=env,
        timeout=timeout,
        text=True,
        input=input,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.STDOUT if capture else None,
    )
    if check and result.returncode != 0:
        tail = (result.stdout or "")[-3000:]
        raise CheckFailed(f"{' '.join(cmd[:6])} ... exited {result.returncode}\n{tail}")
    return result


def wait_for(what: str, probe: Callable[[], object], timeout_s: float, every_s: float = 2.0) -> object:
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = probe()
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - keep polling; the last reason is reported
            last = exc
        time.sleep(every_s)
    raise CheckFailed(f"{what}: not within {timeout_s:.0f} s (last: {last!r})")


def http_json(url: str, *, body: object = None, headers: dict[str, str] | None = None, timeout: float = 10) -> object:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.loads(reply.read() or b"null")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


PORTS = {name: free_port() for name in ("REDIS", "RABBITMQ", "GATEWAY", "PROMETHEUS", "FLOWER")}


def url(name: str, path: str) -> str:
    return f"http://127.0.0.1:{PORTS[name]}{path}"


def reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=10):
            return True
    except urllib.error.HTTPError:
        return True
    except Exception:  # noqa: BLE001 - any failure is "not reachable"
        return False
