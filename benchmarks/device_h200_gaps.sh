#!/usr/bin/env bash
# One device call on what keeps issue 20 open on the H200: the memory floor of the causal forward's
# traffic (benchmarks/probes/causal_floor.py), where the per-row temperature's GPU time goes
# (benchmarks/probes/kernel_parts.py) and split tunings for it (benchmarks/probes/fused_vs_plain.py).
# Usage (device machine, repo root): bash benchmarks/device_h200_gaps.sh [extra fused_vs_plain --tuning ...]
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
timeout 120 python3 benchmarks/probes/causal_floor.py 2>&1 | tee "$OUT/causal-floor.log"
timeout 120 python3 benchmarks/probes/kernel_parts.py 2>&1 | grep -v -i warn | tee "$OUT/kernel-parts.log"
timeout 300 python3 benchmarks/probes/fused_vs_plain.py --only "temperature per row" "$@" 2>&1 \
  | grep -v -i warn | tee "$OUT/temperature-tunings.log"
if [ -n "${SWEEP_VARIANTS:-}" ]; then
  timeout 400 python3 benchmarks/sweep.py bfloat16,float32 "$SWEEP_VARIANTS" 2>&1 | grep -v -i warn | tee "$OUT/sweep.log"
fi
