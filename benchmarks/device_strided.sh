#!/usr/bin/env bash
# One device call for strided reductions and sliced rows (issue 18): the GPU tests of the strided
# path and the kernels it shares, then benchmarks/strided_sweep.py (ours under several strided
# tunings, torch eager, torch.compile; fraction of copy). Logs and JSON under $OUT.
# Usage (device machine, repo root): bash benchmarks/device_strided.sh [--quick]
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
PORTABLE_SOFTMAX_REQUIRE_DEVICE=cuda timeout 300 python3 -m pytest tests/test_strided.py tests/test_softmax.py -q \
  -p no:cacheprovider -k "cuda or recorded" -x 2>&1 | tail -12 | tee "$OUT/tests.log"
timeout 400 python3 benchmarks/strided_sweep.py --out "$OUT" "$@" 2>&1 | grep -v -i "warn" | tee "$OUT/sweep.log"
