#!/usr/bin/env bash
# One device call on what kept issue 20 open on the H200 (run on the H100 too): the GPU tests of the kernels changed for
# it (causal tiles as wide as their rows reach; ticketed split rows that count arrivals), the memory
# floor of the causal forward's traffic (benchmarks/probes/causal_floor.py), where the per-row
# temperature's GPU time goes (benchmarks/probes/kernel_parts.py), the fused calls against the
# plain kernels under split tunings (benchmarks/probes/fused_vs_plain.py, arguments passed on), and
# with SWEEP_VARIANTS set, benchmarks/sweep.py over those variants; with STRIDED set,
# benchmarks/strided_sweep.py (its SWEEP tunings beside the default).
# Usage (device machine, repo root): [NO_TESTS=1] [STRIDED=1] [SWEEP_VARIANTS=base,fit192k] bash benchmarks/device_gaps.sh [--tuning JSON ...]
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" PORTABLE_SOFTMAX_REQUIRE_DEVICE=cuda
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
run_tests() { timeout 240 python3 -m pytest -q -p no:cacheprovider "$@" 2>&1 | tail -4; }
if [ -z "${NO_TESTS:-}" ]; then
  run_tests tests/test_softmax.py -k "cuda and (ticketed or split or pipelined or persistent or back)" > "$OUT/tests-split.log" &
  run_tests tests/test_fused.py -k "cuda and (causal or reach or regime)" > "$OUT/tests-fused.log" &
  wait
  tail -n 3 "$OUT"/tests-*.log
fi
timeout 120 python3 benchmarks/probes/causal_floor.py 2>&1 | tee "$OUT/causal-floor.log"
timeout 120 python3 benchmarks/probes/kernel_parts.py 2>&1 | grep -v -i warn | tee "$OUT/kernel-parts.log"
timeout 300 python3 benchmarks/probes/fused_vs_plain.py "$@" 2>&1 | grep -v -i warn | tee "$OUT/fused-vs-plain.log"
if [ -n "${SWEEP_VARIANTS:-}" ]; then
  timeout 400 python3 benchmarks/sweep.py bfloat16,float32 "$SWEEP_VARIANTS" 2>&1 | grep -v -i warn | tee "$OUT/sweep.log"
fi
if [ -n "${STRIDED:-}" ]; then
  timeout 300 python3 benchmarks/strided_sweep.py --out "$OUT" 2>&1 | grep -v -i warn | tee "$OUT/strided.log"
fi
