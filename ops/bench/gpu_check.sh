#!/usr/bin/env bash
# The GPU check: the scoring benchmark and the coalescing path on CUDA, on one machine
# that already has the project installed (a CUDA build of torch in the environment).
# Installs nothing and reaches no network; finishes in under 8 minutes on one GPU, plus the
# bench cross-encoder's one-off build (distilled on one CPU thread: a few minutes) when the
# cache has none.
#
#   ops/bench/gpu_check.sh [OUT_DIR]        (from the repository root)
#
# Writes each step's JSON into OUT_DIR (default ./gpu-check) and a summary to stdout.
set -uo pipefail

cd "$(dirname "$0")/../.."
OUT="${1:-${OUT:-gpu-check}}"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PIP_NO_INDEX=1
export BENCH_CACHE="${BENCH_CACHE:-$OUT/models}"

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_check: torch in $PY sees no CUDA device" >&2
  exit 2
fi
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'

failed=0
step() {  # step NAME SECONDS COMMAND...: run with a time limit, keep going on failure
  local name=$1 limit=$2; shift 2
  echo; echo "== $name (limit ${limit}s)"
  local start=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | grep -v "Loading weights" | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "-- $name: exit $rc in $((SECONDS - start))s"
  [ "$rc" -eq 0 ] || failed=1
}

# The bench cross-encoder with real scores, built once into the cache (the steps below reuse it).
step bench-model 480 "$PY" -c 'from ops.bench.common import bench_model; print(bench_model())'
# Scoring: MiniLM-L6-sized, then larger encoders (random weights: timing only).
step scoring-minilm 120 "$PY" -m ops.bench.scoring --device cuda --quick --json "$OUT/scoring-minilm.json"
step scoring-base   100 "$PY" -m ops.bench.scoring --device cuda --quick --size base --json "$OUT/scoring-base.json"
step scoring-large  100 "$PY" -m ops.bench.scoring --device cuda --quick --size large --no-variants \
  --json "$OUT/scoring-large.json"
# The onnx backend on ONNX Runtime's CUDA provider, where the onnxruntime-gpu build is installed.
if "$PY" -c 'import sys, onnxruntime as o; sys.exit(0 if "CUDAExecutionProvider" in o.get_available_providers() else 1)' 2>/dev/null; then
  step scoring-onnx 150 "$PY" -m ops.bench.scoring --device cuda --quick --backend onnx --no-rss \
    --json "$OUT/scoring-onnx.json"
else
  echo; echo "== scoring-onnx skipped: onnxruntime here has no CUDAExecutionProvider (install onnxruntime-gpu)"
fi
# Coalescing gain: many windows through one Coalescer against one window at a time.
step coalesce 60 "$PY" -m ops.bench.coalesce --device cuda --quick --threads 8 --json "$OUT/coalesce.json"
# The coalescing path through real GPU workers (threads pool), against a plain one.
step worker-check 90 "$PY" -m ops.bench.worker_check --device gpu --quick --json "$OUT/worker-check.json"

echo
"$PY" - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
def load(name):
    path = out / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None
for size in ("minilm", "base", "large", "onnx"):
    s = load(f"scoring-{size}")
    if s:
        print(f"scoring {size:6}: engine {s['engine_pairs_per_s']:.0f} pairs/s ({s['engine_precision']}), "
              f"predict {s['baseline_pairs_per_s']:.0f}, ratio {s['ratio']:.2f}x, "
              f"spearman min {s['spearman_min']:.4f}, of peak {s['mfu']:.0%}")
c = load("coalesce")
if c:
    print(f"coalescing gain: {c['coalescing_gain']:.2f}x ({c['windows_per_flush']:.1f} windows per forward call)")
w = load("worker-check")
if w:
    print(f"gpu workers: plain {w['plain_pairs_per_s']:.0f} pairs/s, coalescing {w['coalescing_pairs_per_s']:.0f}; "
          f"same order {w['same_order']}, max |diff| {w['max_abs_diff']:.2g}")
PY
exit $failed
