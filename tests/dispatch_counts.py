"""What a call dispatches, counted: the aten ops (below autograd, views and the autograd engine's
own included), the collectives apart, the float32 buffers of a shape, the kernel launches, and
the Python functions it enters.
Shared by the host-path tests and the probes that measure the same (``benchmarks/probes/*_host_ops.py``)."""
from __future__ import annotations

import collections
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from portable_softmax import launch

# The namespaces of torch.distributed's collectives as aten sees them.
COLLECTIVES = ("c10d", "_c10d_functional")


class DispatchedOps(TorchDispatchMode):
    """The aten ops dispatched while active, by name in order (``names``); collectives are counted
    apart (``collectives``)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []
        self.collectives = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in COLLECTIVES:
            self.collectives += 1
        else:
            self.names.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))

    @property
    def counts(self) -> collections.Counter:
        return collections.Counter(self.names)


class FloatBuffers(TorchDispatchMode):
    """Counts the float32 tensors of ``shape`` made while active (``count``)."""

    def __init__(self, shape) -> None:
        super().__init__()
        self.shape, self.count = tuple(shape), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.dtype == torch.float32 and tuple(out.shape) == self.shape:
            self.count += 1
        return out


def counted_launches(stub: bool) -> collections.Counter:
    """Count every launch by kernel from now on (``launch.LaunchRecord._launch`` replaced); with
    ``stub``, each returns its plan at once, launching nothing."""
    counted: collections.Counter = collections.Counter()
    real = launch.LaunchRecord._launch

    def counting(record: launch.LaunchRecord, tensors: tuple) -> launch.LaunchPlan:
        counted[record.kernel.fn.__name__] += len(record.launches)
        return record.plan if stub else real(record, tensors)

    launch.LaunchRecord._launch = counting
    return counted


def python_calls(step) -> collections.Counter:
    """The Python functions ``step()`` enters, counted by "file path:function"."""
    entered: collections.Counter = collections.Counter()

    def profile(frame, event, arg) -> None:
        if event == "call":
            entered[f"{frame.f_code.co_filename}:{frame.f_code.co_name}"] += 1

    sys.setprofile(profile)
    try:
        step()
    finally:
        sys.setprofile(None)
    return entered
