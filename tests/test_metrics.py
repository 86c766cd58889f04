"""The workers' /metrics, /healthz and /readyz, scraped over HTTP from real worker processes
(prefork with two pool processes, and threads) while streams run, and checked exactly against
what the store counted and what readers see."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
from conftest import ROOT, make_candidates
from delivery_helpers import provider_env, pull_until_complete, wait_for
from metrics_helpers import get_json, scrape, series, status_of, total

from worker.embedded.redis_server import free_port

COMMITTED = "rerankq_windows_committed_total"


def metrics_env(tmp_path, **extra: str) -> tuple[int, dict[str, str]]:
    port = free_port()
    return port, {"RERANKQ_METRICS_PORT": str(port), "RERANKQ_METRICS_DIR": str(tmp_path / "metrics"), **extra}


def served_by(client, streams: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for stream in streams:
        for window in client.status(stream).windows:
            counts[window.served_by or "none"] = counts.get(window.served_by or "none", 0) + 1
    return counts


def assert_never_ahead_of_the_store(port: int, client) -> None:
    """Mid-run: a metric moves right after the store's count, never before it."""
    samples = scrape(port)
    counters = client.store.counters()
    assert total(samples, COMMITTED) <= counters.get("windows_committed", 0)
    assert total(samples, "rerankq_pair_cache_hits_total") <= counters.get("pair_cache_hits", 0)


def settled(port: int, client) -> None:
    """Wait until the worker has counted its last commit: it counts right after the commit
    script returns, so a reader can see the window a moment before the metric moves."""
    wait_for(
        lambda: total(scrape(port), COMMITTED) == client.store.counters().get("windows_committed", 0),
        10,
        "the metrics to count the last commit",
    )


def test_prefork_metrics_match_the_store(server, start_worker, make_client, tmp_path):
    tei, cohere = server("tei"), server("cohere")
    port, env = metrics_env(
        tmp_path,
        RERANKQ_RERANKER_PROVIDER="tei",
        RERANKQ_RERANKER_URL=tei.url,
        RERANKQ_RERANKER_MAX_RETRIES="1",
        RERANKQ_RERANKER_TIMEOUT_S="5",
        RERANKQ_RERANKER_1_PROVIDER="cohere",
        RERANKQ_RERANKER_1_URL=cohere.url,
        RERANKQ_RERANKER_1_MODEL="rerank-v3.5",
        RERANKQ_RERANKER_1_API_KEY="sk-test",
        RERANKQ_RERANKER_2_PROVIDER="rrf",
        RERANKQ_BREAKER_FAILURES="2",
        RERANKQ_BREAKER_COOLDOWN_S="300",
    )
    worker = start_worker(env=env, args=["--device", "cpu", "--processes", "2"], drop=("RERANKQ_RERANKER_MODEL",))
    client = make_client()
    wait_for(lambda: status_of(port, "/readyz") == 200, 60, "both pool processes ready")

    def one_window(query: str, prefix: str) -> str:
        stream = client.open(query, make_candidates(10, prefix=prefix), window_size=10, allow_shallow=True)
        pull_until_complete(client, stream, 10)
        assert_never_ahead_of_the_store(port, client)
        return stream

    tei.retry_after = "0"
    tei.plan = ["429"]  # answered on the retry: one Retry-After wait
    streams = [one_window("gateway error", "a")]
    tei.mode = "500"  # every request fails; one retry each; the second failed call opens the breaker
    streams += [one_window("checkout outage", "b"), one_window("certificate expired", "c")]
    streams += [one_window("payment declined", "d")]  # skipped by the open breaker, no call
    streams += [one_window("checkout outage", "b")]  # tei skipped again; cohere's cached scores

    settled(port, client)
    samples = scrape(port)
    counters = client.store.counters()
    # Windows: the store's count, the readers' view, and the metric agree exactly.
    assert counters["windows_committed"] == 5
    assert served_by(client, streams) == {"0:tei": 1, "1:cohere": 4}
    assert total(samples, COMMITTED) == counters["windows_committed"]
    assert total(samples, COMMITTED, member="0:tei", outcome="ranked", device="cpu") == 1
    assert total(samples, COMMITTED, member="1:cohere", outcome="ranked", device="cpu") == 4
    # Failovers by member, with their reasons.
    assert total(samples, "rerankq_failovers_total", member="0:tei") == counters["failovers:0:tei"] == 4
    assert total(samples, "rerankq_failovers_total", member="0:tei", reason="http_500") == 2
    assert total(samples, "rerankq_failovers_total", member="0:tei", reason="breaker_open") == 2
    assert "failovers:1:cohere" not in counters
    assert total(samples, "rerankq_failovers_total", member="1:cohere") == 0
    # Provider calls, errors, pairs and retries; every HTTP request beyond a call is a retry.
    for member in ("0:tei", "1:cohere"):
        assert (
            total(samples, "rerankq_provider_requests_total", member=member)
            == counters[f"provider_calls:{member}"]
            == 3
        )
        assert total(samples, "rerankq_provider_request_seconds_count", member=member) == 3
        assert total(samples, "rerankq_pairs_scored_total", member=member) == 30
    assert total(samples, "rerankq_provider_errors_total", member="0:tei", reason="http_500") == 2
    assert total(samples, "rerankq_provider_retries_total", member="0:tei") == tei.count - 3 == 3
    assert total(samples, "rerankq_provider_retries_total", member="0:tei", reason="http_429") == 1
    assert total(samples, "rerankq_provider_retry_wait_seconds_count", member="0:tei", source="retry_after") == 1
    assert total(samples, "rerankq_provider_retry_wait_seconds_count", member="0:tei", source="backoff") == 2
    # The pair cache: the repeated window was served from cohere's cached scores.
    assert total(samples, "rerankq_pair_cache_hits_total") == counters["pair_cache_hits"] == 10
    assert total(samples, "rerankq_pair_cache_hits_total", member="1:cohere") == 10
    assert total(samples, "rerankq_pair_cache_misses_total") == counters["pair_cache_misses"] == 40
    # The breaker every process shares, as Redis holds it.
    assert total(samples, "rerankq_breaker_state", member="0:tei", state="open") == 1
    assert total(samples, "rerankq_breaker_state", member="1:cohere", state="closed") == 1
    assert not series(samples, "rerankq_breaker_state") or all(
        s["member"] in ("0:tei", "1:cohere") for s in series(samples, "rerankq_breaker_state")
    )  # not rrf
    # Every window's first attempt was timed from its admission.
    for name in (
        "rerankq_window_queue_wait_seconds_count",
        "rerankq_window_latency_seconds_count",
        "rerankq_window_scoring_seconds_count",
        "rerankq_window_commit_seconds_count",
    ):
        assert total(samples, name, device="cpu") == 5, name
    assert total(samples, "rerankq_window_attempts_again_total") == 0
    assert total(samples, "rerankq_worker_ready") == 1

    # Kill a pool process that scored: Celery replaces it; its counts stay, its live gauges go.
    directory = tmp_path / "metrics" / f"worker-{worker.proc.pid}"
    children = {c.pid for c in psutil.Process(worker.proc.pid).children()}
    assert {int(s["pid"]) for s in series(samples, "rerankq_worker_process_ready")} == children
    victim = next(pid for pid in children if (directory / f"histogram_{pid}.db").exists())
    os.kill(victim, signal.SIGKILL)

    def replaced() -> bool:
        status, body = get_json(port, "/readyz")
        pids = set(body["processes_ready"])
        return status == 200 and str(victim) not in pids and len(pids) == 2

    wait_for(replaced, 60, "the killed pool process replaced and ready")
    after = scrape(port)
    assert total(after, COMMITTED) == 5
    assert total(after, "rerankq_failovers_total") == 4
    assert total(after, "rerankq_pair_cache_hits_total") == 10
    assert (directory / f"counter_{victim}.db").exists()
    assert not list(directory.glob(f"gauge_live*_{victim}.db"))


@pytest.mark.slow
def test_threads_pool_metrics_while_streams_run(start_worker, make_client, tiny_model_dir, tmp_path):
    port, env = metrics_env(tmp_path)
    start_worker(env=env, args=["--device", "cpu", "--pool", "threads", "--threads", "4"])
    client = make_client()
    wait_for(lambda: status_of(port, "/readyz") == 200, 60, "the worker ready")
    assert get_json(port, "/healthz") == (200, {"ok": True, "redis": True, "broker": True})

    scrapes: list[float] = []
    stop = threading.Event()

    def scrape_while_running() -> None:
        while not stop.is_set():
            assert_never_ahead_of_the_store(port, client)
            scrapes.append(total(scrape(port), COMMITTED))
            time.sleep(0.05)

    scraper = threading.Thread(target=scrape_while_running)
    scraper.start()
    try:
        streams = [
            client.open(f"query {i}", make_candidates(30, prefix=f"s{i}"), window_size=10, first_windows=3)
            for i in range(3)
        ]
        for stream in streams:
            pull_until_complete(client, stream, 30)
    finally:
        stop.set()
        scraper.join()
    assert scrapes == sorted(scrapes)  # a counter never goes back

    settled(port, client)
    samples = scrape(port)
    counters = client.store.counters()
    assert total(samples, COMMITTED) == counters["windows_committed"] == 9
    assert total(samples, COMMITTED, device="cpu", member="0:local", outcome="ranked") == 9
    assert total(samples, "rerankq_provider_requests_total", member="0:local") == counters["provider_calls:0:local"]
    assert total(samples, "rerankq_pairs_scored_total", member="0:local", device="cpu") == 90
    assert total(samples, "rerankq_pair_cache_misses_total") == counters["pair_cache_misses"] == 90
    assert total(samples, "rerankq_batch_padding_ratio_count", device="cpu") >= 1
    assert 0 <= total(samples, "rerankq_batch_padding_ratio_sum") <= total(samples, "rerankq_batch_padding_ratio_count")
    info = series(samples, "rerankq_worker_info")
    assert info == [
        {
            "version": "0.1.0",
            "device": "cpu",
            "model": str(tiny_model_dir),
            "precision": "fp32",
            "torch_threads": "1",
            "pool": "threads",
        }
    ]
    assert total(samples, "rerankq_chain_member_started", member="0:local") == 1
    assert "rerankq_breaker_state" not in {s.name for s in samples}  # no remote member

    again = client.open("query 0", make_candidates(30, prefix="s0"), window_size=10, first_windows=3)
    pull_until_complete(client, again, 30)
    settled(port, client)
    samples = scrape(port)
    counters = client.store.counters()
    assert total(samples, "rerankq_pair_cache_hits_total", member="0:local") == counters["pair_cache_hits"] == 30
    assert total(samples, COMMITTED) == counters["windows_committed"] == 12


@pytest.mark.slow
def test_not_ready_without_a_scoring_member_and_the_health_probe(start_worker, make_client, tmp_path):
    """A worker told to serve though its model cannot load serves fusion order: alive, healthy, not ready."""
    stale = tmp_path / "metrics" / "worker-999999999"
    stale.mkdir(parents=True)
    port, env = metrics_env(
        tmp_path,
        RERANKQ_RERANKER_MODEL=str(tmp_path / "no-such-model"),
        RERANKQ_RERANKER_1_PROVIDER="rrf",
        RERANKQ_SERVE_WITHOUT_SCORING="true",
    )
    worker = start_worker(env=env)
    assert not stale.exists()  # a directory of a worker that is gone is removed
    assert (tmp_path / "metrics" / f"worker-{worker.proc.pid}").is_dir()

    status, body = wait_for(
        lambda: (r := get_json(port, "/readyz")) and r[1]["processes_ready"] and r, 60, "the pool process to report"
    )
    assert status == 503
    assert body["members_started"] == {"0:local": False, "1:rrf": True}
    assert get_json(port, "/healthz")[0] == 200
    assert total(scrape(port), "rerankq_worker_ready") == 0

    probe_env = {**os.environ, "RERANKQ_METRICS_PORT": str(port), "PYTHONPATH": str(ROOT)}
    ready = subprocess.run(
        [sys.executable, "-m", "worker.metrics.probe", "/readyz"],
        env=probe_env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    healthy = subprocess.run(
        [sys.executable, "-m", "worker.metrics.probe", "/healthz"],
        env=probe_env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (ready.returncode, healthy.returncode) == (1, 0)
    assert "answered 503" in ready.stderr and '"0:local": false' in ready.stderr

    # Windows still commit (fusion order), and are counted as served by rrf.
    client = make_client()
    stream = client.open("gateway error", make_candidates(10), window_size=10, allow_shallow=True)
    pull_until_complete(client, stream, 10)
    settled(port, client)
    samples = scrape(port)
    assert total(samples, COMMITTED, member="1:rrf") == client.store.counters()["windows_committed"] == 1
    # Passed over because it never started: counted apart from failovers.
    assert total(samples, "rerankq_members_not_started_total", member="0:local") == 1
    assert total(samples, "rerankq_failovers_total") == 0


@pytest.mark.parametrize("value", ["0", "70000", "port"])
def test_a_bad_metrics_port_fails_at_start(value, base_env):
    from kernel.errors import ConfigError
    from kernel.settings import load_settings

    with pytest.raises(ConfigError) as caught:
        load_settings({**base_env, "RERANKQ_METRICS_PORT": value})
    assert caught.value.args and "RERANKQ_METRICS_PORT" in str(caught.value)


def test_sweep_resends_are_counted_by_the_main_process(start_worker, make_client, tmp_path):
    """The sweep runs in a prefork worker's main process: its counts are merged with the pool's."""
    from test_sweep import _open_without_dispatch

    client = make_client(redeliver_after_s=2)
    stream = _open_without_dispatch(client, 20, 10, 2, grace_s=1)  # admitted, never sent
    port, env = metrics_env(tmp_path, **provider_env("FastProvider", redeliver_after_s=2, sweep_interval_s=1))
    worker = start_worker(env=env)
    wait_for(lambda: len(client.store.snapshot(stream).results) == 2, 30, "the sweep to recover both windows", 0.2)
    settled(port, client)

    samples = scrape(port)
    counters = client.store.counters()
    assert total(samples, "rerankq_windows_redelivered_total") == counters["windows_redelivered"] == 2
    assert total(samples, COMMITTED) == counters["windows_committed"] == 2
    directory = tmp_path / "metrics" / f"worker-{worker.proc.pid}"
    assert (directory / f"counter_{worker.proc.pid}.db").exists()  # written by the main process


def test_poisoned_windows_and_attempts_again_survive_the_processes_that_died(start_worker, make_client, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    port, env = metrics_env(tmp_path, **provider_env("SuicideProvider", mark_dir=marks, max_attempts=2))
    start_worker(env=env)
    client = make_client(max_attempts=2)
    stream = client.open("payment gateway error", make_candidates(5), window_size=5)
    pull_until_complete(client, stream, 5, timeout_s=90)
    settled(port, client)

    samples = scrape(port)
    counters = client.store.counters()
    assert total(samples, COMMITTED, member="none", outcome="poisoned") == counters["windows_poisoned"] == 1
    # Attempts 2 and 3 began a window already attempted; the processes that counted them are gone.
    assert client.status(stream).windows[0].attempts == 2
    assert total(samples, "rerankq_window_attempts_again_total", device="cpu") == 2
    assert total(samples, "rerankq_window_queue_wait_seconds_count") == 1  # the first attempt only
    dead = {int(p.name.split(".")[0]) for p in marks.iterdir()}
    assert len(dead) == 2
    live = {int(s["pid"]) for s in series(samples, "rerankq_worker_process_ready")}
    assert live and not live & dead
