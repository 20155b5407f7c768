"""The GPU timeline of one loss call, kernel by kernel: each kernel's duration and the idle gap
before it (from the previous kernel's end), medians over calls back to back, read from torch's
profiler (CUPTI). Where the short rows' forward + backward spends its GPU time beyond the large
kernel: the stats, the sum, torch's ones for ``backward()``, the rescale, and the gaps between.

    python benchmarks/probes/loss_chain_timeline.py [--shape 8192x32000] [--dtype bfloat16] [--calls 20]
"""
from __future__ import annotations

import argparse
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

import portable_softmax


def _kernels(prof) -> list[tuple[str, float, float]]:
    """(name, start us, duration us) of every GPU kernel and memset, in start order."""
    found = [(e.name, e.time_range.start, e.time_range.end - e.time_range.start) for e in prof.events()
             if e.device_type == torch.autograd.DeviceType.CUDA]
    return sorted(found, key=lambda k: k[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="8192x32000")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    n, v = (int(s) for s in args.shape.split("x"))
    x0 = (torch.randn(n, v, device="cuda") * 2).to(getattr(torch, args.dtype))
    target = torch.randint(0, v, (n,), device="cuda")
    target[::7] = -100
    x = x0.clone().requires_grad_()

    def train() -> None:
        x.grad = None
        portable_softmax.cross_entropy(x, target).backward()

    def alone() -> None:
        with torch.no_grad():
            portable_softmax.cross_entropy(x0, target)

    for label, step in (("forward + backward", train), ("forward alone", alone)):
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.calls):
                step()
            torch.cuda.synchronize()
        kernels = _kernels(prof)
        per_call = len(kernels) // args.calls
        rows: dict[int, list[tuple[str, float, float]]] = {}
        for i, (name, start, duration) in enumerate(kernels[per_call:], start=per_call):
            gap = start - (kernels[i - 1][1] + kernels[i - 1][2])
            rows.setdefault(i % per_call, []).append((name, duration, gap))
        print(f"=== {args.shape} {args.dtype} {label}: {per_call} kernels a call, medians over {args.calls - 1} calls")
        total = 0.0
        for i in sorted(rows):
            name = rows[i][0][0]
            duration = statistics.median(r[1] for r in rows[i])
            gap = statistics.median(r[2] for r in rows[i])
            total += duration + gap
            print(f"  gap {gap:7.2f} us  kernel {duration:8.2f} us  {name[:90]}")
        print(f"  a call: {total:.1f} us of GPU time and gaps")


if __name__ == "__main__":
    main()
