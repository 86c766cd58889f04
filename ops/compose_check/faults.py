"""A profile run under faults: a worker killed mid-run, the broker restarted, stop and start mid-run,
down inside the grace periods."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request

from ops.compose_check.assertions import Submitter, check_output, check_prometheus, cohere_v2, make_jobs
from ops.compose_check.common import HEALTH_TIMEOUT_S, CheckFailed, http_json, url, wait_for
from ops.compose_check.profiles import Stack, parse_duration, stack_service


def crash(stack: Stack, service: str) -> None:
    """SIGKILL the container's main process from the host, as the kernel's OOM killer would.

    Not `docker kill`: Docker counts that as a manual stop, and no restart policy restarts a
    container stopped by hand (the container stays Exited (137)).
    """
    pid = int(stack.inspect(service, "{{.State.Pid}}"))
    if pid <= 0:
        raise CheckFailed(f"{service} is not running")
    os.kill(pid, signal.SIGKILL)


def check_profile(stack: Stack, key: str, host_env: dict[str, str], docker: list[str]) -> str:
    profile, work = stack.profile, stack.work / stack.profile.name
    work.mkdir(exist_ok=True)
    notes: list[str] = []
    stack.compose("up", "-d", "--no-build", *profile.up_args, timeout=900)
    stack.wait_healthy([*profile.workers, profile.gateway, "exporter"])

    # Each worker's /readyz, over HTTP on its container's address.
    for worker in profile.workers:
        with urllib.request.urlopen(f"http://{stack.address(worker)}:9191/readyz", timeout=5) as reply:
            if reply.status != 200:
                raise CheckFailed(f"{worker} /readyz {reply.status}")
    notes.append(check_prometheus())

    # Unprivileged users.
    for service in [*profile.workers, "exporter", profile.gateway]:
        uid = stack.exec(service, "id", "-u").stdout.strip()
        if uid == "0":
            raise CheckFailed(f"{service} runs as root")
    # The model cache: the volume, the worker user's HF_HOME and export root inside it.
    worker = profile.workers[0]
    mounts = json.loads(stack.inspect(worker, "{{json .Mounts}}"))
    cache = next((m for m in mounts if m["Destination"] == "/home/rerankq/.cache"), None)
    if cache is None or cache["Type"] != "volume":
        raise CheckFailed(f"{worker}: no model-cache volume at /home/rerankq/.cache: {mounts}")
    where = stack.exec(
        worker,
        "python",
        "-c",
        "import os; from worker.engine.export import export_root; "
        "print(os.environ['HF_HOME'], export_root('org/model'))",
    ).stdout.split()
    if not all(p.startswith("/home/rerankq/.cache/") for p in where):
        raise CheckFailed(f"{worker}: caches outside the volume: {where}")
    marker = f"/home/rerankq/.cache/huggingface/check-{profile.name}"
    stack.exec(worker, "sh", "-c", f"echo {profile.name} > {marker}")

    submitter = Submitter(stack, host_env)
    # 1. A run with a worker killed in the middle of it.
    jobs, out = work / "jobs-kill.jsonl", work / "out-kill.jsonl"
    make_jobs(jobs, f"{profile.name}-kill")
    started = time.monotonic()
    process = submitter.start(jobs, out)
    time.sleep(1.5)
    restarts = int(stack.inspect(worker, "{{.RestartCount}}"))
    crash(stack, worker)
    wait_for(
        f"{worker} restarted by its restart policy",
        lambda: int(stack.inspect(worker, "{{.RestartCount}}")) > restarts and stack.health(worker) == "healthy",
        HEALTH_TIMEOUT_S,
    )
    submitter.finish(process, jobs, out)
    rows = check_output(out, f"{profile.name}-kill")
    notes.append(f"kill: {rows} rows in {time.monotonic() - started:.0f}s")
    if stack.exec(worker, "cat", marker).stdout.strip() != profile.name:
        raise CheckFailed(f"{worker}: the cache volume lost {marker} across the restart")

    # 2. The broker's container restarted once, then a run and a gateway call.
    stack.compose("restart", profile.broker_service, timeout=120)
    stack.wait_healthy([profile.broker_service], 120)
    stack.wait_healthy([*profile.workers, profile.gateway], HEALTH_TIMEOUT_S)
    jobs, out = work / "jobs-broker.jsonl", work / "out-broker.jsonl"
    make_jobs(jobs, f"{profile.name}-broker")
    submitter.submit(jobs, out)
    rows = check_output(out, f"{profile.name}-broker")
    cohere_v2(key)
    notes.append(f"{profile.broker_service} restart: {rows} rows + cohere v2")

    if profile.name == "flower":
        # The dashboard's JSON, not /api: Flower 2 serves its API only with auth configured or
        # FLOWER_UNAUTHENTICATED_API set, and that API can shut workers down.
        def online() -> object:
            rows = http_json(url("FLOWER", "/workers?json=1&refresh=1"), timeout=20)["data"]
            return [r["hostname"] for r in rows if r.get("task-succeeded", 0) > 0]

        flower = wait_for("Flower lists the workers, with their task events", online, 120, 5)
        notes.append(f"flower sees task events from {len(flower)} worker(s)")

    # 3. stop while a run is in flight; start; the same run, resumed, has every window.
    jobs, out = work / "jobs-stop.jsonl", work / "out-stop.jsonl"
    make_jobs(jobs, f"{profile.name}-stop")
    # From inside the gateway container, the run dies with it; its ledger stays in the container.
    process = submitter.start(jobs, out)
    time.sleep(1.5)
    grace = max(parse_duration(stack_service(s).get("stop_grace_period", "10s")) for s in profile.workers)
    began = time.monotonic()
    stack.compose("stop", timeout=300)
    stop_s = time.monotonic() - began
    if stop_s > grace + 15:
        raise CheckFailed(f"stop took {stop_s:.0f}s, over the {grace:.0f}s grace period")
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.communicate(timeout=30)
    if process.poll() is None:
        process.kill()
        process.wait()
    stack.compose("up", "-d", "--no-build", *profile.up_args, timeout=900)
    stack.wait_healthy([*profile.workers, profile.gateway, "exporter"])
    with contextlib.suppress(FileNotFoundError):
        out.unlink()
    submitter.submit(jobs, out)  # the same run id: resumes, opens nothing twice
    rows = check_output(out, f"{profile.name}-stop")
    notes.append(f"stop {stop_s:.0f}s/{grace:.0f}s grace, resumed: {rows} rows")
    return "; ".join(notes)
