#!/usr/bin/env bash
# One device call: Nsight Compute counters for the cases of benchmarks/probes/ncu_cases.py (v11),
# full CSV per case under $OUT, and the lines that compare them on stdout.
# Usage (device machine, repo root): bash benchmarks/device_ncu.sh [case ...]
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
CASES=("$@")
[ ${#CASES[@]} -gt 0 ] || CASES=(ours_fwd_bf16_4096x262144 ours_fwd_fp32_4096x262144 clone_bf16_4096x262144
  ours_fwd_bf16_16384x32768 ours_bwd_bf16_16384x16384 compile_bwd_bf16_16384x16384)
METRICS=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,smsp__inst_executed.sum,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum
for c in "${CASES[@]}"; do
  timeout -k 5 "${NCU_TIMEOUT:-120}" ncu --clock-control none --nvtx --nvtx-include "measure/" \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --metrics "$METRICS" --csv \
    python3 benchmarks/probes/ncu_cases.py "$c" > "$OUT/ncu-$c.csv" 2> "$OUT/ncu-$c.err"
  echo "== $c rc=$?"
  grep -E 'Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|L2 Hit|lts__t_sector|dram__bytes|lts__t_sectors|Registers Per|Warp Cycles Per Issued|inst_executed|Stall' "$OUT/ncu-$c.csv" \
    | awk -F'","' '{k=$5; sub(/\(.*/, "", k); print substr(k, 1, 40) " | " $(NF-2) " | " $(NF-1) " | " $NF}' | tr -d '"'
done
