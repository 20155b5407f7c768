"""Shared fixtures: the devices present, parametrized so every kernel test runs on each of them.

``PORTABLE_SOFTMAX_REQUIRE_DEVICE=cuda`` (or hip, npu) makes the session fail when that device is
absent, so a CI runner that lost its accelerator cannot pass by skipping.
"""
from __future__ import annotations

import os
import zlib

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


SEED_PROPERTY = "torch_seed"


def seed_for(nodeid: str) -> int:
    """The seed of a test: a stable hash of its id (Python's ``hash`` of a string changes with
    every process), so that a failing id gives the same data in the next run."""
    return zlib.crc32(nodeid.encode())


@pytest.fixture(autouse=True)
def _fresh_seed(request: pytest.FixtureRequest) -> None:
    # Fresh inputs per test, yet reproducible from the test id when a failure is reported.
    seed = seed_for(request.node.nodeid)
    torch.manual_seed(seed)
    request.node.user_properties.append((SEED_PROPERTY, seed))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    # A failure's report names the seed its data came from.
    outcome = yield
    report = outcome.get_result()
    seed = dict(item.user_properties).get(SEED_PROPERTY)
    if report.failed and seed is not None:
        report.sections.append(("torch seed", f"torch.manual_seed({seed})  # zlib.crc32 of {item.nodeid!r}"))
