#!/usr/bin/env bash
# One device call for a change to the split path: its GPU tests, then a sweep of tuning variants
# (sweep.py) on the long and few-row shapes, logs under $OUT. v8 compared ticketed with persistent
# grids this way, v9 pipelined ones; v10 twice-read tiles (TESTS_K and SWEEP_SHAPES set).
# Usage (device machine, repo root): bash benchmarks/device_split.sh [variants]
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
PORTABLE_SOFTMAX_REQUIRE_DEVICE=cuda timeout 240 python3 -m pytest tests/test_softmax.py -q -p no:cacheprovider \
  -k "${TESTS_K:-cuda and (split or regime or replayed or alignment or ticket or minus_inf or matches_torch)}" -x 2>&1 \
  | tail -15 | tee "$OUT/tests.log"
SWEEP_SHAPES=${SWEEP_SHAPES:-16384x32768,16384x65536,8192x131072,4096x262144,4096x50257,4096x151936,32x128256} \
  timeout "${SWEEP_TIMEOUT:-300}" python3 benchmarks/sweep.py "${SWEEP_DTYPES:-bfloat16,float32}" "${1:-base}" 2>&1 \
  | grep -v -i warn | tee "$OUT/sweep.log"
