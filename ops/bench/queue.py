"""Queue overhead: what rerankq adds over Celery itself, and what a deeper pull costs.

1. One-window streams (open -> committed -> page read) with a provider that does
   nothing, alternated with a raw Celery no-op round trip (send, worker runs it, the
   result comes back) on the same private Redis, in the same run. The difference of
   the medians is the project's overhead per stream.
2. The same streams with the model (a MiniLM-L6-sized cross-encoder).
3. A deeper pull over a committed 300-candidate stream: page reads that must cost no
   provider call.

    python -m ops.bench.queue --quick --json /tmp/queue.json
    python -m ops.bench.queue --profile      (where the time goes: ops/bench/hotpath.py)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from kernel.settings import load_settings
from ops.bench.common import (
    ROOT,
    bench_model,
    candidates,
    p50,
    percentile,
    print_table,
    rerankq_worker,
    worker_env,
    write_json,
)
from producer import RerankClient
from worker.embedded.redis_server import EmbeddedRedis
from worker.embedded.worker_process import WorkerProcess

WINDOW = 25


def timed_stream(client: RerankClient, query: str, n: int) -> float:
    start = time.perf_counter()
    stream = client.open(query, candidates(n, query), window_size=WINDOW)
    page = client.pull(stream, 0, WINDOW, timeout=60)
    elapsed = (time.perf_counter() - start) * 1000
    if len(page.rows) != min(n, WINDOW):
        raise RuntimeError(f"stream {stream}: {len(page.rows)} rows")
    return elapsed


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a CrossEncoder directory for step 2 (default: the bench model)")
    parser.add_argument("--streams", type=int, default=None, help="one-window streams per arm")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", dest="json_path")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="instead: one window's per-step costs and Redis round trips (ops/bench/hotpath.py)",
    )
    return parser.parse_args()


@dataclasses.dataclass
class Timings:
    """Milliseconds of every arm, and the provider calls the deep pull's pages cost."""

    raw_ms: list[float]
    stream_ms: list[float]
    page_ms: list[float]
    model_ms: list[float]
    deep_pull_calls: int


def raw_celery_worker(ns: str, env: dict[str, str], logs: Path) -> WorkerProcess:
    """A plain Celery worker serving ops.bench.raw_celery's no-op: the round trip rerankq is set against."""
    return WorkerProcess(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "ops.bench.raw_celery",
            "worker",
            "--pool=prefork",
            "--concurrency=1",
            f"--queues={ns}.raw",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--loglevel=INFO",
            f"--hostname=raw-{ns}@%h",
        ],
        env,
        logs / "raw.log",
        cwd=ROOT,
    )


def noop_arms(client: RerankClient, ns: str, n_streams: int) -> tuple[list[float], list[float]]:
    """Raw Celery round trips and no-op one-window streams, alternated; checks the no-op provider served them."""
    from ops.bench import raw_celery

    def raw_round_trip(i: int) -> float:
        start = time.perf_counter()
        raw_celery.noop.apply_async(args=[f"s{i}", 0], queue=f"{ns}.raw").get(timeout=60)
        return (time.perf_counter() - start) * 1000

    for i in range(5):  # warm both paths: connections, scripts, first-call imports
        raw_round_trip(i)
        timed_stream(client, f"warm {i}", WINDOW)
    raw_ms, stream_ms = [], []
    for i in range(n_streams):
        raw_ms.append(raw_round_trip(i))
        stream_ms.append(timed_stream(client, f"query {i}", WINDOW))
    print(f"one-window streams: {n_streams} each, alternated", flush=True)
    counters = client.store.counters()
    if counters.get("windows_failed") or not any(k.startswith("provider_calls:0:ops.bench") for k in counters):
        raise RuntimeError(f"the no-op provider did not serve the streams: {counters}")
    return raw_ms, stream_ms


def provider_calls(client: RerankClient) -> int:
    return sum(v for k, v in client.store.counters().items() if k.startswith("provider_calls:"))


def deep_pull(client: RerankClient, n_pages: int) -> tuple[list[float], int]:
    """Page reads over a 300-candidate stream committed first: their times and the provider calls they cost."""
    deep = client.open("deep pull query", candidates(300, "deep"), window_size=WINDOW, first_windows=300 // WINDOW)
    full = client.pull(deep, 0, 300, timeout=120)
    assert len(full.rows) == 300, len(full.rows)
    calls_before = provider_calls(client)
    rng = random.Random(0)
    page_ms = []
    for _ in range(n_pages):
        offset = rng.randrange(0, 290)
        start = time.perf_counter()
        page = client.pull(deep, offset, 10, timeout=5)
        page_ms.append((time.perf_counter() - start) * 1000)
        assert len(page.rows) == 10
    return page_ms, provider_calls(client) - calls_before


def model_streams(client: RerankClient, n_model_streams: int) -> list[float]:
    for i in range(2):
        timed_stream(client, f"model warm {i}", WINDOW)
    return [timed_stream(client, f"model query {i}", WINDOW) for i in range(n_model_streams)]


def run_arms(model: str | None, *, n_streams: int, n_model_streams: int, n_pages: int) -> Timings:
    """The no-op arms and the deep pull on no-op workers, then the model arm on a model worker, one private Redis."""
    redis_server = EmbeddedRedis().start()
    logs = Path(tempfile.mkdtemp(prefix="rerankq-bench-queue-"))
    workers: list[WorkerProcess] = []
    try:
        ns = "bq"
        noop_env = worker_env(redis_server.url, ns, RERANKQ_RERANKER_PROVIDER="ops.bench.noop_provider:NoopProvider")
        raw_env = {**noop_env, "BENCH_RAW_QUEUE": f"{ns}.raw"}
        raw = raw_celery_worker(ns, raw_env, logs)
        noop = rerankq_worker(noop_env, logs / "noop.log")
        for w in (raw, noop):
            workers.append(w.start())

        # The raw app reads its settings from the environment, as its worker does.
        os.environ.update({k: v for k, v in raw_env.items() if k.startswith("RERANKQ_") or k == "BENCH_RAW_QUEUE"})
        client = RerankClient(load_settings(noop_env))
        raw_ms, stream_ms = noop_arms(client, ns, n_streams)
        page_ms, deep_pull_calls = deep_pull(client, n_pages)
        noop.stop()
        raw.stop()

        model_path = model or str(bench_model())
        model_env = worker_env(
            redis_server.url, ns, RERANKQ_RERANKER_PROVIDER="local", RERANKQ_RERANKER_MODEL=model_path
        )
        workers.append(rerankq_worker(model_env, logs / "model.log").start())
        model_ms = model_streams(client, n_model_streams)
        client.close()
    finally:
        for w in workers:
            w.stop()
        redis_server.stop()
    return Timings(raw_ms, stream_ms, page_ms, model_ms, deep_pull_calls)


def latency_row(arm: str, values: list[float]) -> list[object]:
    return [arm, len(values), p50(values), percentile(values, 0.9), percentile(values, 0.99)]


def print_timings(timings: Timings) -> None:
    print_table(
        "queue: milliseconds per one-window stream (25 candidates), private redis, same run",
        ["arm", "n", "p50 ms", "p90 ms", "p99 ms"],
        [
            latency_row("raw Celery no-op round trip", timings.raw_ms),
            latency_row("stream, no-op provider", timings.stream_ms),
            ["overhead (p50 difference)", "", p50(timings.stream_ms) - p50(timings.raw_ms), "", ""],
            latency_row("stream, MiniLM-L6-sized model", timings.model_ms),
            latency_row("deep pull page (10 rows of 300)", timings.page_ms),
        ],
    )
    print(f"\ndeep pull provider calls: {timings.deep_pull_calls}")


def figures(timings: Timings, *, n_streams: int, n_pages: int) -> dict[str, object]:
    raw_p50, stream_p50 = p50(timings.raw_ms), p50(timings.stream_ms)
    return {
        "raw_celery_ms_p50": raw_p50,
        "stream_ms_p50": stream_p50,
        "overhead_ms_p50": stream_p50 - raw_p50,
        "model_stream_ms_p50": p50(timings.model_ms),
        "deep_pull_provider_calls": timings.deep_pull_calls,
        "deep_pull_ms_p50": p50(timings.page_ms),
        "raw_celery_ms_p90": percentile(timings.raw_ms, 0.9),
        "stream_ms_p90": percentile(timings.stream_ms, 0.9),
        "deep_pull_ms_p90": percentile(timings.page_ms, 0.9),
        "streams": n_streams,
        "pages": n_pages,
    }


def main() -> None:
    args = parse_arguments()
    if args.profile:
        from ops.bench import hotpath

        hotpath.main(["--json", args.json_path] if args.json_path else [])
        return
    n_streams = args.streams or (60 if args.quick else 300)
    n_pages = 100 if args.quick else 500
    timings = run_arms(args.model, n_streams=n_streams, n_model_streams=8 if args.quick else 30, n_pages=n_pages)
    print_timings(timings)
    write_json(args.json_path, figures(timings, n_streams=n_streams, n_pages=n_pages))


if __name__ == "__main__":
    main()
