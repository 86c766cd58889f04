"""How long a causal reranker takes to start, the first time and again: the first start holds
the engine to CrossEncoder.predict on the probe windows, a second start of the same model
takes the kept verdict (``worker.engine.agreement``).

    python -m ops.bench.causal_start [--layers 4] [--device cpu] [--json PATH]

Each start is a fresh process (the engine keeps one model copy per process) that loads the
model and builds the engine at fp32 (no precision probe adds to it), in a fresh copy of the
bench model's directory, where the first start keeps its verdict.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ops.bench.causal import causal_bench_model
from ops.bench.common import write_json
from worker.engine import ScoringEngine, load_cross_encoder


def start_seconds(path: Path, *, device: str) -> float:
    """One start in a fresh process: its seconds, from its last line."""
    done = subprocess.run(
        [sys.executable, "-m", "ops.bench.causal_start", "--start", str(path), "--device", device],
        check=True,
        capture_output=True,
        text=True,
    )
    return float(done.stdout.strip().splitlines()[-1])


def start_here(path: Path, *, device: str) -> float:
    from kernel.settings import load_settings

    settings = load_settings({}, precision="fp32")
    started = time.perf_counter()
    model = load_cross_encoder(str(path), device=device)
    ScoringEngine(model, settings=settings, model_name=str(path))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json")
    parser.add_argument("--start", help=argparse.SUPPRESS)  # one start, in this process
    args = parser.parse_args()
    if args.start:
        print(start_here(Path(args.start), device=args.device))
        return
    source = causal_bench_model(args.layers)
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(shutil.copytree(source, Path(scratch) / source.name))
        first = start_seconds(path, device=args.device)
        second = start_seconds(path, device=args.device)
    print(
        f"causal reranker ({args.layers} layers) start: first {first:.1f} s (agreement checked), "
        f"second {second:.1f} s (verdict kept), {first / second:.1f}x faster"
    )
    write_json(args.json, {"layers": args.layers, "first_start_s": first, "second_start_s": second})


if __name__ == "__main__":
    main()
