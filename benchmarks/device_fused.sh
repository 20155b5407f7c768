#!/usr/bin/env bash
# One device call for the fused variants (issue 20): their GPU tests (the fused kernels of every
# regime forced on small rows, and the shared regime tests the split kernels' new arguments pass
# through), `portable-softmax validate` (its fused checks against the composite in float64), then
# `portable-softmax bench --cases fused` (ours against torch's composite eager and under
# torch.compile). Logs, reports and JSON under $OUT.
# Usage (device machine, repo root): bash benchmarks/device_fused.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
PORTABLE_SOFTMAX_REQUIRE_DEVICE=cuda timeout 300 python3 -m pytest tests/test_fused.py tests/test_softmax.py -q \
  -p no:cacheprovider -k "cuda and (fused or every_regime or windows or replayed or far_below or temperature or empty)" \
  2>&1 | tail -8 | tee "$OUT/tests.log"
timeout 120 python3 -m portable_softmax validate --device cuda --no-bench --out "$OUT/validate" 2>&1 | tail -3
grep -E "Overall|fused" "$OUT/validate/report.md" | tee "$OUT/validate.log"
timeout 240 python3 -m portable_softmax bench --cases fused --peers torch compile --out "$OUT" 2>&1 \
  | grep -v -i -E "warn|online softmax|split the reduction|important use case|^softmax\.$|^$" | tee "$OUT/fused.log"
