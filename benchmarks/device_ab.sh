#!/usr/bin/env bash
# One device call comparing the working tree with a base copy of the package: the working tree's
# GPU tests, then sweep.py over the same shapes for each side, logs under $OUT.
# Usage (device machine, repo root): bash benchmarks/device_ab.sh BASE_DIR
#   BASE_DIR holds the base's portable_softmax/ (e.g. `git archive HEAD portable_softmax | tar -x -C ab_base`).
#   AB_TESTS: pytest -k expression (default: the shared cuda tests); NEW_VARIANTS / BASE_VARIANTS and
#   NEW_DTYPES / BASE_DTYPES: sweep.py arguments per side; SWEEP_SHAPES as sweep.py reads it.
set -uo pipefail
BASE="${1:?usage: device_ab.sh BASE_DIR}"
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
PYTHONPATH="$PWD" PORTABLE_SOFTMAX_REQUIRE_DEVICE=cuda timeout 300 python3 -m pytest tests -q -p no:cacheprovider \
  -k "${AB_TESTS:-cuda or device_layer}" -x 2>&1 | tail -8 | tee "$OUT/tests.log"
for side in new base; do
  if [ "$side" = new ]; then path="$PWD"; variants="${NEW_VARIANTS:-base}"; dtypes="${NEW_DTYPES:-bfloat16,float32}"
  else path="$PWD/$BASE"; variants="${BASE_VARIANTS:-base}"; dtypes="${BASE_DTYPES:-bfloat16,float32}"; fi
  echo "== $side ($path)"
  PYTHONPATH="$path" timeout "${SWEEP_TIMEOUT:-240}" python3 benchmarks/sweep.py "$dtypes" "$variants" 2>&1 \
    | grep -v -i warn | sed "s/^/$side /" | tee "$OUT/sweep-$side.log"
done
