"""Where a repeated cross-entropy call's host time goes on a GPU machine: cProfile over calls
back to back (a synchronize every 10 calls, outside nothing: the profile is of the host's work),
ours forward + ``backward()`` and forward alone, beside torch eager's, the functions with the
most time of their own first. cProfile's own cost inflates Python-heavy paths: read the shares,
not the totals.

    python benchmarks/probes/loss_host_profile.py [--shape 8192x32000] [--calls 300] [--top 25]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch
import torch.nn.functional as F

import portable_softmax


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="8192x32000")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    n, v = (int(s) for s in args.shape.split("x"))
    x0 = torch.randn(n, v, device="cuda").bfloat16()
    target = torch.randint(0, v, (n,), device="cuda")
    target[::7] = -100
    x = x0.clone().requires_grad_()

    def train(loss) -> None:
        x.grad = None
        loss(x, target).backward()

    def alone(loss) -> None:
        with torch.no_grad():
            loss(x0, target)

    for name, loss in (("ours", portable_softmax.cross_entropy), ("torch", F.cross_entropy)):
        for path, step in (("fwd+bwd", train), ("fwd", alone)):
            for _ in range(20):
                step(loss)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for i in range(args.calls):
                step(loss)
                if i % 10 == 9:
                    torch.cuda.synchronize()
            torch.cuda.synchronize()
            plain = (time.perf_counter() - start) / args.calls * 1e6
            profile = cProfile.Profile()
            profile.enable()
            for i in range(args.calls):
                step(loss)
                if i % 10 == 9:
                    torch.cuda.synchronize()
            profile.disable()
            torch.cuda.synchronize()
            out = io.StringIO()
            stats = pstats.Stats(profile, stream=out).sort_stats("tottime")
            stats.print_stats(args.top)
            print(f"=== {name} {path} {args.shape} bf16: {plain:.1f} us a call unprofiled (a synchronize every 10)")
            print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[:6000])


if __name__ == "__main__":
    main()
