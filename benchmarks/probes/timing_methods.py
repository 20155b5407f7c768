"""What each way of timing a loss call counts (NOTES v49): ``do_bench`` (the L2 flushed before each
call, the host's time a call showing where it outlasts the flush), ``do_bench`` of a CUDA graph's
replay of the call (flushed, the host's time left out) and ``do_bench_cudagraph`` (replays back to
back: no flush, no host), for the logits' copy (the floor), the forward alone and forward +
``loss.backward()``, bf16 4096x50257 and 8192x32000 by default. v50: the replay also after a flush
that writes 256 MB (``zero_``, as ``do_bench``'s: the L2 left full of dirty lines, written back
while the call runs) and after one that reads them (``sum``: clean lines, dropped for free):
whether a call that only reads pays for the flush's write-back.

    PYTHONPATH=. python3 benchmarks/probes/timing_methods.py [--shape 4096x50257 ...]
"""
from __future__ import annotations

import argparse
import statistics


def flushed(fn, flush, reps: int = 200) -> float:
    """Median milliseconds of ``fn`` timed by events, each call after ``flush()``."""
    import torch

    times = []
    for _ in range(reps):
        flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", action="append")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()

    import torch
    import triton.testing

    import portable_softmax as ps

    device = torch.device("cuda")
    print(f"{torch.cuda.get_device_name(device)}, {args.dtype}, ms (medians)")
    print(f"{'shape':>12s} {'call':14s} {'do_bench':>9s} {'replay':>9s} {'cudagraph':>10s} {'dirty':>9s} "
          f"{'clean':>9s}")
    cache = torch.empty(256 * 2**20, dtype=torch.int8, device=device)
    for text in args.shape or ["4096x50257", "8192x32000"]:
        rows, cols = (int(v) for v in text.lower().split("x"))
        torch.manual_seed(0)
        x0 = (torch.randn(rows, cols, device=device) * 2).to(getattr(torch, args.dtype))
        target = torch.randint(0, cols, (rows,), device=device)
        x = x0.clone().requires_grad_()

        def step() -> None:
            x.grad = None
            ps.cross_entropy(x, target).backward()

        def forward() -> None:
            with torch.no_grad():
                ps.cross_entropy(x0, target)

        for name, fn in (("copy", lambda: x0.clone()), ("forward", forward), ("fwd+bwd", step)):
            fn()
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                fn()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            plain = triton.testing.do_bench(fn, return_mode="median")
            replay = triton.testing.do_bench(graph.replay, return_mode="median")
            back_to_back = triton.testing.do_bench_cudagraph(fn, return_mode="median")
            dirty = flushed(graph.replay, cache.zero_)
            clean = flushed(graph.replay, cache.sum)
            print(f"{text:>12s} {name:14s} {plain:9.3f} {replay:9.3f} {back_to_back:10.3f} {dirty:9.3f} {clean:9.3f}",
                  flush=True)
            del graph
        del x, x0
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
