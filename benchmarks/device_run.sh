#!/usr/bin/env bash
# One device call: GPU tests, the main job, and the benchmark sweep, logs under $OUT.
# Usage (device machine, repo root): bash benchmarks/device_run.sh [quick]
set -uo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
if [ "${1:-}" != "bench-only" ]; then
  PORTABLE_SOFTMAX_REQUIRE_DEVICE=cuda timeout 400 python3 -m pytest tests -q -p no:cacheprovider -k "cuda or device_layer" \
    -x 2>&1 | tail -25 | tee "$OUT/tests.log"
  timeout 120 python3 -m portable_softmax 2>&1 | tail -40 | tee "$OUT/check.log"
fi
if [ "${1:-}" != "tests-only" ]; then
  timeout 420 python3 -m portable_softmax bench --backward --peers torch compile --out "$OUT" --no-progress 2>&1 \
    | grep -v Warning | tail -40 | tee "$OUT/bench.log"
fi
