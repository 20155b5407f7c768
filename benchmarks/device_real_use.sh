#!/usr/bin/env bash
# One device call for the real-use cases (issue 18): `portable-softmax bench --cases real` (attention
# scores, NCHW channels, columns, a transposed input, sliced vocabulary rows, router rows) with the
# peers: torch eager and torch.compile always; Liger and FlagGems from .whl/ when carried; QuACK when
# its prepared folder is given (see ../shared/peers/README.md: `bash ../shared/peers/quack/prepare.sh
# .quack` here, a first device call carrying .quack/A that runs
# `mkdir -p /tmp/qk && xz -T8 -dc .quack/A/ir.so.xz > /tmp/qk/ir.so`, then this one, within 30 s,
# carrying .quack/B and .whl with the argument .quack). Table, logs, JSON and plot under $OUT.
# Usage (device machine, repo root): bash benchmarks/device_real_use.sh [QUACK_DIR]
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
SITE=/tmp/site
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl
fi
peers="torch compile liger flaggems"
if [ -n "${1:-}" ]; then
  # setup.sh unpacks QuACK under /tmp/quack-site and puts it on PYTHONPATH.
  if source "$1/B/setup.sh" "$1"; then peers="$peers quack"; else echo "quack: not set up (see the header)"; fi
fi
export PYTHONPATH="$PWD:$SITE:${PYTHONPATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 - <<'EOF' 2>&1 | tee -a "$OUT/gpu.txt"
import importlib.metadata as metadata
import torch, triton
print("torch", torch.__version__, "triton", triton.__version__)
for name in ("liger-kernel", "flag-gems", "quack-kernels"):
    try:
        print(name, metadata.version(name))
    except metadata.PackageNotFoundError:
        print(name, "not installed")
EOF
timeout 540 python3 -m portable_softmax bench --cases real --peers $peers --out "$OUT" 2>&1 \
  | grep -v -i -E "warn|online softmax|split the reduction|important use case|^softmax\.$|^$" | tee "$OUT/real.log"
