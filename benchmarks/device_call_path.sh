#!/usr/bin/env bash
# One device call for the call path (issue 17) and the split wait (issue 22): host time per call
# and bandwidth of this tree and of a base tree carried as ab_base/ (a copy of an older
# portable_softmax/), in one run; logs and JSON under $OUT. Peers' wheels (Liger, FlagGems) come
# from .whl/ when carried. Usage (device machine, repo root): bash benchmarks/device_call_path.sh [eager|bandwidth]
set -uo pipefail
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
SITE=/tmp/site
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
if [ "${1:-eager}" = "eager" ]; then
  for tree in new base new; do
    root="$PWD"; [ "$tree" = base ] && root="$PWD/ab_base"
    peers=""; [ "$tree" = new ] && peers="torch compile liger flaggems"
    PYTHONPATH="$root:$SITE" timeout 280 python3 benchmarks/call_path.py "$OUT/eager-$tree.json" $peers 2>&1 \
      | grep -v -i warn | tee -a "$OUT/eager.log"
  done
fi
if [ "${1:-eager}" = "bandwidth" ]; then
  for tree in base new; do
    root="$PWD"; [ "$tree" = base ] && root="$PWD/ab_base"
    echo "== $tree" | tee -a "$OUT/bench.log"
    PYTHONPATH="$root" timeout 250 python3 -m portable_softmax bench --backward --peers torch --out "$OUT/bw-$tree" \
      --no-progress 2>&1 | grep -v -i warn | tail -20 | tee -a "$OUT/bench.log"
  done
  PORTABLE_SOFTMAX_REQUIRE_DEVICE=cuda PYTHONPATH="$PWD" timeout 200 python3 -m pytest tests -q -p no:cacheprovider \
    -k "cuda and (call_path or regime or split or reread or dtype)" -x 2>&1 | tail -8 | tee "$OUT/tests.log"
fi
