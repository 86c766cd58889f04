"""The backlog exporter against the queues' true state: a device queue filled with no worker
running, then a worker started and the backlog watched draining to zero, through the real
``python -m producer.exporter`` over HTTP."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from conftest import ROOT, make_candidates
from delivery_helpers import provider_env, pull_until_complete, wait_for
from metrics_helpers import get_json, scrape, status_of, total

from kernel.broker_queues import queue_lists
from worker.embedded.redis_server import free_port


@pytest.fixture
def exporter(base_env, tmp_path) -> Iterator[int]:
    port = free_port()
    log = open(tmp_path / "exporter.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "producer.exporter", "--host", "127.0.0.1", "--port", str(port)],
        env=base_env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(
            lambda: (
                status_of(port, "/healthz") == 200
                if proc.poll() is None
                else pytest.fail((tmp_path / "exporter.log").read_text())
            ),
            30,
            "the exporter",
        )
        yield port
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0  # SIGTERM is a clean exit
        log.close()


def backlog(port: int, device: str) -> dict[str, float]:
    samples = scrape(port)
    return {
        "messages": total(samples, "rerankq_queue_messages", device=device),
        "unacked": total(samples, "rerankq_queue_unacked_messages", device=device),
        "oldest_s": total(samples, "rerankq_queue_oldest_message_age_seconds", device=device),
        "uncommitted": total(samples, "rerankq_windows_uncommitted", device=device),
        "streams": total(samples, "rerankq_streams_active"),
        "redis_up": total(samples, "rerankq_exporter_redis_up"),
    }


def list_lengths(raw_redis, queue: str) -> int:
    return sum(raw_redis.llen(name) for name in queue_lists(queue))


def test_backlog_fills_with_no_worker_and_drains_to_zero(
    exporter, start_worker, make_client, raw_redis, namespace, tmp_path
):
    client = make_client()
    first_sent = time.time()
    cpu_streams = [
        client.open(f"query {i}", make_candidates(30, prefix=f"c{i}"), window_size=10, first_windows=3)
        for i in range(4)
    ]
    gpu_stream = client.open("gpu query", make_candidates(30), window_size=10, first_windows=2, device="gpu")
    last_sent = time.time()
    time.sleep(1.0)

    before = time.time()
    cpu, gpu = backlog(exporter, "cpu"), backlog(exporter, "gpu")
    after = time.time()
    assert cpu["redis_up"] == 1
    assert cpu["messages"] == list_lengths(raw_redis, f"{namespace}.cpu") == 12
    assert cpu["uncommitted"] == 12 and cpu["unacked"] == 0
    assert gpu["messages"] == list_lengths(raw_redis, f"{namespace}.gpu") == 2
    assert gpu["uncommitted"] == 2
    assert backlog(exporter, "any")["messages"] == 0 and backlog(exporter, "any")["oldest_s"] == 0
    assert cpu["streams"] == 5
    # The oldest waiting message is the first one sent.
    assert before - last_sent <= cpu["oldest_s"] <= after - first_sent + 0.05

    start_worker(env=provider_env("FastProvider", sleep_s=0.15), args=["--device", "cpu"])
    seen: list[dict[str, float]] = []

    def drained() -> bool:
        seen.append(backlog(exporter, "cpu"))
        return seen[-1]["messages"] == seen[-1]["uncommitted"] == seen[-1]["unacked"] == 0

    wait_for(drained, 60, "the cpu backlog to drain", interval_s=0.05)
    messages = [s["messages"] for s in seen]
    assert messages == sorted(messages, reverse=True)  # a backlog only shrinks with no producer
    assert all(s["unacked"] <= 1 for s in seen)  # one pool process, prefetch of one
    assert all(s["uncommitted"] >= s["messages"] for s in seen)  # a queued window is uncommitted
    assert seen[-1]["oldest_s"] == 0
    for stream in cpu_streams:
        pull_until_complete(client, stream, 30)
    assert client.store.counters()["windows_committed"] == 12

    gpu = backlog(exporter, "gpu")
    assert (gpu["messages"], gpu["uncommitted"]) == (2, 2)  # no GPU worker: its backlog stays
    status, body = get_json(exporter, "/healthz")
    assert status == 200 and body == {"ok": True, "redis": True, "broker": True}
    del gpu_stream


def test_expired_streams_leave_the_backlog_without_a_scan(exporter, make_client, raw_redis, namespace):
    client = make_client()
    client.open("short lived", make_candidates(30), window_size=10, first_windows=3, ttl_s=1)
    client.open("long lived", make_candidates(30), window_size=10, first_windows=1)
    cpu = backlog(exporter, "cpu")
    assert (cpu["uncommitted"], cpu["streams"]) == (4, 2)
    time.sleep(1.2)
    cpu = backlog(exporter, "cpu")
    assert (cpu["uncommitted"], cpu["streams"]) == (1, 1)
    assert cpu["messages"] == 4  # the messages themselves wait until a worker drops them


def test_unreadable_redis_reports_down_not_stale_figures(tmp_path, base_env):
    port = free_port()
    env = {**base_env, "RERANKQ_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    once = subprocess.run(
        [sys.executable, "-m", "producer.exporter", "--once", "--port", str(port)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert once.returncode == 0, once.stderr
    lines = [line for line in once.stdout.splitlines() if line and not line.startswith("#")]
    assert lines == ["rerankq_exporter_redis_up 0.0"]


def test_the_exporter_imports_no_torch_and_no_worker_code(base_env):
    script = (
        "import sys\n"
        "from producer.exporter import main\n"
        "assert main(['--once']) == 0\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'worker', 'transformers'))\n"
        "assert not heavy, heavy\n"
    )
    once = subprocess.run(
        [sys.executable, "-c", script], env=base_env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert once.returncode == 0, once.stderr
    assert "rerankq_queue_messages{" in once.stdout
