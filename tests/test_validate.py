"""The vendor report: written, complete, and failing when a case fails. Small cases: the report's
own (rows of 131072 among them) take minutes through the interpreter, and what is tested here is
the report, not the kernels (the other test files run those)."""
import json

import pytest
import torch

from portable_softmax import selfcheck, validate
from portable_softmax.cli import main

# validate.FUSED's kinds in small shapes: a scale tensor with a bool mask and causal, a number
# scale with an additive mask.
SMALL_FUSED = [
    ((2, 2, 5, 33), -1, torch.float32, lambda d: {"scale": torch.rand(2, 2, 5, 1, device=d) + 0.5,
                                                  "mask": torch.rand(2, 1, 5, 33, device=d) > 0.3,
                                                  "causal": True}),
    ((2, 2, 5, 33), -1, torch.bfloat16, lambda d: {"scale": 0.125, "mask": torch.randn(1, 1, 5, 33, device=d)}),
]


@pytest.fixture(autouse=True)
def _small_fused_cases(monkeypatch):
    monkeypatch.setattr(validate, "FUSED", SMALL_FUSED)


def test_validate_writes_a_complete_report(tmp_path, monkeypatch):
    monkeypatch.setattr(validate, "CONFORMANCE", [((33, 257), torch.float32), ((4, 1), torch.bfloat16)])
    assert main(["--device", "cpu", "validate", "--out", str(tmp_path), "--no-bench"]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["passed"] and report["device"]["backend"] == "interpreter"
    assert len(report["conformance"]) == 2 * 2 * 2  # cases x (softmax, log_softmax) x (forward, backward)
    assert "## Conformance" in (tmp_path / "report.md").read_text()


def test_validate_reports_a_failure(tmp_path, monkeypatch):
    monkeypatch.setattr(validate, "CONFORMANCE", [((8, 33), torch.float32)])
    monkeypatch.setattr(selfcheck, "ERROR_FLOOR", {**selfcheck.ERROR_FLOOR, torch.float32: -1.0})
    monkeypatch.setattr(selfcheck, "ERROR_FACTOR", -1.0)
    assert main(["--device", "cpu", "validate", "--out", str(tmp_path), "--no-bench"]) == 1
    assert "NO" in (tmp_path / "report.md").read_text()


def test_validate_checks_the_fused_variants(tmp_path, monkeypatch):
    """A fused kernel that ignores its mask fails the report; the real ones pass it."""
    from portable_softmax import fused

    monkeypatch.setattr(validate, "CONFORMANCE", [((4, 1), torch.float32)])
    assert main(["--device", "cpu", "validate", "--out", str(tmp_path), "--no-bench"]) == 0
    checks = json.loads((tmp_path / "report.json").read_text())["checks"]
    assert sum(c["case"].startswith("fused") for c in checks) == 4
    # Kernels built without the mask (their launches kept apart from the real ones').
    real = fused._kernels
    monkeypatch.setattr(fused, "_kernels", lambda direction, inputs, dim, out_dtype, log, scale, mask, causal:
                        real(direction, inputs, dim, out_dtype, log, scale, None, causal))
    monkeypatch.setattr(fused, "_forward_calls", {})
    monkeypatch.setattr(fused, "_backward_calls", {})
    assert main(["--device", "cpu", "validate", "--out", str(tmp_path), "--no-bench"]) == 1
    failed = [c["case"] for c in json.loads((tmp_path / "report.json").read_text())["checks"] if not c["passed"]]
    assert failed and all(case.startswith("fused") and "mask" in case for case in failed)
