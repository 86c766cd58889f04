"""Peak memory of one engine scoring windows of 25 on a device, for ops/bench/gpu_check.sh.

    python -m ops.bench.gpu_memory --device cuda --model DIR --json PATH

On CUDA the peak is torch's allocator high-water mark (what the engine's tensors held at
most); on a CPU, the process's peak resident set (the code path, for the CPU-forced check).
"""

from __future__ import annotations

import argparse
import resource

from kernel.settings import load_settings
from ops.bench.common import realistic_pairs, windows_of, write_json
from worker.engine import ScoringEngine, load_cross_encoder


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", required=True)
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    model = load_cross_encoder(args.model, device=args.device)
    engine = ScoringEngine(model, settings=load_settings({}), model_name=args.model)
    pairs = realistic_pairs(n_windows=args.windows, window_size=25, tokenizer=model[0].tokenizer)
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for window in windows_of(pairs, 25):
        engine.score_pairs(window)
    if cuda:
        torch.cuda.synchronize()
        peak_mb = torch.cuda.max_memory_allocated() / 2**20
        source = "torch.cuda.max_memory_allocated"
    else:
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        source = "ru_maxrss"
    print(f"peak memory on {args.device}: {peak_mb:.0f} MB ({source}, precision {engine.precision})")
    write_json(
        args.json_path, {"device": args.device, "peak_mb": peak_mb, "source": source, "precision": engine.precision}
    )


if __name__ == "__main__":
    main()
