"""The host's cost of a launch that overlaps the kernel before it (``kernels/dependency.py``): the
same small kernel (the loss's rescale, which returns at once for an incoming 1) launched back to
back through its record, with and without ``launch_pdl``, alternated, microseconds of host a
launch (the GPU idles between them: host-bound by construction).

    python benchmarks/probes/overlap_launch_host.py [--launches 5000] [--rounds 4]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from portable_softmax import variants
from portable_softmax.device import backend_for, device_record
from portable_softmax.launch import LaunchRecord
from portable_softmax.launch_compile import _kernel_module
from portable_softmax.loss_planner import plan_elementwise
from portable_softmax.targets import target_for


def _record(device: torch.device, grad: torch.Tensor, overlap: bool) -> LaunchRecord:
    backend = backend_for(device)
    plan = plan_elementwise(target_for(device_record(device)), grad.numel(), variants.GRAD_SCALE_BLOCK)
    kernel = getattr(_kernel_module(backend), variants.GRAD_SCALE_KERNEL)
    options = {"num_warps": plan.num_warps, "num_stages": 1, **({"launch_pdl": True} if overlap else {})}
    constexprs = {"BLOCK": variants.GRAD_SCALE_BLOCK, "ACC_FP64": False, "DEPENDENT": overlap}
    return LaunchRecord(kernel, backend, device, plan, (grad.numel(),), (constexprs,), options, None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--launches", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    device = torch.device("cuda", torch.cuda.current_device())
    grad = torch.zeros(4096, device=device, dtype=torch.bfloat16)
    dloss = torch.ones((), device=device, dtype=torch.bfloat16)
    records = {overlap: _record(device, grad, overlap) for overlap in (False, True)}
    for record in records.values():
        for _ in range(100):
            record((grad, dloss))
    torch.cuda.synchronize()
    found: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.rounds):
        for overlap, record in records.items():
            start = time.perf_counter()
            for _ in range(args.launches):
                record((grad, dloss))
            found[overlap].append((time.perf_counter() - start) / args.launches * 1e6)
            torch.cuda.synchronize()
    for overlap, values in found.items():
        print(f"launch_pdl={overlap!s:5}: {statistics.median(values):.2f} us of host a launch "
              f"({' '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
