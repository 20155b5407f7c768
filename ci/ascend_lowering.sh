#!/usr/bin/env bash
# Prove, without CANN or an NPU, that the Ascend kernels lower through triton-ascend down to its
# Linalg stage (`ttadapter`), in a venv of its own: triton-ascend installs as the `triton` module
# and would clash with upstream triton in the main environment. See ci/ascend_lowering.py.
#
#   bash ci/ascend_lowering.sh [--out DIR]          # venv at .venv-ascend (ignored by .gitignore)
#   ASCEND_VENV=/tmp/v bash ci/ascend_lowering.sh
#   bash ci/ascend_lowering.sh --install-only       # the venv alone: tests/test_ascend_lowering.py
#                                                   # lowers with it (PORTABLE_SOFTMAX_ASCEND_VENV)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ASCEND_VENV:-.venv-ascend}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
# pybind11: triton-ascend's launcher imports it; numpy<2.4: its interpreter needs it. No torch:
# lowering to Linalg never imports it (torch / torch_npu are only needed to launch on an NPU).
"$VENV/bin/python" -m pip install --quiet "triton-ascend==3.2.0" pybind11 "numpy<2.4"
if [ "${1:-}" = "--install-only" ]; then
    exit 0
fi
exec "$VENV/bin/python" ci/ascend_lowering.py "$@"
