"""What metrics cost: window throughput of a worker with metrics on against the same worker
with metrics off, side by side in one run; and the CPU they add to one window.

First, the window path alone (begin, chain, decide, commit against the private Redis, the
provider doing nothing) run in this process with metrics off and on, alternated: the CPU time
the metrics add to a window, free of Celery and of the other processes' noise.

Two workers run at once on one private Redis, each on its own queues: one without
RERANKQ_METRICS_PORT, one with it (and scraped every second, as a busy Prometheus would).
Rounds alternate which arm goes first, and only one arm is busy at a time, so machine noise
hits both. Each round opens streams whose windows are all sent at once and reads them back
committed; throughput is windows per second. The provider does nothing by default, so a
window costs only the queue, the store and the metrics: the worst case for their share. With
--model, a MiniLM-L6-sized cross-encoder arm is run too (the realistic case).

    python -m ops.bench.metrics --quick --json /tmp/metrics.json
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from kernel.settings import load_settings
from ops.bench.common import bench_model, p50, print_table, rerankq_worker, worker_env, write_json
from producer import RerankClient
from worker.embedded.redis_server import EmbeddedRedis, free_port
from worker.embedded.worker_process import WorkerProcess


def candidates(n: int, tag: str) -> list[dict[str, str]]:
    return [{"id": f"c{i}", "text": f"{tag} incident note {i}: the gateway returned 502"} for i in range(n)]


def cpu_seconds(worker: WorkerProcess) -> tuple[float, float]:
    """User + system CPU time so far of the worker's pool processes (where windows are
    scored) and of its main process (the consumer, the sweep, and the metrics endpoint)."""
    import psutil

    assert worker.proc is not None
    main = psutil.Process(worker.proc.pid)

    def used(proc: psutil.Process) -> float:
        times = proc.cpu_times()
        return times.user + times.system

    return sum(used(child) for child in main.children(recursive=True)), used(main)


def drain(client: RerankClient, tag: str, *, streams: int, windows: int, window_size: int) -> float:
    """Seconds from the first open to every window of every stream committed."""
    n = windows * window_size
    start = time.perf_counter()
    opened = [
        client.open(
            f"{tag} query {s}",
            candidates(n, f"{tag}-{s}"),
            window_size=window_size,
            first_windows=windows,
            allow_shallow=True,
        )
        for s in range(streams)
    ]
    for stream in opened:
        page = client.pull(stream, 0, n, timeout=300)
        while not page.complete:
            page = client.pull(stream, 0, n, timeout=300)
    return time.perf_counter() - start


class Scraper:
    """GETs /metrics every ``interval_s`` while running, as Prometheus would."""

    def __init__(self, port: int, interval_s: float) -> None:
        self.port, self.interval_s = port, interval_s
        self.scrapes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as reply:
                reply.read()
            self.scrapes += 1

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class WindowPath:
    """Both arms' runtimes in this process (metrics off and on), and streams opened straight in
    the store for their scorers to process."""

    per_stream = 5

    def __init__(self, redis_url: str, provider_env: dict[str, str], window_size: int) -> None:
        from worker.logs import configure_logging
        from worker.metrics.multiprocess import prepare

        configure_logging(level="WARNING", json=False)
        if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
            prepare(Path(tempfile.mkdtemp(prefix="rerankq-bench-metrics-files-")))
        # Imported once the multiprocess directory is set: the metrics read it when loaded.
        from worker.metrics.definitions import WorkerMetrics
        from worker.metrics.recorder import NO_METRICS
        from worker.runtime import Runtime

        settings = load_settings(
            worker_env(redis_url, f"bm-path-{os.urandom(3).hex()}", **provider_env), pair_cache=False, torch_threads=1
        )
        self.runtimes = {
            "off": Runtime(settings, NO_METRICS),
            "on": Runtime(settings, WorkerMetrics(device="cpu", pool="prefork")),
        }
        for runtime in self.runtimes.values():
            runtime.warm_up()
        self.window_size = window_size
        self.made = 0

    def streams(self, n: int) -> list[str]:
        from kernel.wire import Candidate, StreamSpec

        out = []
        n_candidates = self.window_size * self.per_stream
        for _ in range(n):
            self.made += 1
            stream = f"s_{self.made:032x}"
            spec = StreamSpec(query=f"query {self.made}", window_size=self.window_size, n_candidates=n_candidates)
            cands = [Candidate(id=f"c{i}", text=f"incident note {i}") for i in range(n_candidates)]
            self.runtimes["off"].store.open(
                stream, spec, cands, first_windows=self.per_stream, enqueue_grace_s=3600, fingerprint="bench"
            )
            out.append(stream)
        return out

    def run(self, arm: str, windows: int) -> float:
        """CPU seconds per window of about ``windows`` windows through ``arm``'s scorer."""
        opened = self.streams(max(1, windows // self.per_stream))
        for member in self.runtimes[arm].chain.members:
            engine = getattr(member.checked, "engine", None)
            if engine is not None:  # one engine per model per process: both arms share it
                engine.on_batch = self.runtimes[arm].recorder.batch_padding
        start = time.process_time()
        for stream in opened:
            for window in range(self.per_stream):
                self.runtimes[arm].scorer.process(stream, window, delivery="bench")
        return (time.process_time() - start) / (len(opened) * self.per_stream)

    def close(self) -> None:
        for runtime in self.runtimes.values():
            runtime.close()


def window_path(
    redis_url: str, provider_env: dict[str, str], *, rounds: int, windows: int, window_size: int
) -> dict[str, float]:
    """CPU time (this process) per window through ``WindowScorer.process``, metrics off vs on."""
    path = WindowPath(redis_url, provider_env, window_size)
    path.run("off", windows), path.run("on", windows)  # warm
    per_window: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(rounds):
        for arm in ("off", "on") if r % 2 == 0 else ("on", "off"):
            per_window[arm].append(path.run(arm, windows))
    path.close()
    off, on = p50(per_window["off"]) * 1e6, p50(per_window["on"]) * 1e6
    added = statistics.median(b - a for a, b in zip(per_window["off"], per_window["on"])) * 1e6
    return {"off_us_per_window": off, "on_us_per_window": on, "added_us_per_window": added}


@dataclasses.dataclass
class ArmTimes:
    """Per round and arm: seconds to drain, pool and main CPU seconds per window; per round, on/off throughput."""

    seconds: dict[str, list[float]] = dataclasses.field(default_factory=lambda: {"off": [], "on": []})
    cpu: dict[str, list[float]] = dataclasses.field(default_factory=lambda: {"off": [], "on": []})
    main_cpu: dict[str, list[float]] = dataclasses.field(default_factory=lambda: {"off": [], "on": []})
    ratios: list[float] = dataclasses.field(default_factory=list)


def alternate_arms(
    workers: dict[str, WorkerProcess],
    clients: dict[str, RerankClient],
    label: str,
    *,
    rounds: int,
    streams: int,
    windows: int,
    window_size: int,
) -> ArmTimes:
    times = ArmTimes()
    total_windows = streams * windows
    for r in range(rounds):
        order = ("off", "on") if r % 2 == 0 else ("on", "off")
        took = {}
        for arm in order:
            pool_before, main_before = cpu_seconds(workers[arm])
            took[arm] = drain(clients[arm], f"r{r}-{arm}", streams=streams, windows=windows, window_size=window_size)
            pool_after, main_after = cpu_seconds(workers[arm])
            times.cpu[arm].append((pool_after - pool_before) / total_windows)
            times.main_cpu[arm].append((main_after - main_before) / total_windows)
            times.seconds[arm].append(took[arm])
        times.ratios.append(took["off"] / took["on"])  # throughput on / throughput off
        print(
            f"{label} round {r + 1}/{rounds}: off {took['off']:.2f} s, on {took['on']:.2f} s; pool CPU "
            f"per window off {times.cpu['off'][-1] * 1000:.3f} ms, on {times.cpu['on'][-1] * 1000:.3f} ms",
            flush=True,
        )
    return times


def check_committed(clients: dict[str, RerankClient], port: int, expected: int) -> None:
    """Every window sent was committed, by the store's count and by the metrics arm's own."""
    for arm, client in clients.items():
        committed = client.store.counters().get("windows_committed", 0)
        if committed != expected:
            raise RuntimeError(f"{arm}: {committed} windows committed, expected {expected}")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        exposition = reply.read().decode()
    if f'outcome="ranked"}} {float(expected)}' not in exposition:
        raise RuntimeError("the metrics arm's rerankq_windows_committed_total does not match the store")


def compare_figures(times: ArmTimes, total_windows: int, scrapes: int) -> dict[str, object]:
    return {
        "windows_per_round": total_windows,
        "off_windows_per_s": total_windows / p50(times.seconds["off"]),
        "on_windows_per_s": total_windows / p50(times.seconds["on"]),
        "ratio_p50": statistics.median(times.ratios),
        "ratio_min": min(times.ratios),
        "ratio_max": max(times.ratios),
        "off_cpu_ms_per_window": p50(times.cpu["off"]) * 1000,
        "on_cpu_ms_per_window": p50(times.cpu["on"]) * 1000,
        "off_main_cpu_ms_per_window": p50(times.main_cpu["off"]) * 1000,
        "on_main_cpu_ms_per_window": p50(times.main_cpu["on"]) * 1000,
        "scrapes": scrapes,
    }


def compare(
    redis_url: str,
    logs: Path,
    label: str,
    provider_env: dict[str, str],
    *,
    rounds: int,
    streams: int,
    windows: int,
    window_size: int,
    scrape_interval_s: float = 1.0,
) -> dict[str, object]:
    port = free_port()
    envs = {
        "off": worker_env(redis_url, f"bm-{label}-off", **provider_env),
        "on": worker_env(
            redis_url,
            f"bm-{label}-on",
            **provider_env,
            RERANKQ_METRICS_PORT=str(port),
            RERANKQ_METRICS_DIR=str(logs / f"metrics-{label}"),
        ),
    }
    workers: dict[str, WorkerProcess] = {}
    clients: dict[str, RerankClient] = {}
    try:
        for arm, env in envs.items():
            workers[arm] = rerankq_worker(env, logs / f"{label}-{arm}.log", "--processes", "1").start()
            clients[arm] = RerankClient(load_settings(env))
        for arm in envs:  # warm both: connections, scripts, first-call imports
            drain(clients[arm], f"warm-{arm}", streams=1, windows=4, window_size=window_size)
        with Scraper(port, scrape_interval_s) as scraper:
            times = alternate_arms(
                workers, clients, label, rounds=rounds, streams=streams, windows=windows, window_size=window_size
            )
        check_committed(clients, port, streams * windows * rounds + 4)
        return compare_figures(times, streams * windows, scraper.scrapes)
    finally:
        for client in clients.values():
            client.close()
        for worker in workers.values():
            worker.stop()


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument(
        "--model",
        nargs="?",
        const="bench",
        default=None,
        help="also compare with a cross-encoder (a directory; default the bench model)",
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", dest="json_path")
    return parser.parse_args()


NOOP = {"RERANKQ_RERANKER_PROVIDER": "ops.bench.noop_provider:NoopProvider"}


def model_env(model: str) -> dict[str, str]:
    """The cross-encoder arm's provider: ``model`` a directory, or "bench" for the bench model."""
    return {
        "RERANKQ_RERANKER_PROVIDER": "local",
        "RERANKQ_RERANKER_MODEL": str(bench_model()) if model == "bench" else model,
    }


def window_paths(redis_url: str, model: str | None, rounds: int) -> dict[str, dict[str, float]]:
    paths = {"noop": window_path(redis_url, NOOP, rounds=rounds * 2, windows=200, window_size=5)}
    if model:
        paths["model"] = window_path(redis_url, model_env(model), rounds=max(4, rounds // 2), windows=5, window_size=25)
    print_table(
        "the window path in one process (begin, chain, decide, commit; torch on 1 thread): CPU "
        "microseconds per window, median of alternated rounds",
        ["provider", "metrics off", "metrics on", "added by metrics", "added"],
        [
            [
                label,
                p["off_us_per_window"],
                p["on_us_per_window"],
                p["added_us_per_window"],
                f"{p['added_us_per_window'] / p['off_us_per_window'] * 100:.2f}%",
            ]
            for label, p in paths.items()
        ],
    )
    return paths


def print_compare_table(figures: dict[str, Any]) -> None:
    rows = []
    for label, f in figures.items():
        if label == "window_path":
            continue
        rows.append(
            [
                label,
                f["windows_per_round"],
                f["off_windows_per_s"],
                f["on_windows_per_s"],
                f["ratio_p50"],
                f"{(1 - f['ratio_p50']) * 100:.1f}%",
                f"{f['ratio_min']:.2f}-{f['ratio_max']:.2f}",
                f["off_cpu_ms_per_window"],
                f["on_cpu_ms_per_window"],
                f"{(f['on_cpu_ms_per_window'] / f['off_cpu_ms_per_window'] - 1) * 100:.1f}%",
                f["off_main_cpu_ms_per_window"],
                f["on_main_cpu_ms_per_window"],
            ]
        )
    print_table(
        "metrics cost: one prefork worker process, metrics off vs on (scraped every 1 s), alternated rounds, "
        "same run; CPU per window in the pool process (scoring) and the main process (consumer, sweep, "
        "/metrics)",
        [
            "provider",
            "windows/round",
            "off win/s",
            "on win/s",
            "on/off p50",
            "throughput loss",
            "on/off range",
            "pool CPU ms/win off",
            "on",
            "added",
            "main CPU ms/win off",
            "on",
        ],
        rows,
    )


def main() -> None:
    args = parse_arguments()
    rounds = args.rounds or (6 if args.quick else 16)

    redis_server = EmbeddedRedis().start()
    logs = Path(tempfile.mkdtemp(prefix="rerankq-bench-metrics-"))
    figures: dict[str, Any] = {}
    try:
        figures["window_path"] = window_paths(redis_server.url, args.model, rounds)
        figures["noop"] = compare(
            redis_server.url, logs, "noop", NOOP, rounds=rounds, streams=8, windows=50, window_size=5
        )
        if args.model:
            figures["model"] = compare(
                redis_server.url,
                logs,
                "model",
                model_env(args.model),
                rounds=max(2, rounds // 4),
                streams=2,
                windows=8,
                window_size=25,
            )
    finally:
        redis_server.stop()
    print_compare_table(figures)
    write_json(args.json_path, figures)


if __name__ == "__main__":
    main()
