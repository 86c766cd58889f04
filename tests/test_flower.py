"""Flower, the monitor Celery users know, against a rerankq worker with task events on
(``RERANKQ_TASK_EVENTS=true``), started as README says."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT, make_candidates
from delivery_helpers import provider_env, pull_until_complete, wait_for
from metrics_helpers import get, get_json, status_of

from worker.embedded.redis_server import free_port

pytestmark = pytest.mark.deployment

pytest.importorskip("flower", reason="flower is in the dev extra")


def test_flower_sees_the_windows_and_the_worker(start_worker, make_client, base_env, tmp_path):
    # Flower's worker view asks these inspect commands; a worker answers them only when named.
    flower_commands = "stats,active_queues,registered,scheduled,active,reserved,revoked"
    start_worker(
        env={**provider_env("FastProvider", remote_control_commands=flower_commands), "RERANKQ_TASK_EVENTS": "true"}
    )
    port = free_port()
    env = {**base_env, "FLOWER_UNAUTHENTICATED_API": "true"}  # the API answers without auth for the test
    log = open(tmp_path / "flower.log", "wb")
    flower = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "--broker",
            base_env["RERANKQ_REDIS_URL"],
            "flower",
            f"--port={port}",
            "--address=127.0.0.1",
        ],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: status_of(port, "/healthcheck") == 200, 60, "flower")
        # Events are broadcast, not queued: start once Flower hears the worker's heartbeats.
        wait_for(lambda: b"flower_worker_online{" in get(port, "/metrics")[1], 60, "flower to hear the worker")
        client = make_client()
        stream = client.open("gateway error", make_candidates(30), window_size=10, first_windows=3)
        pull_until_complete(client, stream, 30)

        def tasks() -> dict:
            status, body = get_json(port, "/api/tasks")
            return (
                body if status == 200 and len(body) == 3 and all(t["state"] == "SUCCESS" for t in body.values()) else {}
            )

        seen = wait_for(tasks, 30, "three succeeded tasks in flower")
        assert {t["name"] for t in seen.values()} == {"rerankq.score_window"}
        assert sorted(t["args"] for t in seen.values()) == sorted(f"['{stream}', {w}]" for w in range(3))
        assert {t["result"] for t in seen.values()} == {"'committed'"}
        status, workers = get_json(port, "/api/workers?refresh=1")
        assert status == 200 and len(workers) == 1
        queues = {q["name"] for q in next(iter(workers.values()))["active_queues"]}
        assert queues == {client.settings.queues.cpu_queue, client.settings.queues.any_queue}
    finally:
        flower.terminate()
        flower.wait(timeout=30)
        log.close()
