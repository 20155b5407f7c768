"""Why the per-row temperature over (256, 151936) fp32 read 0.98 of copy as the backward op and
0.58 through autograd (H100, 2026-11-24): the same kernel, so either host time the flush does
not hide or other kernels. Times both paths with do_bench (GPU events, cache flushed) and by the
host's clock back to back, and lists the kernels each launches (torch.profiler).

    python benchmarks/probes/fused_autograd.py
"""
from __future__ import annotations

import cProfile
import io
import pstats
import time

import torch
from triton.testing import do_bench

import portable_softmax as ps
from portable_softmax import fused


def wall_us(fn, calls: int = 200) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def kernels(fn) -> list[str]:
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [f"{e.key} x{e.count} {e.device_time_total:.0f}us" for e in prof.key_averages() if e.device_time_total > 0]


def host_profile(fn, calls: int = 100) -> str:
    """Where the host's time goes over ``calls`` back-to-back calls (cProfile, by own time)."""
    fn()
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(12)
    return text.getvalue()


def main() -> None:
    for shape in [(256, 151936), (64, 151936)]:
        x = torch.randn(shape, device="cuda")
        scale = 1 / (torch.rand(shape[0], 1, device="cuda") + 0.5)
        dy = torch.randn(shape, device="cuda")
        leaf = x.detach().requires_grad_()
        y = ps.softmax(leaf, -1, scale=scale)
        yd = y.detach()
        y_plain = ps.softmax(leaf, -1)
        y_torch = torch.softmax(leaf * scale, -1)
        paths = {
            "op": lambda: fused._fused_backward(yd, dy, 1, yd.dtype, False, scale, None, False),
            "autograd": lambda: torch.autograd.grad(y, leaf, dy, retain_graph=True)[0],
            "plain op": lambda: ps.op_calls._backward(yd, dy, 1, yd.dtype, False),
            "plain autograd": lambda: torch.autograd.grad(y_plain, leaf, dy, retain_graph=True)[0],
            "torch autograd": lambda: torch.autograd.grad(y_torch, leaf, dy, retain_graph=True)[0],
        }
        copy = do_bench(lambda: x.clone())
        print(f"{shape}: clone {copy * 1e3:.0f} us")
        for name, fn in paths.items():
            ms = do_bench(fn)
            print(f"  {name:14s} do_bench {ms * 1e3:7.1f} us ({1.5 * copy / ms:.2f} of copy)  "
                  f"back to back {wall_us(fn):7.1f} us")
            for line in kernels(fn):
                print(f"      {line}")
        if shape[0] == 64:
            for name in ("op", "autograd"):
                print(f"--- host profile, {name}, {shape}")
                print(host_profile(paths[name]))


if __name__ == "__main__":
    main()
