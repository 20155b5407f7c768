#!/usr/bin/env bash
# One device call for tuning work: GPU tests, host/GPU time split (diagnose.py) and the tuning
# sweep (sweep.py), logs under $OUT. Usage (device machine, repo root): bash benchmarks/device_sweep.sh
set -uo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
PORTABLE_SOFTMAX_REQUIRE_DEVICE=cuda timeout 200 python3 -m pytest tests -q -p no:cacheprovider -k "cuda or device_layer" \
  -x 2>&1 | tail -15 | tee "$OUT/tests.log"
timeout 120 python3 benchmarks/diagnose.py bfloat16,float32 32768x256,4096x50257,1x128256 2>&1 | grep -v -i warn \
  | tee "$OUT/diagnose.log"
timeout "${SWEEP_TIMEOUT:-300}" python3 benchmarks/sweep.py "${SWEEP_DTYPES:-bfloat16,float32}" ${SWEEP_VARIANTS:-} 2>&1 \
  | grep -v -i warn | tee "$OUT/sweep.log"
