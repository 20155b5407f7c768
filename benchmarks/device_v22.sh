#!/usr/bin/env bash
# NOTES v22 on one GPU, in steps named as arguments (each call stays under the device's 10 minutes):
#   sliced   benchmarks/strided_sweep.py (default tuning, torch eager and torch.compile) over the
#            sliced and contiguous rows of 50257, for the working tree and for the base copy of
#            the package in ab_base/ (`git archive BASE portable_softmax | tar -x -C ab_base`), in
#            the order new, base, new
#   strided  benchmarks/strided_sweep.py --quick over every strided case (STRIDED_ONLY: the cases
#            whose names hold one of these words)
#   combine  benchmarks/strided_sweep.py with its SWEEP settings (split tiles of 64 rows) over the
#            split strided cases, for the working tree and for ab_base/ (as in sliced); run 9 had
#            the tree's tiles combine their partials in the last chunk to arrive (since removed)
#   tests    the GPU tests of split rows, strided reductions and sliced rows, the fused regimes
#   real     `portable-softmax bench --cases real` (ours, torch eager, torch.compile)
#   validate `portable-softmax validate`
# Usage (device machine, repo root): bash benchmarks/device_v22.sh sliced tests
set -uo pipefail
export PYTHONUNBUFFERED=1 PORTABLE_SOFTMAX_REQUIRE_DEVICE=cuda
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
run_tests() { PYTHONPATH="$PWD" timeout 300 python3 -m pytest -q -p no:cacheprovider "$@" 2>&1 \
  | grep -E "passed|failed|FAILED|Error" | tail -12; }
quiet() { grep -v -i -E "warn|online softmax|split the reduction|important use case|^softmax\.$|^$"; }
for step in "$@"; do
  case "$step" in
    sliced)
      for side in new base new; do
        path="$PWD"; [ "$side" = base ] && path="$PWD/ab_base"
        echo "== $side"
        PYTHONPATH="$path:$PWD" timeout 200 python3 benchmarks/strided_sweep.py --quick --out "$OUT/sliced-$side" \
          --only sliced "contiguous (4096" 2>&1 | quiet | grep -E "^\| (sliced|contiguous)" | sed "s/^/$side /" \
          | tee -a "$OUT/sliced.log"
      done ;;
    combine)
      for side in new base; do
        path="$PWD"; [ "$side" = base ] && path="$PWD/ab_base"
        echo "== $side"
        PYTHONPATH="$path:$PWD" timeout 280 python3 benchmarks/strided_sweep.py --out "$OUT/combine-$side" \
          --only column transposed "NCHW (8" "NCHW (64" 2>&1 | quiet | grep -E "^\| .*\| ours|failures" \
          | sed "s/^/$side /" | tee -a "$OUT/combine.log"
      done ;;
    strided)
      PYTHONPATH="$PWD" timeout 480 python3 benchmarks/strided_sweep.py --quick --out "$OUT" \
        ${STRIDED_ONLY:+--only $STRIDED_ONLY} 2>&1 | quiet | tee "$OUT/strided.log" ;;
    tests)
      run_tests tests/test_strided.py -k cuda > "$OUT/tests-strided.log" &
      run_tests tests/test_fused.py -k "cuda and every_regime" > "$OUT/tests-fused-regimes.log" &
      run_tests tests/test_softmax.py -k "cuda and (ticketed or split or pipelined or persistent)" > "$OUT/tests-split.log" &
      wait
      tail -n 12 "$OUT"/tests-*.log ;;
    real)
      PYTHONPATH="$PWD" timeout 400 python3 -m portable_softmax bench --cases real --peers torch compile --out "$OUT" \
        2>&1 | quiet | tee "$OUT/real.log" ;;
    validate)
      PYTHONPATH="$PWD" timeout 300 python3 -m portable_softmax validate --out "$OUT/validate" 2>&1 | quiet | tail -40 \
        | tee "$OUT/validate.log" ;;
    *) echo "unknown step $step" ;;
  esac
done
