"""A profile run under faults: a worker killed mid-run, the broker restarted, stop and start mid-run,
down inside the grace periods."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from ops.compose_check.assertions import (
    Submitter,
    check_output,
    check_ready,
    check_users_and_cache,
    cohere_v2,
    make_jobs,
)
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


def check_profile(stack: Stack, key: str, host_env: dict[str, str]) -> str:
    """One profile up and healthy, its assertions held, then run under each fault; the notes."""
    profile, work = stack.profile, stack.work / stack.profile.name
    work.mkdir(exist_ok=True)
    notes: list[str] = []
    stack.compose("up", "-d", "--no-build", *profile.up_args, timeout=900)
    stack.wait_healthy([*profile.workers, profile.gateway, "exporter"])

    notes.append(check_ready(stack))
    marker = check_users_and_cache(stack)
    submitter = Submitter(stack, host_env)
    notes.append(kill_a_worker(stack, submitter, work, marker))
    notes.append(restart_broker(stack, submitter, work, key))
    if profile.name == "flower":
        notes.append(flower_task_events())
    notes.append(stop_and_resume(stack, submitter, work))
    return "; ".join(notes)


def kill_a_worker(stack: Stack, submitter: Submitter, work: Path, marker: str) -> str:
    """A run with the first worker SIGKILLed in the middle: restarted by its policy, nothing lost,
    the cache volume's marker still there."""
    profile, worker = stack.profile, stack.profile.workers[0]
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
    note = f"kill: {rows} rows in {time.monotonic() - started:.0f}s"
    if stack.exec(worker, "cat", marker).stdout.strip() != profile.name:
        raise CheckFailed(f"{worker}: the cache volume lost {marker} across the restart")
    return note


def restart_broker(stack: Stack, submitter: Submitter, work: Path, key: str) -> str:
    """The broker's container restarted once, then a run and a gateway call."""
    profile = stack.profile
    stack.compose("restart", profile.broker_service, timeout=120)
    stack.wait_healthy([profile.broker_service], 120)
    stack.wait_healthy([*profile.workers, profile.gateway], HEALTH_TIMEOUT_S)
    jobs, out = work / "jobs-broker.jsonl", work / "out-broker.jsonl"
    make_jobs(jobs, f"{profile.name}-broker")
    submitter.submit(jobs, out)
    rows = check_output(out, f"{profile.name}-broker")
    cohere_v2(key)
    return f"{profile.broker_service} restart: {rows} rows + cohere v2"


def flower_task_events() -> str:
    """Flower listing the workers, with their task events."""

    # The dashboard's JSON, not /api: Flower 2 serves its API only with auth configured or
    # FLOWER_UNAUTHENTICATED_API set, and that API can shut workers down.
    def online() -> object:
        rows = http_json(url("FLOWER", "/workers?json=1&refresh=1"), timeout=20)["data"]
        return [r["hostname"] for r in rows if r.get("task-succeeded", 0) > 0]

    flower = wait_for("Flower lists the workers, with their task events", online, 120, 5)
    return f"flower sees task events from {len(flower)} worker(s)"


def stop_and_resume(stack: Stack, submitter: Submitter, work: Path) -> str:
    """``stop`` while a run is in flight, inside the grace period; after ``up`` the same run,
    resumed, has every window."""
    profile = stack.profile
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
    return f"stop {stop_s:.0f}s/{grace:.0f}s grace, resumed: {rows} rows"
