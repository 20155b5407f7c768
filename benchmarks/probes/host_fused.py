"""Host time of the fused calls against the plain ones, with the kernel launch itself stubbed
out: what the Python call path costs per call (microseconds, back to back), on any machine.

    python benchmarks/probes/host_fused.py
"""
from __future__ import annotations

import time

import torch

import portable_softmax as ps
from portable_softmax import fused, launch, op_calls


def per_call_us(fn, calls: int = 3000) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    x = torch.randn(4, 700, requires_grad=True)
    scale = 1 / (torch.rand(4, 1) + 0.5)
    dy = torch.randn(4, 700)
    y_fused, y_plain, y_torch = ps.softmax(x, -1, scale=scale), ps.softmax(x, -1), torch.softmax(x, -1)
    torch.autograd.grad(y_fused, x, dy, retain_graph=True)
    torch.autograd.grad(y_plain, x, dy, retain_graph=True)
    launch._run = lambda *args, **kwargs: 1  # every launch (the interpreter's too) returns at once
    y = y_fused.detach()
    paths = {
        "forward, fused": lambda: ps.softmax(x.detach(), -1, scale=scale),
        "forward, plain": lambda: ps.softmax(x.detach(), -1),
        "backward op, fused": lambda: fused._fused_backward(y, dy, 1, y.dtype, False, scale, None, False),
        "backward op, plain": lambda: op_calls._backward(y, dy, 1, y.dtype, False),
        "autograd, fused": lambda: torch.autograd.grad(y_fused, x, dy, retain_graph=True),
        "autograd, plain": lambda: torch.autograd.grad(y_plain, x, dy, retain_graph=True),
        "autograd, torch": lambda: torch.autograd.grad(y_torch, x, dy, retain_graph=True),
    }
    for name, fn in paths.items():
        print(f"{name:20s} {per_call_us(fn):6.1f} us")


if __name__ == "__main__":
    main()
