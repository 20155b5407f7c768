"""Where a call's GPU time goes, kernel by kernel (torch.profiler): for a split launch, the fill
of its exchange slots beside the split kernel, and the gap between them that do_bench counts.

    python benchmarks/probes/kernel_parts.py [--only NAME ...] [--calls 50]
"""
from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

import portable_softmax as ps
from portable_softmax import bench_cases


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="+", default=["temperature per row"])
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    print(torch.cuda.get_device_name())
    for case in bench_cases.cases(fused_only=True):
        if not any(part in case.name for part in args.only):
            continue
        x = case.make(torch.device("cuda"), False)
        fusion = case.fused_arguments(x)
        for name, call in (("fused", lambda: ps.softmax(x, case.dim, **fusion)),
                           ("plain", lambda: ps.softmax(x, case.dim))):
            call()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(args.calls):
                    call()
                torch.cuda.synchronize()
            kernels = defaultdict(list)
            for event in prof.events():
                if event.device_type == torch.autograd.DeviceType.CUDA:
                    kernels[event.name[:60]].append(event.device_time)
            per_call = do_bench(call, return_mode="median") * 1e3
            parts = "; ".join(f"{k} {sum(v) / len(v):.1f} us x{len(v) // args.calls}" for k, v in kernels.items())
            print(f"{case.name} {name}: do_bench {per_call:.1f} us = {parts}", flush=True)


if __name__ == "__main__":
    main()
