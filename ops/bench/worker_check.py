"""The coalescing path through real workers: a coalescing worker and a plain one score
the same streams; every stream must come back ranked by the model with the same order
(scores within a tolerance: batch composition moves the last digits), and the
coalescing worker must have shared forward passes between windows.

On a GPU: ``--device gpu`` (the GPU worker: threads pool, coalescing on by default).
On a CPU: ``--device cpu`` runs the same code path with ``--pool threads``.

    python -m ops.bench.worker_check --device cpu --quick
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kernel.settings import load_settings
from ops.bench.common import ROOT, bench_model, print_table, realistic_pairs, worker_env, write_json
from producer import RerankClient
from worker.embedded.redis_server import EmbeddedRedis
from worker.embedded.worker_process import WorkerProcess

WINDOW = 25


def score_all(client: RerankClient, streams_pairs: list[list[tuple[str, str]]], device: str) -> tuple[list, float]:
    start = time.perf_counter()
    streams = [
        client.open(
            w[0][0], [{"id": f"c{i}", "text": d} for i, (_, d) in enumerate(w)], window_size=WINDOW, device=device
        )
        for w in streams_pairs
    ]
    pages = [client.pull(s, 0, WINDOW, timeout=300) for s in streams]
    return pages, sum(len(w) for w in streams_pairs) / (time.perf_counter() - start)


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--model")
    parser.add_argument("--streams", type=int, default=None)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--tolerance", type=float, default=None, help="max |score difference| allowed")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", dest="json_path")
    return parser.parse_args()


def stream_pairs(model_path: str, n_streams: int) -> list[list[tuple[str, str]]]:
    from transformers import AutoTokenizer

    pairs = realistic_pairs(
        n_windows=n_streams, window_size=WINDOW, tokenizer=AutoTokenizer.from_pretrained(model_path), seed=11
    )
    return [pairs[i : i + WINDOW] for i in range(0, len(pairs), WINDOW)]


def run_worker(
    redis_url: str,
    log_path: Path,
    name: str,
    coalesce: str,
    *,
    model_path: str,
    args: argparse.Namespace,
    streams_pairs: list[list[tuple[str, str]]],
) -> tuple[list[Any], float, int]:
    """One worker (plain or coalescing) scoring every stream: its pages, pairs/s and coalesced flushes logged."""
    device_args = ["--device", "gpu"] if args.device == "gpu" else ["--device", "cpu", "--pool", "threads"]
    env = worker_env(
        redis_url,
        f"wc{name}",
        RERANKQ_RERANKER_PROVIDER="local",
        RERANKQ_RERANKER_MODEL=model_path,
        RERANKQ_PAIR_CACHE="false",
        RERANKQ_COALESCE=coalesce,
    )
    worker = WorkerProcess.rerankq(
        env, log_path, *device_args, "--threads", str(args.threads), "--loglevel", "DEBUG", cwd=ROOT
    ).start()
    client = RerankClient(load_settings(env))
    try:
        score_all(client, streams_pairs[:2], args.device)  # warm-up
        pages, rate = score_all(client, streams_pairs, args.device)
    finally:
        client.close()
        worker.stop()
    return pages, rate, log_path.read_text(errors="replace").count("coalesced")


def verdict(results: dict[str, tuple[list[Any], float, int]]) -> tuple[bool, bool, float]:
    """Whether every row was ranked by the model and both workers ordered alike; the largest score difference."""
    plain, coalesced = results["plain"][0], results["coalescing"][0]
    same_order = all([r.id for r in a.rows] == [r.id for r in b.rows] for a, b in zip(plain, coalesced))
    all_ranked = all(r.kind == "ranked" and r.served_by == "0:local" for p in plain + coalesced for r in p.rows)
    diff = max(abs(ra.score - rb.score) for a, b in zip(plain, coalesced) for ra, rb in zip(a.rows, b.rows))
    return all_ranked, same_order, diff


def main() -> None:
    args = parse_arguments()
    n_streams = args.streams or ((64 if args.device == "gpu" else 8) if args.quick else 128)
    # fp16 on a GPU rounds differently with batch composition; fp32 on a CPU hardly at all.
    tolerance = args.tolerance or (5e-3 if args.device == "gpu" else 1e-5)
    model_path = args.model or str(bench_model())
    streams_pairs = stream_pairs(model_path, n_streams)
    redis_server = EmbeddedRedis().start()
    logs = Path(tempfile.mkdtemp(prefix="rerankq-worker-check-"))
    results = {}
    try:
        for name, coalesce in (("plain", "false"), ("coalescing", "true")):
            results[name] = run_worker(
                redis_server.url,
                logs / f"{name}.log",
                name,
                coalesce,
                model_path=model_path,
                args=args,
                streams_pairs=streams_pairs,
            )
    finally:
        redis_server.stop()

    all_ranked, same_order, diff = verdict(results)
    print_table(
        f"worker check: {n_streams} one-window streams opened at once, device {args.device}, "
        f"{args.threads} task threads",
        ["worker", "pairs/s", "coalesced flushes"],
        [
            ["plain", results["plain"][1], results["plain"][2]],
            ["coalescing", results["coalescing"][1], results["coalescing"][2]],
        ],
    )
    print(f"\nall ranked by the model: {all_ranked}; same order: {same_order}; max |score diff|: {diff:.2g}")
    write_json(
        args.json_path,
        {
            "plain_pairs_per_s": results["plain"][1],
            "coalescing_pairs_per_s": results["coalescing"][1],
            "coalesced_flushes": results["coalescing"][2],
            "same_order": same_order,
            "all_ranked": all_ranked,
            "max_abs_diff": diff,
            "device": args.device,
        },
    )
    fail_unless_within(all_ranked, results["coalescing"][2], diff, tolerance)
    if not same_order:
        print("note: near-tied scores swapped places; the score difference is within tolerance")


def fail_unless_within(all_ranked: bool, flushes: int, diff: float, tolerance: float) -> None:
    """Exit 1 unless every row was ranked, the coalescing worker did coalesce and the scores agree."""
    if all_ranked and flushes > 0 and diff <= tolerance:
        return
    print(
        "FAILED: "
        + ("not all ranked; " if not all_ranked else "")
        + ("no coalesced flush; " if flushes == 0 else "")
        + (f"score diff {diff:.2g} > {tolerance}" if diff > tolerance else "")
    )
    sys.exit(1)


if __name__ == "__main__":
    main()
