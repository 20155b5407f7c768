"""The Ascend kernels lower through triton-ascend to Linalg (``ci/ascend_lowering.py``).

Needs a venv with triton-ascend, which cannot share this environment (it installs as ``triton``):
``bash ci/ascend_lowering.sh`` makes ``.venv-ascend``; then
``PORTABLE_SOFTMAX_ASCEND_VENV=.venv-ascend/bin/python pytest tests/test_ascend_lowering.py``.
Skipped without that variable. It may name the venv's python or the venv folder.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "ci" / "ascend_lowering.py"
KERNELS = ("softmax_forward_tile", "softmax_forward_loop", "softmax_backward_tile", "softmax_backward_loop",
           "cross_entropy_forward_tile", "cross_entropy_forward_loop", "cross_entropy_forward_split",
           "cross_entropy_backward", "cross_entropy_grad_scale", "cross_entropy_stats")


def _ascend_python() -> Path | None:
    value = os.environ.get("PORTABLE_SOFTMAX_ASCEND_VENV", "").strip()
    if not value:
        return None
    path = Path(value)
    if not path.is_absolute():
        path = ROOT / path
    if path.is_dir():
        path = path / "bin" / "python"
    return path


@pytest.mark.skipif(_ascend_python() is None, reason="PORTABLE_SOFTMAX_ASCEND_VENV not set (see ci/ascend_lowering.sh)")
def test_ascend_kernels_lower_to_linalg(tmp_path: Path) -> None:
    python = _ascend_python()
    assert python.exists(), f"PORTABLE_SOFTMAX_ASCEND_VENV={python} does not exist"
    # torch_npu, if that venv has it, must not be auto-loaded without CANN: it would break import torch.
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    done = subprocess.run([str(python), str(SCRIPT), "--out", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"lowering failed:\n{done.stdout[-8000:]}\n{done.stderr[-8000:]}"
    assert "FAIL" not in done.stdout
    linalg = sorted(tmp_path.glob("*.ttadapter.mlir"))
    for kernel in KERNELS:
        mine = [p for p in linalg if p.name.startswith(kernel + ".")]
        assert mine, f"no Linalg output for {kernel}"
        for path in mine:
            text = path.read_text()
            assert f"func.func @{kernel}(" in text and "linalg." in text, path.name
            assert "tt." not in text.replace("tt.divisibility", "").replace("tt.tensor_kind", ""), \
                f"{path.name}: Triton ops left after ttadapter"
