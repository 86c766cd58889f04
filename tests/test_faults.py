"""Faults a deployment meets: a full Redis, a broker that cannot take messages, an unreachable
Redis, an unrecoverable error, a worker started for a device it cannot serve."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import redis
from conftest import ROOT, make_candidates
from delivery_helpers import commits_per_window, provider_env, wait_for

from kernel.errors import StoreFull, StoreUnavailable
from worker.embedded.redis_server import EmbeddedRedis, free_port


def fill(client: redis.Redis, prefix: str = "junk") -> int:
    """Write until Redis refuses (maxmemory, noeviction); returns how many blocks it took."""
    n = 0
    try:
        while True:
            client.set(f"{prefix}:{n}", b"x" * 65536)
            n += 1
    except redis.exceptions.OutOfMemoryError:
        return n


def free(client: redis.Redis, prefix: str = "junk") -> None:
    for key in client.scan_iter(f"{prefix}:*", count=1000):
        client.delete(key)


class KeptFull:
    """Keeps a Redis at maxmemory (small writes top it up as its usage drifts down) until stopped."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            try:
                self.client.set(f"junk:top:{n}", b"x" * 1024)
                n += 1
            except redis.exceptions.OutOfMemoryError:
                self._stop.wait(0.02)

    def __enter__(self) -> KeptFull:
        fill(self.client)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        free(self.client)


@pytest.fixture
def own_redis():
    server = EmbeddedRedis().start()
    yield server
    server.stop()


@pytest.mark.chaos
def test_a_full_redis_is_waited_out_and_the_worker_stays_up(own_redis, start_worker, make_client, tmp_path):
    """At maxmemory every MULTI is refused, and kombu's ack and delivery bookkeeping are MULTIs:
    the worker once died of it ("Unrecoverable error", exit 0), stranding its windows. Now a
    window waits for memory within its lease, the bookkeeping is kept locally, and what timed
    out is swept once memory frees."""
    raw = redis.Redis.from_url(own_redis.url)
    marks = tmp_path / "marks"
    marks.mkdir()
    # A short lease: windows give up waiting while Redis is still full, so their acks (and the
    # next deliveries) meet the full Redis too.
    delivery = {"redeliver_after_s": 4, "visibility_timeout_s": 60, "sweep_interval_s": 1}
    env = {**provider_env("SlowProvider", mark_dir=marks, sleep_s=1.0, **delivery), "RERANKQ_REDIS_URL": own_redis.url}
    worker = start_worker(env=env, args=["--device", "cpu", "--processes", "2"])
    client = make_client(redis_url=own_redis.url, **delivery)
    streams = [
        client.open("payment gateway error", make_candidates(20), window_size=10, first_windows=2) for _ in range(4)
    ]
    wait_for(lambda: list(marks.iterdir()), 20, "windows to start scoring")
    raw.config_set("maxmemory", str(int(raw.info("memory")["used_memory"]) + 2 * 2**20))
    with KeptFull(raw):
        wait_for(lambda: "redis_full_waiting" in worker.log(), 20, "a window to meet the full Redis")
        time.sleep(6)  # past the windows' leases: they give up, are acked, and more are delivered
        assert worker.proc.poll() is None, "the worker died of a full Redis"
        assert len(client.store.snapshot(streams[-1]).results) < 2

    wait_for(
        lambda: all(len(client.store.snapshot(s).results) == 2 for s in streams),
        60,
        "every window to commit once memory freed",
        0.2,
    )
    assert worker.proc.poll() is None
    assert "Unrecoverable" not in worker.log()
    assert "redis_full:" in worker.log()  # the transport met the full Redis and kept going
    for stream in streams:
        assert commits_per_window(raw, client, stream) == {0: 1, 1: 1}
    raw.close()


def test_a_worker_that_dies_of_an_unrecoverable_error_exits_non_zero(own_redis, start_worker, base_env):
    """Celery's worker_main dropped the exit status: a dead worker exited 0 and a
    restart-on-failure policy never brought it back."""
    worker = start_worker(env={**provider_env("FastProvider"), "RERANKQ_REDIS_URL": own_redis.url})
    raw = redis.Redis.from_url(own_redis.url)
    raw.set(base_env["RERANKQ_CPU_QUEUE"], "another application's key")  # BRPOP now fails: WRONGTYPE

    wait_for(lambda: worker.proc.poll() is not None, 30, "the worker to give up")
    assert "Unrecoverable error" in worker.log()
    assert worker.proc.returncode != 0
    raw.close()


def test_a_gpu_worker_without_cuda_refuses_to_start(base_env, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has CUDA: the worker would rightly start")
    proc = subprocess.run(
        [sys.executable, "-m", "worker", "--device", "gpu"],
        env=base_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "worker_cannot_serve_device" in proc.stderr and "no CUDA device" in proc.stderr
    assert " ready." not in proc.stderr


def test_open_on_a_full_redis_writes_nothing_and_says_a_retry_is_safe(own_redis, make_client, namespace):
    raw = redis.Redis.from_url(own_redis.url)
    client = make_client(redis_url=own_redis.url)
    raw.config_set("maxmemory", str(int(raw.info("memory")["used_memory"]) + 2**20))
    fill(raw)

    with pytest.raises(StoreFull) as err:
        client.open("payment gateway error", make_candidates(10), window_size=10)
    assert err.value.stream_written is False and err.value.retry_safe is True
    assert "maxmemory" in str(err.value)
    assert list(raw.scan_iter(f"{namespace}:*")) == []
    free(raw)
    raw.close()


def test_a_stream_written_before_the_broker_filled_is_opened_and_swept(
    own_redis, start_worker, make_client, raw_redis, namespace
):
    """The stream is written, then the (separate) broker refuses the messages: open succeeds,
    a retry would pay twice, and the workers' sweep sends the windows once the broker frees."""
    broker = redis.Redis.from_url(own_redis.url)
    broker.config_set("maxmemory", str(int(broker.info("memory")["used_memory"]) + 2**20))
    fill(broker)
    client = make_client(broker_url=own_redis.url, redeliver_after_s=2)

    stream = client.open("payment gateway error", make_candidates(20), window_size=10, first_windows=2)

    assert client.status(stream).windows[0].state == "admitted"
    assert broker.llen(f"{namespace}.cpu") == 0
    free(broker)
    start_worker(env=provider_env("FastProvider", redeliver_after_s=2, sweep_interval_s=1, broker_url=own_redis.url))
    wait_for(lambda: len(client.store.snapshot(stream).results) == 2, 30, "the sweep to send both windows", 0.2)
    assert commits_per_window(raw_redis, client, stream) == {0: 1, 1: 1}
    broker.close()


def test_an_unreachable_redis_is_a_typed_error_that_says_what_is_known(make_client):
    dead = f"redis://127.0.0.1:{free_port()}/0"
    client = make_client(redis_url=dead)
    with pytest.raises(StoreUnavailable) as err:
        client.open("payment gateway error", make_candidates(10), window_size=10)
    assert err.value.stream_written is None and err.value.retry_safe is False
    with pytest.raises(StoreUnavailable) as err:
        client.open("payment gateway error", make_candidates(10), window_size=10, idempotency_key="job-1")
    assert err.value.retry_safe is True
    with pytest.raises(StoreUnavailable) as err:
        client.pull("s_" + "0" * 32, 0, 10, timeout=0)
    # A read never reached the stream: it claims nothing about it, and reading again is safe.
    assert err.value.stream_written is None and err.value.retry_safe is True
    assert dead in str(err.value) and "the stream exists" not in str(err.value)


@pytest.mark.chaos
def test_a_redis_killed_mid_run_is_waited_out(start_worker, make_client, tmp_path):
    """SIGKILL, not a clean stop: AOF everysec has already written every acknowledged command."""
    server = EmbeddedRedis(appendonly=True).start()
    try:
        env = {**provider_env("SlowProvider", sleep_s=0.5), "RERANKQ_REDIS_URL": server.url}
        worker = start_worker(env=env)
        client = make_client(redis_url=server.url, redeliver_after_s=4)
        streams = [
            client.open("payment gateway error", make_candidates(20), window_size=10, first_windows=2) for _ in range(3)
        ]
        time.sleep(1.0)
        os.kill(server.process.pid, signal.SIGKILL)
        server.process.wait()
        server.process = None
        time.sleep(2)
        server.start()

        wait_for(
            lambda: all(len(client.store.snapshot(s).results) == 2 for s in streams),
            60,
            "every window to commit after the restart",
            0.5,
        )
        assert worker.proc.poll() is None
        raw = redis.Redis.from_url(server.url)
        for stream in streams:
            assert commits_per_window(raw, client, stream) == {0: 1, 1: 1}
        raw.close()
    finally:
        server.stop()
