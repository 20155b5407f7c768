"""The held gradient's rescale (``cross_entropy_grad_scale``) on grids of other sizes than its plan's:
GPU time of the kernel alone, do_bench, for an incoming gradient of 1 (every program reads it and
returns: the usual ``loss.backward()``) and of 0.5 (a full pass over the gradient: accumulated
gradients scaled by the caller), each grid checked against torch first. The plan's grid holds a few
waves of resident programs (``loss_planner.plan_elementwise``); one wave would launch fewer programs
that only read one value (NOTES v44 queue item 4).

    python benchmarks/probes/grad_scale_grid.py [--shape 8192x32000] [--dtype bfloat16] [--grids 528 1056 2112]
"""
from __future__ import annotations

import argparse
import dataclasses

import torch
import triton.testing

from portable_softmax import variants
from portable_softmax.device import backend_for, device_record
from portable_softmax.launch import LaunchRecord
from portable_softmax.launch_compile import _kernel_module
from portable_softmax.loss_planner import plan_elementwise
from portable_softmax.targets import target_for


def _record(device: torch.device, grad: torch.Tensor, programs: int) -> LaunchRecord:
    """The rescale's record as ``loss_launch._grad_scale`` builds it, its grid set to ``programs``."""
    backend = backend_for(device)
    record = device_record(device)
    plan = plan_elementwise(target_for(record), grad.numel(), variants.GRAD_SCALE_BLOCK)
    plan = dataclasses.replace(plan, programs=programs)
    kernel = getattr(_kernel_module(backend), variants.GRAD_SCALE_KERNEL)
    overlap = record.dependent_launch
    options = {"num_warps": plan.num_warps, "num_stages": 1, **({"launch_pdl": True} if overlap else {})}
    constexprs = {"BLOCK": variants.GRAD_SCALE_BLOCK, "ACC_FP64": False, "DEPENDENT": overlap}
    return LaunchRecord(kernel, backend, device, plan, (grad.numel(),), (constexprs,), options, None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="8192x32000")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--grids", type=int, nargs="+", default=[528, 1056, 2112])
    args = parser.parse_args()
    device = torch.device("cuda", torch.cuda.current_device())
    n, v = (int(s) for s in args.shape.split("x"))
    dtype = getattr(torch, args.dtype)
    grad = torch.randn(n, v, device=device).to(dtype)
    planned = plan_elementwise(target_for(device_record(device)), grad.numel(), variants.GRAD_SCALE_BLOCK)
    copy = triton.testing.do_bench(lambda: grad.clone(), return_mode="median")
    print(f"{args.shape} {args.dtype}: the plan's grid {planned.programs} programs of {planned.num_warps} warps; "
          f"clone {copy * 1e3:.1f} us")
    for programs in args.grids:
        record = _record(device, grad, programs)
        for value in (1.0, 0.5):
            dloss = torch.full((), value, device=device, dtype=dtype)
            scaled = grad.clone()
            record((scaled, dloss))
            torch.cuda.synchronize()
            # The rescale rounds once from float32, as torch's multiply by a scalar of the same dtype.
            assert torch.equal(scaled, grad * dloss), (programs, value)
            ms = triton.testing.do_bench(lambda: record((scaled, dloss)), return_mode="median")
            print(f"  grid {programs:5d}  dloss {value}: {ms * 1e3:7.2f} us"
                  + (f"  ({copy / ms:.2f} of clone)" if value != 1.0 else ""))


if __name__ == "__main__":
    main()
