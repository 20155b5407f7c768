#!/usr/bin/env bash
# NOTES v20 on one GPU, in steps named as arguments (each call stays under the device's 10 minutes):
#   tests    the GPU tests of what v20 changed: the fused variants in every regime (negative
#            scales, causal) in three processes, the strided and split-row tests
#   strided  benchmarks/strided_sweep.py: the strided cases under its SWEEP tunings, torch eager
#            and torch.compile in the same run
#   fused    the causal floor against ours (benchmarks/probes/causal_floor.py), the per-row
#            temperature's kernel times (benchmarks/probes/kernel_parts.py), the fused calls
#            against the plain kernels twice (benchmarks/probes/fused_vs_plain.py), and
#            `portable-softmax bench --cases fused` (ours, torch's composite eager and compiled)
#   tickets  the tests of split rows, graphs and fused regimes, the temperature's kernel times and
#            the fused bench (run 4: ticketed rows that emptied their own slots, reverted)
#   sweep    benchmarks/sweep.py over SWEEP_SHAPES (default: the split shapes), variants from
#            SWEEP_VARIANTS (default base)
# Usage (device machine, repo root): [SWEEP_VARIANTS=base,c4k] bash benchmarks/device_v20.sh tests strided | fused
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" PORTABLE_SOFTMAX_REQUIRE_DEVICE=cuda
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
run_tests() { timeout 240 python3 -m pytest -q -p no:cacheprovider "$@" 2>&1 | grep -E "passed|failed|FAILED|Error" | tail -12; }
for step in "$@"; do
  case "$step" in
    tests)
      run_tests tests/test_strided.py -k cuda > "$OUT/tests-strided.log" &
      run_tests tests/test_fused.py -k "cuda and every_regime" > "$OUT/tests-fused-regimes.log" &
      run_tests tests/test_fused.py -k "cuda and other_dimensions" > "$OUT/tests-fused-dims.log" &
      run_tests tests/test_fused.py -k "cuda and composite" > "$OUT/tests-fused-composite.log" &
      run_tests tests/test_fused.py -k "cuda and not (every_regime or other_dimensions or composite)" \
        > "$OUT/tests-fused-rest.log" &
      run_tests tests/test_softmax.py -k "cuda and (ticketed or split or pipelined or persistent)" > "$OUT/tests-split.log" &
      run_tests tests/test_call_path.py -k "cuda and graph" > "$OUT/tests-graph.log" &
      wait
      tail -n 12 "$OUT"/tests-*.log ;;
    strided)
      timeout 420 python3 benchmarks/strided_sweep.py --out "$OUT" 2>&1 | grep -v -i warn | tee "$OUT/strided.log" ;;
    fused)
      timeout 100 python3 benchmarks/probes/causal_floor.py 2>&1 | tee "$OUT/causal-floor.log"
      timeout 60 python3 benchmarks/probes/kernel_parts.py 2>&1 | grep -v -i warn | tee "$OUT/kernel-parts.log"
      for pass in 1 2; do
        timeout 120 python3 benchmarks/probes/fused_vs_plain.py 2>&1 | grep -v -i warn | tee "$OUT/fused-vs-plain-$pass.log"
      done
      timeout 200 python3 -m portable_softmax bench --cases fused --peers torch compile --out "$OUT" 2>&1 \
        | grep -v -i -E "warn|online softmax|split the reduction|important use case|^softmax\.$|^$" | tee "$OUT/fused.log" ;;
    tickets)
      # The split-row, graph and fused regime tests, then the temperature's kernel times and the
      # fused bench.
      run_tests tests/test_softmax.py -k "cuda and (ticketed or split or interleave)" > "$OUT/tests-split.log" &
      run_tests tests/test_call_path.py -k "cuda and graph" > "$OUT/tests-graph.log" &
      run_tests tests/test_fused.py -k "cuda and every_regime" > "$OUT/tests-fused-regimes.log" &
      wait
      tail -n 12 "$OUT"/tests-*.log
      timeout 60 python3 benchmarks/probes/kernel_parts.py 2>&1 | grep -v -i warn | tee "$OUT/kernel-parts.log"
      timeout 200 python3 -m portable_softmax bench --cases fused --peers torch compile --out "$OUT" 2>&1 \
        | grep -v -i -E "warn|online softmax|split the reduction|important use case|^softmax\.$|^$" | tee "$OUT/fused.log" ;;
    sweep)
      # The split shapes under the device's own row and the variants in SWEEP_VARIANTS.
      SWEEP_SHAPES=${SWEEP_SHAPES:-16384x32768,4096x262144,4096x151936,256x151936,32x128256,4096x50257} timeout 300 \
        python3 benchmarks/sweep.py bfloat16,float32 "${SWEEP_VARIANTS:-base}" 2>&1 | grep -v -i warn | tee "$OUT/sweep.log" ;;
    *) echo "unknown step $step" ;;
  esac
done
