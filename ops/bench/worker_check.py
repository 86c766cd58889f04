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
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel.settings import load_settings
from ops.bench.common import ROOT, bench_model, print_table, realistic_pairs, worker_env, write_json
from producer import RerankClient
from worker.embedded.redis_server import EmbeddedRedis
from worker.embedded.worker_process import WorkerProcess

WINDOW = 25
#: The largest score difference batch composition may make, by the precision the workers adopted:
#: fp32 on a CPU moves the last digits; a half precision (fp16 on a GPU, or bf16 that a CPU's auto
#: keeps where it is the fastest at ranking parity) rounds each batch differently.
FP32_CPU_TOLERANCE = 1e-5
HALF_PRECISION_TOLERANCE = 5e-3


@dataclass
class WorkerRun:
    """One worker's pass over every stream."""

    pages: list[Any]
    pairs_per_s: float
    coalesced_flushes: int
    adopted: str  # the local member's backend and precision, from its model_loaded line ("onnx fp32")


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
    parser.add_argument("--precision", default="auto", help="RERANKQ_PRECISION for both workers")
    parser.add_argument("--backend", default="auto", help="the local member's BACKEND for both workers")
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


def adopted(log: str) -> str:
    """What the worker's local member runs on, as its model_loaded line says ("onnx fp32")."""
    line = next((line for line in log.splitlines() if "model_loaded" in line), "")
    found = {key: value for key, value in re.findall(r"\b(backend|precision)=(\S+)", line)}
    return f"{found.get('backend', '?')} {found.get('precision', '?')}"


def run_worker(
    redis_url: str,
    log_path: Path,
    name: str,
    coalesce: str,
    *,
    model_path: str,
    args: argparse.Namespace,
    streams_pairs: list[list[tuple[str, str]]],
) -> WorkerRun:
    """One worker (plain or coalescing) scoring every stream."""
    device_args = ["--device", "gpu"] if args.device == "gpu" else ["--device", "cpu", "--pool", "threads"]
    env = worker_env(
        redis_url,
        f"wc{name}",
        RERANKQ_RERANKER_PROVIDER="local",
        RERANKQ_RERANKER_MODEL=model_path,
        RERANKQ_RERANKER_BACKEND=args.backend,
        RERANKQ_PRECISION=args.precision,
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
    log = log_path.read_text(errors="replace")
    return WorkerRun(pages, rate, log.count("coalesced"), adopted(log))


def unranked(pages: list[Any]) -> dict[str, int]:
    """Rows not ranked by the model, counted by how they were served ("failed by 0:local": 3)."""
    counts: dict[str, int] = {}
    for page in pages:
        for row in page.rows:
            if row.kind != "ranked" or row.served_by != "0:local":
                label = f"{row.kind} by {row.served_by}"
                counts[label] = counts.get(label, 0) + 1
    return counts


def verdict(plain: WorkerRun, coalescing: WorkerRun) -> tuple[bool, bool, float]:
    """Whether every row was ranked by the model and both workers ordered alike; the largest score difference."""
    pairs = list(zip(plain.pages, coalescing.pages))
    same_order = all([r.id for r in a.rows] == [r.id for r in b.rows] for a, b in pairs)
    all_ranked = not unranked(plain.pages + coalescing.pages)
    diff = max(abs(ra.score - rb.score) for a, b in pairs for ra, rb in zip(a.rows, b.rows))
    return all_ranked, same_order, diff


def tolerance_for(device: str, plain: WorkerRun, coalescing: WorkerRun) -> float:
    """fp32's on a CPU, unless a worker says it adopted a half precision or the two run on
    different backends (a log that does not say keeps the strict one)."""
    half = any(run.adopted.endswith((" bf16", " fp16")) for run in (plain, coalescing))
    if device == "cpu" and plain.adopted == coalescing.adopted and not half:
        return FP32_CPU_TOLERANCE
    return HALF_PRECISION_TOLERANCE


def main() -> None:
    args = parse_arguments()
    n_streams = args.streams or ((64 if args.device == "gpu" else 8) if args.quick else 128)
    model_path = args.model or str(bench_model())
    streams_pairs = stream_pairs(model_path, n_streams)
    redis_server = EmbeddedRedis().start()
    logs = Path(tempfile.mkdtemp(prefix="rerankq-worker-check-"))
    try:
        plain, coalescing = (
            run_worker(
                redis_server.url,
                logs / f"{name}.log",
                name,
                coalesce,
                model_path=model_path,
                args=args,
                streams_pairs=streams_pairs,
            )
            for name, coalesce in (("plain", "false"), ("coalescing", "true"))
        )
    finally:
        redis_server.stop()

    all_ranked, same_order, diff = verdict(plain, coalescing)
    tolerance = args.tolerance or tolerance_for(args.device, plain, coalescing)
    print_table(
        f"worker check: {n_streams} one-window streams opened at once, device {args.device}, "
        f"{args.threads} task threads",
        ["worker", "runs on", "pairs/s", "coalesced flushes"],
        [
            ["plain", plain.adopted, plain.pairs_per_s, plain.coalesced_flushes],
            ["coalescing", coalescing.adopted, coalescing.pairs_per_s, coalescing.coalesced_flushes],
        ],
    )
    print(
        f"\nall ranked by the model: {all_ranked}; same order: {same_order}; "
        f"max |score diff|: {diff:.2g} (tolerance {tolerance:g})"
    )
    write_json(
        args.json_path,
        {
            "plain_pairs_per_s": plain.pairs_per_s,
            "coalescing_pairs_per_s": coalescing.pairs_per_s,
            "coalesced_flushes": coalescing.coalesced_flushes,
            "adopted": {"plain": plain.adopted, "coalescing": coalescing.adopted},
            "same_order": same_order,
            "all_ranked": all_ranked,
            "max_abs_diff": diff,
            "tolerance": tolerance,
            "device": args.device,
        },
    )
    if not all_ranked:
        print(f"rows not ranked by the model: {unranked(plain.pages + coalescing.pages)}")
    fail_unless_within(all_ranked, coalescing.coalesced_flushes, diff, tolerance, logs=logs)
    if not same_order:
        print("note: near-tied scores swapped places; the score difference is within tolerance")


def fail_unless_within(all_ranked: bool, flushes: int, diff: float, tolerance: float, *, logs: Path) -> None:
    """Exit 1 unless every row was ranked, the coalescing worker did coalesce and the scores agree;
    a failure prints the workers' warnings and errors (why a window was not ranked is in them)."""
    if all_ranked and flushes > 0 and diff <= tolerance:
        return
    for log in sorted(logs.glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()
        warnings = [line for line in lines if "[warning" in line or "[error" in line]
        print(f"--- {log.name}: {len(warnings)} warnings and errors, the last 20 ---", *warnings[-20:], sep="\n")
    print(
        "FAILED: "
        + ("not all ranked; " if not all_ranked else "")
        + ("no coalesced flush; " if flushes == 0 else "")
        + (f"score diff {diff:.2g} > {tolerance}" if diff > tolerance else "")
    )
    sys.exit(1)


if __name__ == "__main__":
    main()
