#!/usr/bin/env bash
# One device call for strided reductions and sliced rows (issue 18): the GPU tests of the strided
# path and the fused calls over it (three pytest processes at once: compiles dominate), then
# benchmarks/strided_sweep.py (ours under several strided tunings, torch eager, torch.compile;
# fraction of copy; arguments passed on), then the fused calls against the plain kernels of their
# shapes (benchmarks/probes/fused_vs_plain.py). Logs and JSON under $OUT.
# Usage (device machine, repo root): bash benchmarks/device_strided.sh [--quick] [--only NAME ...]
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" PORTABLE_SOFTMAX_REQUIRE_DEVICE=cuda
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
run_tests() { timeout 240 python3 -m pytest -q -p no:cacheprovider "$@" 2>&1 | tail -4; }
run_tests tests/test_strided.py -k "cuda or recorded" > "$OUT/tests-strided.log" &
run_tests tests/test_fused.py -k "cuda and (match_the_composite or temperature or empty or meta)" > "$OUT/tests-fused-1.log" &
run_tests tests/test_fused.py -k "cuda and not (match_the_composite or temperature or empty or meta)" > "$OUT/tests-fused-2.log" &
wait
tail -n 3 "$OUT"/tests-*.log
timeout 260 python3 benchmarks/strided_sweep.py --out "$OUT" "$@" 2>&1 | grep -v -i "warn" | tee "$OUT/sweep.log"
timeout 90 python3 benchmarks/probes/fused_vs_plain.py 2>&1 | grep -v -i warn | tee "$OUT/fused-vs-plain.log"
