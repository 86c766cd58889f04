"""Scale: window throughput of one CPU worker with 1 and 2 processes, and its memory.

Each configuration gets its own worker on one private Redis and the same load, in
alternated rounds: many one-window streams (25 realistic candidates each: documents
log-normally sized around 150 tokens) opened at once, then read to the end. Throughput is pairs scored
per second from the first open to the last page; memory is each worker process's
resident set after the run (one model copy per process). A third row runs the
threads pool with coalescing, the GPU worker's code path, on the CPU.

    python -m ops.bench.scale --quick --json /tmp/scale.json
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from kernel.settings import load_settings
from ops.bench.common import (
    bench_model,
    cpu_quota,
    p50,
    print_table,
    realistic_pairs,
    rerankq_worker,
    worker_env,
    write_json,
)
from producer import RerankClient
from worker.embedded.redis_server import EmbeddedRedis

WINDOW = 25


def run_load(client: RerankClient, pairs: list[tuple[str, str]], tag: str) -> float:
    """Open every stream at once, read them all; pairs per second over the whole run."""
    streams_pairs = [pairs[i : i + WINDOW] for i in range(0, len(pairs), WINDOW)]
    start = time.perf_counter()
    streams = []
    for window in streams_pairs:
        query = f"{window[0][0]} {tag}"  # a query no other run used: nothing comes from a cache
        streams.append(
            client.open(query, [{"id": f"c{i}", "text": d} for i, (_, d) in enumerate(window)], window_size=WINDOW)
        )
    for stream in streams:
        page = client.pull(stream, 0, WINDOW, timeout=600)
        if len(page.rows) != WINDOW or any(r.kind != "ranked" for r in page.rows):
            raise RuntimeError(f"stream {stream} not fully ranked: {[r.kind for r in page.rows]}")
    return len(pairs) / (time.perf_counter() - start)


CONFIGS = [
    ("prefork, 1 process", "1", ["--processes", "1"]),
    ("prefork, 2 processes", "2", ["--processes", "2"]),
    ("threads pool + coalescing, 1 process", "1-threads", ["--pool", "threads", "--threads", "4"]),
]


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a CrossEncoder directory (default: the MiniLM-L6-sized bench model)")
    parser.add_argument("--streams", type=int, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", dest="json_path")
    return parser.parse_args()


def measure(
    model_path: str, pairs: list[tuple[str, str]], warm: list[tuple[str, str]], rounds: int
) -> tuple[dict[str, list[float]], dict[str, dict[str, float]]]:
    """Each configuration's pairs/s per round, and its worker's resident MB per process."""
    redis_server = EmbeddedRedis().start()
    logs = Path(tempfile.mkdtemp(prefix="rerankq-bench-scale-"))
    # Every configuration's worker runs at once (an idle worker costs no CPU) and the
    # load alternates between them round by round, so machine noise hits each alike.
    workers, clients = [], []
    rates: dict[str, list[float]] = {key: [] for _, key, _ in CONFIGS}
    try:
        for k, (_name, _key, worker_args) in enumerate(CONFIGS):
            ns = f"bs{k}"
            env = worker_env(
                redis_server.url,
                ns,
                RERANKQ_RERANKER_PROVIDER="local",
                RERANKQ_RERANKER_MODEL=model_path,
                RERANKQ_PAIR_CACHE="false",
            )
            workers.append(rerankq_worker(env, logs / f"{ns}.log", *worker_args).start())
            clients.append(RerankClient(load_settings(env)))
            run_load(clients[-1], warm, f"warm{k}")
        for round_ in range(rounds):
            for k, (_name, key, _) in enumerate(CONFIGS):
                rates[key].append(run_load(clients[k], pairs, f"r{round_}c{k}"))
            print(
                f"round {round_ + 1}/{rounds}: " + ", ".join(f"{key} {v[-1]:.1f}/s" for key, v in rates.items()),
                flush=True,
            )
        rss = {key: workers[k].rss_mb() for k, (_, key, _) in enumerate(CONFIGS)}
    finally:
        for client in clients:
            client.close()
        for worker in workers:
            worker.stop()
        redis_server.stop()
    return rates, rss


def scale_rows(
    rates: dict[str, list[float]], rss: dict[str, dict[str, float]], n_pairs: int
) -> tuple[list[list[object]], dict[str, float]]:
    rows, by_workers = [], {}
    for name, key, _ in CONFIGS:
        by_workers[key] = p50(rates[key])
        model_processes = {n: v for n, v in rss[key].items() if n != "parent"} or rss[key]
        rows.append(
            [name, by_workers[key], n_pairs, round(max(model_processes.values())), round(sum(rss[key].values()))]
        )
    return rows, by_workers


def main() -> None:
    args = parse_arguments()
    n_streams = args.streams or (4 if args.quick else 16)
    rounds = 2 if args.quick else 3
    model_path = args.model or str(bench_model())

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    pairs = realistic_pairs(n_windows=n_streams, window_size=WINDOW, tokenizer=tokenizer, seed=7)
    warm = realistic_pairs(n_windows=1, window_size=WINDOW, tokenizer=tokenizer, seed=8)
    quota = cpu_quota()
    rates, rss = measure(model_path, pairs, warm, rounds)
    rows, by_workers = scale_rows(rates, rss, len(pairs))
    print_table(
        f"scale: {n_streams} one-window streams of {WINDOW} pairs per round, {rounds} alternated rounds, "
        f"{quota} cores, model {model_path}",
        ["worker", "pairs/s", "pairs", "RSS per model process MB", "RSS total MB"],
        rows,
    )
    one_process = {n: v for n, v in rss["1"].items() if n != "parent"}
    write_json(
        args.json_path,
        {
            "pairs_per_s_by_workers": by_workers,
            "worker_rss_mb": max(one_process.values()) if one_process else rss["1"]["parent"],
            "worker_rss_mb_by_workers": rss,
            "pairs_per_s_rounds": rates,
            "streams": n_streams,
            "window": WINDOW,
            "cores": quota,
            "rounds": rounds,
        },
    )


if __name__ == "__main__":
    main()
