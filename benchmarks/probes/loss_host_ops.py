"""What a repeated ``cross_entropy`` call costs the host: (a) the torch operations it dispatches
(a ``TorchDispatchMode`` counts every aten op below autograd, views and the autograd engine's own
included) and the kernel launches it makes, (b) its host time per call, the median of many calls,
against torch's eager ``F.cross_entropy`` of the same call; forward alone (no grad) and forward +
``backward()``.

Each torch op costs a CUDA call ~5 us of host time and each Triton launch ~15-25 us (H100,
``benchmarks/loss_host.py``), so the counts say what a GPU call pays.

On CPU (the default, any machine) the launches are stubbed (a launch returns its plan at once)
and so is the CPU-only target check (``loss_rows._check_targets``: a CPU call raises on a target
out of range, an accelerator's gives NaN), so that counts and times are an accelerator call's
Python path; the shape is tiny (4x300 float32). Cases: the default options ('mean', class targets)
in the regime a tiny call takes there (tile) and in the split regime (forced, as
``tests/test_loss_host_time.py``: its path does the most host work), then one of each other option.

With ``--device cuda`` (``PROBE_ARGS='--device cuda' bash benchmarks/device.sh probe:loss_host_ops``)
nothing is stubbed or forced, the shape is 8192x32000 bf16 (the regime its plan takes), and the
host time is that of calls timed one by one, a synchronize every 10 calls outside the timing.

    python benchmarks/probes/loss_host_ops.py [--device cuda] [--calls N] [--shape 4x300] [--dtype float32]
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import portable_softmax as ps
from portable_softmax import loss_launch, loss_rows
from portable_softmax.host_time import median_call_us

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
from dispatch_counts import DispatchedOps, counted_launches  # noqa: E402  (the tests' counters, shared)
from regimes import force_regime  # noqa: E402  (the tests' regime forcing, shared)


def _steps(fn: Callable, x: torch.Tensor, target: torch.Tensor, kwargs: dict) -> dict[str, Callable[[], None]]:
    def forward() -> None:
        with torch.no_grad():
            fn(x, target, **kwargs)

    def train() -> None:
        x.grad = None
        loss = fn(x, target, **kwargs)
        (loss.sum() if loss.dim() else loss).backward()

    return {"fwd": forward, "fwd+bwd": train}


def _case(name: str, kwargs: dict, launches: collections.Counter, args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    shape = tuple(int(n) for n in args.shape.split("x"))
    x = torch.randn(*shape, device=args.device).to(getattr(torch, args.dtype)).requires_grad_()
    if kwargs.pop("prob", False):
        target = torch.softmax(torch.randn(*shape, device=args.device), 1)
    else:
        target = torch.randint(0, shape[1], (shape[0],), device=args.device)
    if "weight" in kwargs:
        # In the logits' dtype: torch's own call refuses weights of another (bf16 on the GPU, v30).
        kwargs["weight"] = torch.rand(shape[1], device=args.device).to(x.dtype)
    theirs_kwargs = {k: v for k, v in kwargs.items() if k not in ("z_loss", "softcap")}
    ours, theirs = _steps(ps.cross_entropy, x, target, kwargs), _steps(F.cross_entropy, x, target, theirs_kwargs)
    synchronize = getattr(torch, x.device.type).synchronize if x.device.type != "cpu" else lambda: None
    for path in ours:
        ours[path]()  # the first call plans and builds its records
        launches.clear()
        with DispatchedOps() as counter:
            ours[path]()
        launched = dict(launches)
        with DispatchedOps() as torch_counter:
            theirs[path]()
        ops = sum(counter.counts.values())
        detail = " ".join(f"{op}:{n}" for op, n in sorted(counter.counts.items()))
        print(f"{name:24} {path:8} ops {ops:3d} (torch {sum(torch_counter.counts.values()):2d})  launches "
              f"{sum(launched.values())}  host {median_call_us(ours[path], args.calls, synchronize):6.1f} us (torch "
              f"{median_call_us(theirs[path], args.calls, synchronize):5.1f})  [{detail}] {launched}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--shape", default=None, help="rows x classes (4x300 on CPU, 8192x32000 elsewhere)")
    parser.add_argument("--dtype", default=None, help="float32 on CPU, bfloat16 elsewhere")
    args = parser.parse_args()
    cpu = args.device == "cpu"
    args.shape = args.shape or ("4x300" if cpu else "8192x32000")
    args.dtype = args.dtype or ("float32" if cpu else "bfloat16")
    torch.set_num_threads(1)  # torch's intra-op threads wait on each other on a loaded machine
    if cpu:
        loss_rows._check_targets = lambda target, options: None
    launches = counted_launches(stub=cpu)
    _case("mean", {}, launches, args)
    if cpu:
        with pytest.MonkeyPatch.context() as patch:
            force_regime(patch, "split", "cpu")
            _case("mean (split)", {}, launches, args)
            _case("sum (split)", {"reduction": "sum"}, launches, args)
    for name, kwargs in (("sum", {"reduction": "sum"}), ("none", {"reduction": "none"}), ("weight", {"weight": True}),
                         ("smoothing", {"label_smoothing": 0.1}), ("z_loss+softcap", {"z_loss": 1e-4, "softcap": 30.0}),
                         ("prob targets", {"prob": True})):
        _case(name, kwargs, launches, args)


if __name__ == "__main__":
    main()
