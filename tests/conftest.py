"""Shared fixtures: the devices present, parametrized so every kernel test runs on each of them.

``PORTABLE_SOFTMAX_REQUIRE_DEVICE=cuda`` (or hip, npu) makes the session fail when that device is
absent, so a CI runner that lost its accelerator cannot pass by skipping.
"""
from __future__ import annotations

import os

import pytest
import torch


def _npu_available() -> bool:
    npu = getattr(torch, "npu", None)
    return bool(npu is not None and npu.is_available())


PRESENT = {
    "cpu": True,
    "cuda": torch.cuda.is_available() and torch.version.hip is None,
    "hip": torch.cuda.is_available() and torch.version.hip is not None,
    "npu": _npu_available(),
}
TORCH_DEVICE = {"cpu": "cpu", "cuda": "cuda", "hip": "cuda", "npu": "npu"}

DEVICES = [
    pytest.param(TORCH_DEVICE[name], id=name, marks=pytest.mark.skipif(not present, reason=f"no {name} device here"))
    for name, present in PRESENT.items()
]


def pytest_sessionstart(session: pytest.Session) -> None:
    required = os.environ.get("PORTABLE_SOFTMAX_REQUIRE_DEVICE", "").strip()
    if required and not PRESENT.get(required, False):
        raise pytest.UsageError(f"PORTABLE_SOFTMAX_REQUIRE_DEVICE={required!r} but no such device is present "
                                f"(present: {[name for name, ok in PRESENT.items() if ok]})")


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(autouse=True)
def _fresh_seed() -> None:
    # Fresh inputs per test, yet reproducible from the test id when a failure is reported.
    torch.manual_seed(hash(os.environ.get("PYTEST_CURRENT_TEST", "")) % 2**31)
