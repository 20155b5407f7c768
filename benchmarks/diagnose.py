"""Where the time of a softmax call goes, on one GPU: host overhead per call, and the GPU time of
back-to-back calls, against x.clone() measured the same way.

`do_bench` times each call between two events after a 256 MB cache clear; host work up to the
clear's duration (~60 us on an H200) is hidden, beyond that it is counted. This script separates
the two: the host time per call is measured while the GPU is kept busy (so the queue never drains),
and the GPU time is measured on calls queued behind a sleep kernel, cycling through enough inputs
that no call finds its data in L2. Usage: python3 benchmarks/diagnose.py [bfloat16,float32]
"""
import sys
import time

import torch
from triton.testing import do_bench

import portable_softmax as ps
from portable_softmax import op_calls
from portable_softmax.bench import SHAPES

L2_FLUSH_BYTES = 256 << 20
CYCLES_PER_US = 2000


def host_us(fn, calls=200):
    """Host time per call, with the GPU busy so launches never wait on it."""
    torch.cuda.synchronize()
    torch.cuda._sleep(int(calls * 400 * CYCLES_PER_US))
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def gpu_us(fns, calls, host):
    """GPU time per call of calls queued back to back behind a sleep (cycling through ``fns``)."""
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(calls * host * 3 * CYCLES_PER_US) + 1000)
    begin.record()
    for i in range(calls):
        fns[i % len(fns)]()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / calls * 1e3


def implementations():
    torch._dynamo.config.cache_size_limit = 256
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = 256
    compiled = torch.compile(lambda x: torch.softmax(x, -1), dynamic=False)
    compiled_bwd = torch.compile(lambda y, dy: torch._softmax_backward_data(dy, y, -1, y.dtype), dynamic=False)
    return {
        "clone": (lambda x: x.clone(), None),
        "ours": (lambda x: ps.softmax(x, -1), lambda y, dy: op_calls._backward(y, dy, y.dim() - 1, y.dtype, False)),
        "torch": (lambda x: torch.softmax(x, -1), lambda y, dy: torch._softmax_backward_data(dy, y, -1, y.dtype)),
        "compile": (compiled, compiled_bwd),
    }


def main():
    dtypes = [getattr(torch, d) for d in (sys.argv[1] if len(sys.argv) > 1 else "bfloat16,float32").split(",")]
    shapes = SHAPES if len(sys.argv) < 3 else [tuple(map(int, s.split("x"))) for s in sys.argv[2].split(",")]
    impls = implementations()
    print(f"{'dtype':>8} {'shape':>12} {'impl':>8} {'host_us':>8} {'gpu_us':>8} {'bench_us':>8} "
          f"{'gpu_frac':>8} {'bench_frac':>10} {'bwd_host':>8} {'bwd_gpu':>8} {'bwd_frac':>8}")
    for dtype in dtypes:
        for m, n in shapes:
            nbytes = m * n * torch.tensor([], dtype=dtype).element_size()
            copies = max(2, min(64, -(-L2_FLUSH_BYTES // nbytes)))
            xs = [torch.randn(m, n, device="cuda", dtype=dtype) * 3 for _ in range(copies)]
            ys = [torch.softmax(x, -1) for x in xs]
            dys = [torch.randn_like(x) for x in xs]
            calls = max(20, min(400, int(2e9 // nbytes)))
            base = None
            for name, (fwd, bwd) in impls.items():
                fwd(xs[0])
                host = host_us(lambda: fwd(xs[0]))
                gpu = gpu_us([lambda x=x: fwd(x) for x in xs], calls, host)
                bench = do_bench(lambda: fwd(xs[0]), return_mode="median") * 1e3
                if base is None:
                    base = (gpu, bench)
                line = (f"{str(dtype)[6:]:>8} {f'{m}x{n}':>12} {name:>8} {host:8.1f} {gpu:8.1f} {bench:8.1f} "
                        f"{base[0] / gpu:8.2f} {base[1] / bench:10.2f}")
                if bwd is not None:
                    bwd(ys[0], dys[0])
                    bhost = host_us(lambda: bwd(ys[0], dys[0]))
                    bgpu = gpu_us([lambda y=y, dy=dy: bwd(y, dy) for y, dy in zip(ys, dys)], calls, bhost)
                    line += f" {bhost:8.1f} {bgpu:8.1f} {1.5 * base[0] / bgpu:8.2f}"
                print(line, flush=True)
            del xs, ys, dys
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
