#!/usr/bin/env bash
# NOTES v21 on one GPU, in steps named as arguments (each call stays under the device's 10 minutes):
#   chunks   benchmarks/sweep.py over the float32 split shapes: the device's row against forward
#            chunks of 4096 for float32 only (variants in SWEEP_VARIANTS), two passes in
#            opposite orders
#   strided  benchmarks/strided_sweep.py: the strided cases under its SWEEP tunings, torch eager
#            and torch.compile in the same run (STRIDED_ONLY: the cases whose names hold one of
#            these words)
#   spills   benchmarks/probes/spill_count.py: the driver's spill count against cuobjdump's fields
#   tests    the GPU tests of split rows, strided reductions, the fused regimes and graphs
#   fused    `portable-softmax bench --cases fused` (ours, torch's composite eager and compiled),
#            and the fused calls against the plain kernels (benchmarks/probes/fused_vs_plain.py)
#   validate `portable-softmax validate` (its checks include the fused variants and a channel
#            softmax with a mask and a scale)
# Usage (device machine, repo root): bash benchmarks/device_v21.sh chunks strided spills
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" PORTABLE_SOFTMAX_REQUIRE_DEVICE=cuda
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
run_tests() { timeout 240 python3 -m pytest -q -p no:cacheprovider "$@" 2>&1 | grep -E "passed|failed|FAILED|Error" | tail -12; }
quiet() { grep -v -i -E "warn|online softmax|split the reduction|important use case|^softmax\.$|^$"; }
for step in "$@"; do
  case "$step" in
    chunks)
      variants=${SWEEP_VARIANTS:-base,fwd4k32}
      reversed=$(echo "$variants" | tr ',' '\n' | tac | paste -sd,)
      shapes=${SWEEP_SHAPES:-256x151936,4096x262144,4096x151936,32x128256,1x128256,4096x50257,16384x32768}
      SWEEP_SHAPES=$shapes timeout 280 python3 benchmarks/sweep.py float32 "$variants" 2>&1 | quiet | tee "$OUT/chunks-1.log"
      SWEEP_SHAPES=$shapes timeout 280 python3 benchmarks/sweep.py float32 "$reversed" 2>&1 | quiet | tee "$OUT/chunks-2.log" ;;
    strided)
      timeout 480 python3 benchmarks/strided_sweep.py --out "$OUT" ${STRIDED_ONLY:+--only $STRIDED_ONLY} 2>&1 | quiet \
        | tee "$OUT/strided.log" ;;
    spills)
      timeout 200 python3 benchmarks/probes/spill_count.py 2>&1 | quiet | tee "$OUT/spills.log" ;;
    tests)
      run_tests tests/test_strided.py -k cuda > "$OUT/tests-strided.log" &
      run_tests tests/test_fused.py -k "cuda and every_regime" > "$OUT/tests-fused-regimes.log" &
      run_tests tests/test_softmax.py -k "cuda and (ticketed or split or pipelined or persistent)" > "$OUT/tests-split.log" &
      run_tests tests/test_call_path.py -k "cuda and graph" > "$OUT/tests-graph.log" &
      wait
      tail -n 12 "$OUT"/tests-*.log ;;
    fused)
      timeout 200 python3 -m portable_softmax bench --cases fused --peers torch compile --out "$OUT" 2>&1 | quiet \
        | tee "$OUT/fused.log"
      timeout 120 python3 benchmarks/probes/fused_vs_plain.py --only temperature 2>&1 | quiet | tee "$OUT/fused-vs-plain.log" ;;
    validate)
      timeout 300 python3 -m portable_softmax validate --out "$OUT/validate" 2>&1 | quiet | tail -40 | tee "$OUT/validate.log" ;;
    *) echo "unknown step $step" ;;
  esac
done
