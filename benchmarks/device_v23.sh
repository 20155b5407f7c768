#!/usr/bin/env bash
# NOTES v23 on one GPU, in steps named as arguments (each call stays under the device's 10 minutes):
#   probe    benchmarks/probes/column_two_pass.py (two launches of Inductor's shape, standalone)
#   sweep    benchmarks/strided_sweep.py with its SWEEP settings (the sliced regime against none,
#            and for every dtype) over the columns, the transposed input and the NCHW cases
#   tests    the GPU tests of strided reductions (the sliced regime's among them), split rows and
#            the fused regimes
#   final    benchmarks/strided_sweep.py --quick over every case (the default tuning, torch eager
#            and torch.compile)
#   validate `portable-softmax validate`
# Usage (device machine, repo root): bash benchmarks/device_v23.sh sweep tests
set -uo pipefail
export PYTHONUNBUFFERED=1 PORTABLE_SOFTMAX_REQUIRE_DEVICE=cuda PYTHONPATH="$PWD"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
run_tests() { timeout 300 python3 -m pytest -q -p no:cacheprovider "$@" 2>&1 | grep -E "passed|failed|FAILED|Error" | tail -12; }
quiet() { grep -v -i -E "warn|online softmax|split the reduction|important use case|^softmax\.$|^$"; }
for step in "$@"; do
  case "$step" in
    probe)
      timeout 300 python3 benchmarks/probes/column_two_pass.py 2>&1 | quiet | tee "$OUT/probe.log" ;;
    sweep)
      timeout 500 python3 benchmarks/strided_sweep.py --out "$OUT/sweep" --only column transposed "NCHW (8" \
        "NCHW (64" 2>&1 | quiet | grep -E "^\||failures" | tee "$OUT/sweep.log" ;;
    tests)
      run_tests tests/test_strided.py -k cuda > "$OUT/tests-strided.log" &
      run_tests tests/test_fused.py -k "cuda and every_regime" > "$OUT/tests-fused-regimes.log" &
      run_tests tests/test_softmax.py -k "cuda and (ticketed or split or pipelined or persistent)" > "$OUT/tests-split.log" &
      wait
      tail -n 12 "$OUT"/tests-*.log ;;
    final)
      timeout 400 python3 benchmarks/strided_sweep.py --quick --out "$OUT/final" 2>&1 | quiet \
        | grep -E "^\||failures" | tee "$OUT/final.log" ;;
    validate)
      timeout 300 python3 -m portable_softmax validate --out "$OUT/validate" 2>&1 | quiet > "$OUT/validate.log"
      grep -E "PASS|FAIL|passed|failed" "$OUT/validate.log" | head -20 ;;
    *) echo "unknown step $step" ;;
  esac
done
