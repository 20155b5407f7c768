#!/usr/bin/env bash
# One device call for strided reductions and sliced rows (issue 18): the GPU tests of the strided
# path (split tiles held and deferred, fused calls over other dims) and of the split kernels they
# share with rows, then benchmarks/strided_sweep.py (ours under several strided tunings, torch
# eager, torch.compile; fraction of copy). Logs and JSON under $OUT.
# Usage (device machine, repo root): bash benchmarks/device_strided.sh [--quick]
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
PORTABLE_SOFTMAX_REQUIRE_DEVICE=cuda timeout 240 python3 -m pytest tests/test_strided.py tests/test_fused.py \
  tests/test_softmax.py -q -p no:cacheprovider \
  -k "(cuda or recorded) and not test_fused_variants_match and not test_fused_variants_in_every and not dtype_argument \
and not special_values and not forward_matches" 2>&1 | tail -12 | tee "$OUT/tests.log"
timeout 330 python3 benchmarks/strided_sweep.py --out "$OUT" "$@" 2>&1 | grep -v -i "warn" | tee "$OUT/sweep.log"
