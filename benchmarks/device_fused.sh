#!/usr/bin/env bash
# One device call for the fused variants (issue 20): their GPU tests (the fused kernels of every
# regime forced on small rows, over other dims, and the strided tests those share), `portable-softmax
# validate` (its fused checks against the composite in float64), `portable-softmax bench --cases
# fused` (ours against torch's composite eager and under torch.compile), and the probe of the
# backward through autograd (benchmarks/probes/fused_autograd.py). Logs, reports and JSON under $OUT.
# Usage (device machine, repo root): bash benchmarks/device_fused.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
PORTABLE_SOFTMAX_REQUIRE_DEVICE=cuda timeout 300 python3 -m pytest tests/test_fused.py tests/test_strided.py -q \
  -p no:cacheprovider -k "cuda" 2>&1 | tail -8 | tee "$OUT/tests.log"
timeout 90 python3 -m portable_softmax validate --device cuda --no-bench --out "$OUT/validate" 2>&1 | tail -1
grep -E "Overall|fused" "$OUT/validate/report.md" | tee "$OUT/validate.log"
timeout 200 python3 -m portable_softmax bench --cases fused --peers torch compile --out "$OUT" 2>&1 \
  | grep -v -i -E "warn|online softmax|split the reduction|important use case|^softmax\.$|^$" | tee "$OUT/fused.log"
timeout 60 python3 benchmarks/probes/fused_autograd.py 2>&1 | tee "$OUT/autograd-probe.log"
