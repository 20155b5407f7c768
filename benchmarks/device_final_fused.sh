#!/usr/bin/env bash
# The closing figures of the fused variants on one GPU (issue 20): the fused and causal GPU tests,
# `portable-softmax bench --cases fused` (ours against torch's composite, eager and compiled), the
# fused calls against the plain kernels twice (benchmarks/probes/fused_vs_plain.py; a second pass
# checks the first), and benchmarks/sweep.py over the device's own row (the split shapes).
# Usage (device machine, repo root): bash benchmarks/device_final_fused.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" PORTABLE_SOFTMAX_REQUIRE_DEVICE=cuda
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_fused.py tests/test_device_layer.py \
  -k "cuda and (causal or reach or regime or temperature) or tuning_rows" 2>&1 | tail -3 | tee "$OUT/tests.log"
timeout 200 python3 -m portable_softmax bench --cases fused --peers torch compile --out "$OUT" 2>&1 \
  | grep -v -i -E "warn|online softmax|split the reduction|important use case|^softmax\.$|^$" | tee "$OUT/fused.log"
timeout 150 python3 benchmarks/probes/fused_vs_plain.py --tuning '{}' 2>&1 | grep -v -i warn | tee "$OUT/fused-vs-plain.log"
SWEEP_SHAPES=16384x32768,4096x262144,4096x151936,256x151936,32x128256,4096x50257 timeout 200 \
  python3 benchmarks/sweep.py bfloat16,float32 base 2>&1 | grep -v -i warn | tee "$OUT/sweep.log"
