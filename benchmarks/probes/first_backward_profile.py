"""Where a warm-cache first softmax backward spends its time (H100, 2026-11-25: 2.6 s for forward +
backward of a (4096, 50257) bf16 softmax with Triton's cache already holding the kernels, against
0.5 s for the forward alone). Run twice in fresh processes: the first fills the cache, the second
prints a cProfile of the first forward and backward. Usage (GPU):
    PYTHONPATH=. python3 benchmarks/probes/first_backward_profile.py; PYTHONPATH=. python3 benchmarks/probes/first_backward_profile.py"""
import cProfile
import pstats
import time

import torch

import portable_softmax as ps


def main() -> None:
    x = torch.randn(4096, 50257, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    y = ps.softmax(x, -1)
    torch.cuda.synchronize()
    middle = time.perf_counter()
    profile = cProfile.Profile()
    profile.enable()
    y.backward(torch.ones_like(y))
    torch.cuda.synchronize()
    profile.disable()
    end = time.perf_counter()
    print(f"forward {middle - start:.2f} s, backward {end - middle:.2f} s", flush=True)
    pstats.Stats(profile).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
