"""What a repeated ``softmax`` / ``log_softmax`` call costs the host through autograd (issue 34 item
9): (a) the torch operations it dispatches (a ``TorchDispatchMode`` counts every aten op below
autograd; under a mode the shallow copies autograd makes of a saved output and of the gradient it
accumulates show as ``detach``, torch's own softmax's included), the kernel launches it makes and
the Python functions it enters, (b) its host time per call, the median of many calls, against
torch's eager softmax of the same call; forward alone (no grad) and forward + ``y.backward(dy)``,
the default call (no fused options).

Each torch op costs a CUDA call ~5 us of host time and each Triton launch ~15-25 us (H100,
``benchmarks/loss_host.py``); what is left is Python, which this probe times on any machine.

On CPU (the default) the launches are stubbed (a launch returns its plan at once), so that counts
and times are an accelerator call's Python path; the shape is tiny (4x300 float32). With
``--device cuda`` (``PROBE_ARGS='--device cuda' bash benchmarks/device.sh probe:softmax_host_ops``)
nothing is stubbed and the shape is 1823x781 bf16 (the tutorial's, whose autograd ratio NOTES v27
read), timed one call at a time with a synchronize every 10 calls outside the timing.

    python benchmarks/probes/softmax_host_ops.py [--device cuda] [--calls N] [--shape 4x300] [--dtype float32]
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
from collections.abc import Callable

import torch

import portable_softmax as ps
from portable_softmax.host_time import median_call_us

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
from dispatch_counts import DispatchedOps, counted_launches, python_calls  # noqa: E402  (the tests' counters, shared)


def _entered(step: Callable[[], None]) -> collections.Counter:
    """The Python functions ``step`` enters (file:function), the step itself and the launch
    counter (``counted_launches``) left out."""
    entered = collections.Counter({key.rsplit("/", 1)[-1]: n for key, n in python_calls(step).items()})
    entered.pop("dispatch_counts.py:counting", None)
    for name in [name for name in entered if name.startswith("softmax_host_ops.py:")]:
        del entered[name]
    return entered


def _steps(fn: Callable, x: torch.Tensor, dy: torch.Tensor) -> dict[str, Callable[[], None]]:
    def forward() -> None:
        with torch.no_grad():
            fn(x, -1)

    def train() -> None:
        x.grad = None
        fn(x, -1).backward(dy)

    return {"fwd": forward, "fwd+bwd": train}


def _case(log: bool, launches: collections.Counter, args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    shape = tuple(int(n) for n in args.shape.split("x"))
    dtype = getattr(torch, args.dtype)
    x = torch.randn(*shape, device=args.device).to(dtype).requires_grad_()
    dy = torch.randn(*shape, device=args.device).to(dtype)
    name = "log_softmax" if log else "softmax"
    ours = _steps(ps.log_softmax if log else ps.softmax, x, dy)
    theirs = _steps(torch.log_softmax if log else torch.softmax, x, dy)
    synchronize = getattr(torch, x.device.type).synchronize if x.device.type != "cpu" else lambda: None
    for path in ours:
        ours[path]()  # the first call plans and builds its records
        launches.clear()
        with DispatchedOps() as counter:
            ours[path]()
        launched = dict(launches)
        with DispatchedOps() as torch_counter:
            theirs[path]()
        frames, torch_frames = _entered(ours[path]), _entered(theirs[path])
        ops = sum(counter.counts.values())
        detail = " ".join(f"{op}:{n}" for op, n in sorted(counter.counts.items()))
        ours_only = " ".join(f"{f}:{n}" if n > 1 else f for f, n in sorted((frames - torch_frames).items()))
        print(f"{name:12} {path:8} ops {ops:2d} (torch {sum(torch_counter.counts.values()):2d})  launches "
              f"{sum(launched.values())}  python calls {sum(frames.values()):3d} (torch {sum(torch_frames.values()):3d})"
              f"  host {median_call_us(ours[path], args.calls, synchronize):6.1f} us (torch "
              f"{median_call_us(theirs[path], args.calls, synchronize):5.1f})  [{detail}] {launched}\n"
              f"{'':21} ours beyond torch's: {ours_only}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--shape", default=None, help="rows x columns (4x300 on CPU, 1823x781 elsewhere)")
    parser.add_argument("--dtype", default=None, help="float32 on CPU, bfloat16 elsewhere")
    args = parser.parse_args()
    cpu = args.device == "cpu"
    args.shape = args.shape or ("4x300" if cpu else "1823x781")
    args.dtype = args.dtype or ("float32" if cpu else "bfloat16")
    torch.set_num_threads(1)  # torch's intra-op threads wait on each other on a loaded machine
    launches = counted_launches(stub=cpu)
    for log in (False, True):
        _case(log, launches, args)


if __name__ == "__main__":
    main()
