#!/usr/bin/env bash
# One device call for the real-use cases (issue 18): `portable-softmax bench --cases real` with the
# peers (Liger and FlagGems from .whl/ when carried), logs, JSON and the plot under $OUT.
# Usage (device machine, repo root): bash benchmarks/device_real_use.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
SITE=/tmp/site
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
PYTHONPATH="$PWD:$SITE" timeout 500 python3 -m portable_softmax bench --cases real \
  --peers torch compile liger flaggems --out "$OUT" 2>&1 | grep -v -i warn | tee "$OUT/real.log"
