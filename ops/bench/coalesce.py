"""Coalescing gain: windows of many streams scored one at a time, or coalesced.

The GPU worker's code path without the queue around it: N threads (as the threads
pool runs N tasks) each hand windows to one Coalescer over one engine, against the
same windows scored one after another by the engine. Alternated round by round.

    python -m ops.bench.coalesce --device cuda --json /tmp/coalesce.json
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

from ops.bench.common import (
    SIZES,
    bench_model,
    cpu_quota,
    device_sync,
    median_of_ratios,
    p50,
    print_table,
    realistic_pairs,
    windows_of,
    write_json,
)
from worker.engine import ScoringEngine, configure_threads, load_cross_encoder
from worker.engine.coalesce import Coalescer
from worker.engine.parity import max_abs_diff

SINGLE = "one window at a time"
COALESCED = "coalesced"
Pairs = list[tuple[str, str]]


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model")
    parser.add_argument("--size", choices=sorted(SIZES), default="minilm")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--threads", type=int, default=8, help="concurrent windows (tasks of the threads pool)")
    parser.add_argument("--windows", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--delay-ms", type=float, default=5.0)
    parser.add_argument("--max-pairs", type=int, default=256)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", dest="json_path")
    return parser.parse_args()


def time_arms(
    engine: ScoringEngine, coalescer: Coalescer[float], windows: list[Pairs], *, threads: int, rounds: int, device: str
) -> tuple[dict[str, list[float]], dict[str, list[list[float]]], int]:
    """pairs/s of each arm per round, alternated; each arm's scores of the last round; and the
    coalescer's flushes in the timed rounds (the warm-up's not counted)."""
    sync = device_sync(device)

    def one_at_a_time() -> list[list[float]]:
        return [engine.score_pairs(w) for w in windows]

    def coalesced() -> list[list[float]]:
        with ThreadPoolExecutor(threads) as pool:
            return list(pool.map(lambda w: coalescer.score(w[0][0], [d for _, d in w]), windows))

    n_pairs = sum(len(w) for w in windows)
    rates: dict[str, list[float]] = {SINGLE: [], COALESCED: []}
    outputs = {}
    one_at_a_time()  # warm-up
    coalesced()
    flushes_before = coalescer.flushes
    for _ in range(rounds):
        for name, fn in ((SINGLE, one_at_a_time), (COALESCED, coalesced)):
            start = time.perf_counter()
            outputs[name] = fn()
            sync()
            rates[name].append(n_pairs / (time.perf_counter() - start))
    return rates, outputs, coalescer.flushes - flushes_before


def main() -> None:
    args = parse_arguments()

    from kernel.settings import load_settings

    on_cuda = args.device.startswith("cuda")
    n_windows = args.windows or ((64 if on_cuda else 8) if args.quick else (256 if on_cuda else 24))
    rounds = args.rounds or (2 if args.quick else 3)
    configure_threads(cpu_quota())
    model_path = args.model or str(bench_model(args.size))
    settings = load_settings({}, precision=args.precision)
    engine = ScoringEngine(load_cross_encoder(model_path, device=args.device), settings=settings)
    windows = windows_of(realistic_pairs(n_windows=n_windows, window_size=25, tokenizer=engine.tokenizer), 25)
    coalescer = Coalescer(engine.score_pairs, max_pairs=args.max_pairs, max_delay_s=args.delay_ms / 1000)
    rates, outputs, flushes = time_arms(
        engine, coalescer, windows, threads=args.threads, rounds=rounds, device=args.device
    )
    coalescer.close()
    windows_per_flush = n_windows * rounds / max(1, flushes)
    gain = median_of_ratios(rates[COALESCED], rates[SINGLE])
    diff = max(max_abs_diff(a, b) for a, b in zip(outputs[SINGLE], outputs[COALESCED]))
    print_table(
        f"coalescing: {n_windows} windows of 25, {args.threads} concurrent, device {args.device}, "
        f"precision {engine.precision}, model {model_path}",
        ["arm", "pairs/s", "windows per forward call"],
        [
            [SINGLE, p50(rates[SINGLE]), 1.0],
            [COALESCED, p50(rates[COALESCED]), windows_per_flush],
        ],
    )
    print(f"\ncoalescing gain: {gain:.2f}x, max |score difference|: {diff:.2g}")
    write_json(
        args.json_path,
        {
            "single_pairs_per_s": p50(rates[SINGLE]),
            "coalesced_pairs_per_s": p50(rates[COALESCED]),
            "coalescing_gain": gain,
            "windows_per_flush": windows_per_flush,
            "max_abs_diff": diff,
            "device": args.device,
            "precision": engine.precision,
            "threads": args.threads,
            "windows": n_windows,
            "model": model_path,
        },
    )


if __name__ == "__main__":
    main()
