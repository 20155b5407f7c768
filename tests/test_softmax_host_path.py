"""What a repeated ``softmax`` / ``log_softmax`` through autograd (forward and ``y.backward(dy)``,
the default call) costs the host: the torch ops it dispatches, its launches, and the Python
functions it enters beyond those torch's own softmax enters for the same step (``Tensor.backward``
and the engine's are both's). CPU, the launches stubbed: the host path is the same on every backend
but the launches. ``benchmarks/probes/softmax_host_ops.py`` prints the same counts and the host
time against torch's."""
from __future__ import annotations


import pytest
import torch

import portable_softmax as ps
from portable_softmax import launch
from dispatch_counts import DispatchedOps, python_calls

# 2026-11-28, torch 2.13: 26 Python functions beyond torch's (the public function and its routing,
# the compile check, the autograd Function's apply wrapper, forward and backward and its backward
# node's lookup, the call record's lookup, its forward and backward and their launches, the held
# gradient call). Sending the Function to torch's C apply and its backward node straight to its
# backward made 16 (17.8 us a step against 20.3, torch's 12.4, probes/softmax_host_ops.py), by
# patching torch's generated backward class: not taken, for 1.5 us. Two of slack for another
# torch's compile check.
PYTHON_CALLS_BEYOND_TORCHS = 28


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_a_repeated_forward_and_backward_is_torchs_ops_two_launches_and_little_python(monkeypatch, log):
    launches = []
    monkeypatch.setattr(launch.LaunchRecord, "_launch", lambda self, tensors: launches.append(self) or self.plan)
    fn, theirs = (ps.log_softmax, torch.log_softmax) if log else (ps.softmax, torch.softmax)
    x = torch.randn(4, 300, requires_grad=True)
    dy = torch.randn(4, 300)

    def step(fn) -> None:
        x.grad = None
        fn(x, -1).backward(dy)

    step(fn)
    step(theirs)
    launches.clear()
    with DispatchedOps() as ops:
        step(fn)
    with DispatchedOps() as torch_ops:
        step(theirs)
    # Two allocations (torch's softmax and its backward allocate as theirs) and the shallow copies
    # autograd makes of the saved output and of the accumulated gradient (``detach`` under a mode).
    assert len(ops.names) <= len(torch_ops.names), (ops.names, torch_ops.names)
    # One launch a direction: the forward's record, and the backward's its forward call holds.
    assert [record.kernel.fn.__name__ for record in launches] == ["softmax_forward_tile", "softmax_backward_tile"]
    ours = python_calls(lambda: step(fn))
    beyond = ours - python_calls(lambda: step(theirs))
    beyond.pop(f"{__file__}:<lambda>", None)
    assert sum(beyond.values()) <= PYTHON_CALLS_BEYOND_TORCHS, sorted(beyond.items())
