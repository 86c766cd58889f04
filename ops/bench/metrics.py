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
import os
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

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


def window_path(
    redis_url: str, provider_env: dict[str, str], *, rounds: int, windows: int, window_size: int
) -> dict[str, float]:
    """CPU time (this process) per window through ``WindowScorer.process``, metrics off vs on."""
    from worker.logs import configure_logging
    from worker.metrics.multiprocess import prepare

    configure_logging(level="WARNING", json=False)
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        prepare(Path(tempfile.mkdtemp(prefix="rerankq-bench-metrics-files-")))
    from kernel.wire import Candidate, StreamSpec
    from worker.metrics.definitions import WorkerMetrics
    from worker.metrics.recorder import NO_METRICS
    from worker.runtime import Runtime

    settings = load_settings(
        worker_env(redis_url, f"bm-path-{os.urandom(3).hex()}", **provider_env), pair_cache=False, torch_threads=1
    )
    runtimes = {
        "off": Runtime(settings, NO_METRICS),
        "on": Runtime(settings, WorkerMetrics(device="cpu", pool="prefork")),
    }
    for runtime in runtimes.values():
        runtime.warm_up()
    per_stream = 5
    made = 0

    def streams(n: int) -> list[str]:
        nonlocal made
        out = []
        for _ in range(n):
            made += 1
            stream = f"s_{made:032x}"
            spec = StreamSpec(query=f"query {made}", window_size=window_size, n_candidates=window_size * per_stream)
            cands = [Candidate(id=f"c{i}", text=f"incident note {i}") for i in range(window_size * per_stream)]
            runtimes["off"].store.open(
                stream, spec, cands, first_windows=per_stream, enqueue_grace_s=3600, fingerprint="bench"
            )
            out.append(stream)
        return out

    def run(arm: str) -> float:
        opened = streams(max(1, windows // per_stream))
        for member in runtimes[arm].chain.members:
            engine = getattr(member.checked, "engine", None)
            if engine is not None:  # one engine per model per process: both arms share it
                engine.on_batch = runtimes[arm].recorder.batch_padding
        start = time.process_time()
        for stream in opened:
            for window in range(per_stream):
                runtimes[arm].scorer.process(stream, window, delivery="bench")
        return (time.process_time() - start) / (len(opened) * per_stream)

    run("off"), run("on")  # warm
    per_window: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(rounds):
        for arm in ("off", "on") if r % 2 == 0 else ("on", "off"):
            per_window[arm].append(run(arm))
    for runtime in runtimes.values():
        runtime.close()
    off, on = p50(per_window["off"]) * 1e6, p50(per_window["on"]) * 1e6
    added = statistics.median(b - a for a, b in zip(per_window["off"], per_window["on"])) * 1e6
    return {"off_us_per_window": off, "on_us_per_window": on, "added_us_per_window": added}


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
        seconds: dict[str, list[float]] = {"off": [], "on": []}
        cpu: dict[str, list[float]] = {"off": [], "on": []}
        main_cpu: dict[str, list[float]] = {"off": [], "on": []}
        ratios = []
        total_windows = streams * windows
        with Scraper(port, scrape_interval_s) as scraper:
            for r in range(rounds):
                order = ("off", "on") if r % 2 == 0 else ("on", "off")
                took = {}
                for arm in order:
                    pool_before, main_before = cpu_seconds(workers[arm])
                    took[arm] = drain(
                        clients[arm], f"r{r}-{arm}", streams=streams, windows=windows, window_size=window_size
                    )
                    pool_after, main_after = cpu_seconds(workers[arm])
                    cpu[arm].append((pool_after - pool_before) / total_windows)
                    main_cpu[arm].append((main_after - main_before) / total_windows)
                    seconds[arm].append(took[arm])
                ratios.append(took["off"] / took["on"])  # throughput on / throughput off
                print(
                    f"{label} round {r + 1}/{rounds}: off {took['off']:.2f} s, on {took['on']:.2f} s; pool CPU "
                    f"per window off {cpu['off'][-1] * 1000:.3f} ms, on {cpu['on'][-1] * 1000:.3f} ms",
                    flush=True,
                )
        for arm, client in clients.items():
            committed = client.store.counters().get("windows_committed", 0)
            expected = total_windows * rounds + 4
            if committed != expected:
                raise RuntimeError(f"{arm}: {committed} windows committed, expected {expected}")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            exposition = reply.read().decode()
        if f'outcome="ranked"}} {float(total_windows * rounds + 4)}' not in exposition:
            raise RuntimeError("the metrics arm's rerankq_windows_committed_total does not match the store")
        return {
            "windows_per_round": total_windows,
            "off_windows_per_s": total_windows / p50(seconds["off"]),
            "on_windows_per_s": total_windows / p50(seconds["on"]),
            "ratio_p50": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "off_cpu_ms_per_window": p50(cpu["off"]) * 1000,
            "on_cpu_ms_per_window": p50(cpu["on"]) * 1000,
            "off_main_cpu_ms_per_window": p50(main_cpu["off"]) * 1000,
            "on_main_cpu_ms_per_window": p50(main_cpu["on"]) * 1000,
            "scrapes": scraper.scrapes,
        }
    finally:
        for client in clients.values():
            client.close()
        for worker in workers.values():
            worker.stop()


def main() -> None:
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
    args = parser.parse_args()
    rounds = args.rounds or (6 if args.quick else 16)

    redis_server = EmbeddedRedis().start()
    logs = Path(tempfile.mkdtemp(prefix="rerankq-bench-metrics-"))
    figures: dict[str, object] = {}
    try:
        noop = {"RERANKQ_RERANKER_PROVIDER": "ops.bench.noop_provider:NoopProvider"}
        paths = {"noop": window_path(redis_server.url, noop, rounds=rounds * 2, windows=200, window_size=5)}
        if args.model:
            model_env = {
                "RERANKQ_RERANKER_PROVIDER": "local",
                "RERANKQ_RERANKER_MODEL": str(bench_model()) if args.model == "bench" else args.model,
            }
            paths["model"] = window_path(
                redis_server.url, model_env, rounds=max(4, rounds // 2), windows=5, window_size=25
            )
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
        figures["window_path"] = paths
        figures["noop"] = compare(
            redis_server.url,
            logs,
            "noop",
            {"RERANKQ_RERANKER_PROVIDER": "ops.bench.noop_provider:NoopProvider"},
            rounds=rounds,
            streams=8,
            windows=50,
            window_size=5,
        )
        if args.model:
            model = str(bench_model()) if args.model == "bench" else args.model
            figures["model"] = compare(
                redis_server.url,
                logs,
                "model",
                {"RERANKQ_RERANKER_PROVIDER": "local", "RERANKQ_RERANKER_MODEL": model},
                rounds=max(2, rounds // 4),
                streams=2,
                windows=8,
                window_size=25,
            )
    finally:
        redis_server.stop()

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
    write_json(args.json_path, figures)


if __name__ == "__main__":
    main()
