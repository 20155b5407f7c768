"""Where a loss step's host time goes on the GPU (issue 32, v30): the forward call and
``loss.backward()`` timed apart by the host's clock, the held gradient's rescale alone, and a
cProfile of the backward's Python (top functions by own time).

    PYTHONPATH=. python3 benchmarks/probes/loss_backward_host.py [--shape 8192x32000] [--steps 100]

Host time: each phase timed without synchronising; the steps are few enough (8 launches each)
that the launch queue never fills, so the clock reads the host's work, not the GPU's.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="8192x32000")
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()

    import torch
    import torch.nn.functional as F

    import portable_softmax
    from portable_softmax import loss_rows

    n, v = (int(s) for s in args.shape.split("x"))
    x = (torch.randn(n, v, device="cuda") * 2).to(torch.bfloat16).requires_grad_()
    t = torch.randint(0, v, (n,), device="cuda")
    t[::7] = -100
    for name, loss_fn in (("ours", portable_softmax.cross_entropy), ("torch", F.cross_entropy)):
        for _ in range(5):
            x.grad = None
            loss_fn(x, t).backward()
        torch.cuda.synchronize()
        fwd = bwd = 0.0
        for _ in range(args.steps):
            x.grad = None
            a = time.perf_counter()
            loss = loss_fn(x, t)
            b = time.perf_counter()
            loss.backward()
            c = time.perf_counter()
            fwd += b - a
            bwd += c - b
            torch.cuda.synchronize()
        print(f"{name:6s} {args.shape}: host us per step: forward {fwd / args.steps * 1e6:7.1f}  "
              f"backward {bwd / args.steps * 1e6:7.1f}", flush=True)
    grad = torch.empty_like(x)
    one = torch.ones((), device="cuda", dtype=torch.bfloat16)
    loss_rows.rescale(grad, one)
    torch.cuda.synchronize()
    a = time.perf_counter()
    for _ in range(args.steps):
        loss_rows.rescale(grad, one)
    b = time.perf_counter()
    torch.cuda.synchronize()
    print(f"rescale alone: {(b - a) / args.steps * 1e6:7.1f} us per call")
    a = time.perf_counter()
    for _ in range(args.steps):
        torch.ones_like(one)
    b = time.perf_counter()
    torch.cuda.synchronize()
    print(f"one torch op (ones_like of a scalar): {(b - a) / args.steps * 1e6:7.1f} us per call")
    for phase in ("forward", "backward"):
        profile = cProfile.Profile()
        for _ in range(args.steps):
            x.grad = None
            if phase == "forward":
                profile.enable()
            loss = portable_softmax.cross_entropy(x, t)
            if phase == "backward":
                profile.enable()
            loss.backward()
            profile.disable()
            torch.cuda.synchronize()
        print(f"--- cProfile of the {phase}, {args.steps} steps, by own time")
        pstats.Stats(profile).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
