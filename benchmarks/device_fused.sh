#!/usr/bin/env bash
# One device call for the fused variants (issue 20): their GPU tests, then benchmarks/fused_bench.py
# (ours against torch's composite eager and under torch.compile). Logs and JSON under $OUT.
# Usage (device machine, repo root): bash benchmarks/device_fused.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
PORTABLE_SOFTMAX_REQUIRE_DEVICE=cuda timeout 200 python3 -m pytest tests/test_fused.py tests/test_layout.py -q \
  -p no:cacheprovider -k "cuda or errors" 2>&1 | tail -6 | tee "$OUT/tests.log"
timeout 300 python3 benchmarks/fused_bench.py --out "$OUT/fused.json" 2>&1 | grep -v -i warn | tee "$OUT/fused.log"
