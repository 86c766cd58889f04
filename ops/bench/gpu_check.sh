#!/usr/bin/env bash
# The GPU check: on one GPU, against CrossEncoder.predict on the same GPU, the engine at
# parity (fp16/bf16 as auto adopts them), a causal reranker, coalescing across streams, the
# queue's throughput through GPU workers, and peak memory. Run on a machine that already has
# the project installed (a CUDA build of torch in the environment); installs nothing and
# reaches no network; finishes in under 8 minutes on one GPU, plus the bench cross-encoder's
# one-off build (distilled on one CPU thread: a few minutes) when the cache has none.
#
#   ops/bench/gpu_check.sh [OUT_DIR]        (from the repository root)
#
# Writes each step's JSON into OUT_DIR (default ./gpu-check), a line per row to stdout, and
# exits non-zero naming every row it could not measure (ops/bench/gpu_report.py).
#
# GPU_CHECK_DEVICE=cpu runs every step on the CPU (the code paths, not the figures: the test
# in tests/test_gpu_check.py), with GPU_CHECK_MODEL (a CrossEncoder directory, in place of
# the bench model), GPU_CHECK_CAUSAL_LAYERS, small windows and each step's time limit 4x
# (GPU_CHECK_LIMIT_SCALE: a busy CPU is slower than a GPU). GPU_CHECK_STEPS="causal memory"
# runs only the steps named (a rerun of the ones that failed); the rest read NOT MEASURED.
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

DEVICE="${GPU_CHECK_DEVICE:-cuda}"
MODEL="${GPU_CHECK_MODEL:-}"
if [ "$DEVICE" = cpu ]; then
  CAUSAL_LAYERS="${GPU_CHECK_CAUSAL_LAYERS:-1}"
  WORKER_DEVICE=cpu
  SMALL=(--windows 1 --window-size 8 --rounds 1)
  # No int8 rows: none runs on a GPU, and on a CPU each recipe is an export and a calibration.
  SCORING_CPU=(--no-int8)
  # The limits are a GPU's; on a busy CPU each step (a process importing torch) takes longer.
  LIMIT_SCALE="${GPU_CHECK_LIMIT_SCALE:-4}"
else
  CAUSAL_LAYERS="${GPU_CHECK_CAUSAL_LAYERS:-4}"
  WORKER_DEVICE=gpu
  SMALL=()
  SCORING_CPU=()
  LIMIT_SCALE="${GPU_CHECK_LIMIT_SCALE:-1}"
  if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check: torch in $PY sees no CUDA device" >&2
    exit 2
  fi
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
fi

failed=0
step() {  # step NAME SECONDS COMMAND...: run with a time limit, keep going on failure
  local name=$1 limit=$(($2 * LIMIT_SCALE)); shift 2
  if [ -n "${GPU_CHECK_STEPS:-}" ] && [[ " ${GPU_CHECK_STEPS//,/ } " != *" $name "* ]]; then
    echo; echo "== $name skipped (not in GPU_CHECK_STEPS): its rows will read NOT MEASURED"
    return
  fi
  echo; echo "== $name (limit ${limit}s)"
  local start=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | grep -v "Loading weights" | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "-- $name: exit $rc in $((SECONDS - start))s"
  [ "$rc" -eq 0 ] || { failed=1; echo "gpu_check: step $name FAILED (exit $rc)" >&2; }
}

# The bench cross-encoder with real scores, built once into the cache (the steps below reuse it).
if [ -z "$MODEL" ]; then
  step bench-model 480 "$PY" -c 'from ops.bench.common import bench_model; print(bench_model())'
  MODEL=$("$PY" -c 'from ops.bench.common import bench_model; print(bench_model())' 2>/dev/null | tail -1)
fi
# Scoring at parity: the engine (auto's precision: fp16/bf16 where it holds parity) against predict.
step scoring-minilm 120 "$PY" -m ops.bench.scoring --device "$DEVICE" --quick --model "$MODEL" --no-causal \
  --no-rss "${SMALL[@]}" "${SCORING_CPU[@]}" --json "$OUT/scoring-minilm.json"
if [ "$DEVICE" != cpu ]; then
  # Larger encoders (random weights: timing only).
  step scoring-base  100 "$PY" -m ops.bench.scoring --device cuda --quick --size base --no-causal \
    --json "$OUT/scoring-base.json"
  step scoring-large 100 "$PY" -m ops.bench.scoring --device cuda --quick --size large --no-variants --no-causal \
    --json "$OUT/scoring-large.json"
fi
# A causal reranker (Qwen3-0.6B's shape, CAUSAL_LAYERS layers): predict, the engine plain and with prefix reuse.
step causal 150 "$PY" -m ops.bench.scoring --device "$DEVICE" --quick --causal-only --model "$MODEL" \
  --causal-layers "$CAUSAL_LAYERS" "${SMALL[@]}" --json "$OUT/causal.json"
# Coalescing gain: many windows of several streams through one Coalescer against one window at a time.
step coalesce 60 "$PY" -m ops.bench.coalesce --device "$DEVICE" --quick --model "$MODEL" --threads 8 \
  --json "$OUT/coalesce.json"
# The queue's throughput through real GPU workers (threads pool): a coalescing one and a plain one.
step worker-check 120 "$PY" -m ops.bench.worker_check --device "$WORKER_DEVICE" --quick --model "$MODEL" \
  --json "$OUT/worker-check.json"
# Peak memory of one engine scoring windows of 25.
step memory 60 "$PY" -m ops.bench.gpu_memory --device "$DEVICE" --model "$MODEL" --json "$OUT/memory.json"

echo
"$PY" -m ops.bench.gpu_report "$OUT" || failed=1
[ "$failed" -eq 0 ] || echo "gpu_check: FAILED: see the step logs under $OUT" >&2
exit $failed
