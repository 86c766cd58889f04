"""The Docker engine and the clients that drive it: dockerd started when it is not running, BuildKit,
Compose v2 or 1.29."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ops.compose_check.common import CheckFailed, log, run, wait_for


@dataclass
class Engine:
    docker: list[str]  # a client that builds with BuildKit
    compose: list[str]
    compose_kind: str
    started_pid: int | None = None


def start_engine(work: Path) -> int | None:
    if run(["docker", "info"], check=False, timeout=30).returncode == 0:
        return None
    dockerd = shutil.which("dockerd")
    if not dockerd or os.geteuid() != 0:
        raise CheckFailed("no Docker engine answers, and dockerd is not installed or this is not root")
    log(f"starting dockerd (log: {work / 'dockerd.log'})")
    with (work / "dockerd.log").open("w") as dockerd_log:
        process = subprocess.Popen([dockerd], stdout=dockerd_log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_for("dockerd", lambda: run(["docker", "info"], check=False, timeout=10).returncode == 0, 60, 1)
    return process.pid


def buildkit_client() -> list[str]:
    """A docker client whose `build` uses BuildKit: one with buildx, or one older than 23 with DOCKER_BUILDKIT=1."""
    candidates = dict.fromkeys(filter(None, [shutil.which("docker"), "/usr/bin/docker"]))
    for client in candidates:
        if not Path(client).exists():
            continue
        if run([client, "buildx", "version"], check=False, timeout=30).returncode == 0:
            return [client]
        version = run([client, "version", "--format", "{{.Client.Version}}"], check=False, timeout=30).stdout.strip()
        if re.match(r"^(1\d|20|21|22)\.", version):
            return [client]
    raise CheckFailed(
        "no docker client builds with BuildKit (install buildx, or a client before 23 for DOCKER_BUILDKIT=1)"
    )


def compose_client() -> tuple[list[str], str]:
    if run(["docker", "compose", "version"], check=False, timeout=30).returncode == 0:
        return ["docker", "compose"], "docker compose (v2)"
    legacy = shutil.which("docker-compose")
    if legacy:
        version = run([legacy, "version", "--short"], check=False, timeout=30).stdout.strip()
        major_minor = tuple(int(p) for p in re.findall(r"\d+", version)[:2])
        if major_minor >= (1, 29):
            return [legacy], f"docker-compose {version} (v1)"
        raise CheckFailed(f"docker-compose {version} is too old: profiles need 1.28, depends_on conditions 1.29")
    raise CheckFailed("neither `docker compose` nor `docker-compose` is installed")


def open_engine(work: Path) -> Engine:
    """The engine running (started here when it is not) and the clients that build and compose."""
    started_pid = start_engine(work)
    docker = buildkit_client()
    compose, kind = compose_client()
    log(
        f"engine: {run([*docker, 'version', '--format', '{{.Server.Version}}'], timeout=30).stdout.strip()}; "
        f"builds: {docker[0]} with BuildKit; compose: {kind}"
    )
    return Engine(docker, compose, kind, started_pid)


def stop_engine(engine: Engine) -> None:
    """Stop the dockerd this check started, if it started one."""
    if engine.started_pid is None:
        return
    log("stopping the dockerd this check started")
    with contextlib.suppress(ProcessLookupError):
        os.kill(engine.started_pid, signal.SIGTERM)
    # dockerd stops its containerd before it exits: wait for that, as a supervisor would.
    deadline = time.monotonic() + 60
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(engine.started_pid, os.WNOHANG) == (0, 0) and time.monotonic() < deadline:
            time.sleep(0.5)
