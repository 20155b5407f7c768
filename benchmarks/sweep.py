"""Tuning sweep on one GPU: each variant of the backend's tuning table, forward and backward
fraction of x.clone() bandwidth on the shapes that matter, in one run (METHOD.md: one call, many
variants). Usage: python3 benchmarks/sweep.py [bfloat16,float32]"""
import dataclasses
import sys

import torch
from triton.testing import do_bench

import portable_softmax as ps
from portable_softmax import device, ops, tuning

SHAPES = [(32768, 256), (32768, 1024), (16384, 32768), (16384, 65536), (4096, 262144), (4096, 50257),
          (32, 128256), (1, 128256)]
VARIANTS = {
    "v1": {},
    "split4w": dict(split_elements_per_thread=64),
    "split4w_c4k": dict(split_elements_per_thread=64, split_chunk=4096),
    "tile8k": dict(tile_elements=8192, elements_per_thread=32),
    "tile8k_w4": dict(tile_elements=8192, elements_per_thread=32, tile_waves=4),
    "tile4k_w4": dict(tile_waves=4),
}


def main():
    dtypes = [getattr(torch, d) for d in (sys.argv[1] if len(sys.argv) > 1 else "bfloat16,float32").split(",")]
    backend = device.device_record("cuda").backend
    base = tuning.TUNING[(backend, "*")]
    print(f"{'variant':>12} {'dtype':>8} {'shape':>12} {'regime':>6} {'fwd':>5} {'bwd':>5}")
    for dtype in dtypes:
        for m, n in SHAPES:
            x = torch.randn(m, n, device="cuda", dtype=dtype) * 3
            copy = do_bench(lambda: x.clone(), return_mode="median")
            y, dy = torch.softmax(x, -1), torch.randn_like(x)
            for name, change in VARIANTS.items():
                tuning.TUNING[(backend, "*")] = dataclasses.replace(base, **change)
                try:
                    from portable_softmax.launch import RowView, run_forward
                    view = ops.row_view((m, n), 1, x, y)
                    out = torch.empty_like(x)
                    plan = run_forward(x, out, view, False)
                    err = (out.double() - torch.softmax(x.double(), -1)).norm() / torch.softmax(x.double(), -1).norm()
                    f = do_bench(lambda: ps.softmax(x, -1), return_mode="median")
                    b = do_bench(lambda: ops._backward(y, dy, 1, dtype, False), return_mode="median")
                    print(f"{name:>12} {str(dtype)[6:]:>8} {f'{m}x{n}':>12} {plan.regime:>6} {copy / f:5.2f} "
                          f"{1.5 * copy / b:5.2f} err {err:.1e} P{plan.programs} w{plan.num_warps} "
                          f"bn{plan.block_n} c{plan.chunks} occ{plan.occupancy}", flush=True)
                except Exception as e:
                    print(f"{name:>12} {str(dtype)[6:]:>8} {f'{m}x{n}':>12} error {type(e).__name__}: {str(e)[:100]}")
            del x, y, dy
            torch.cuda.empty_cache()
    tuning.TUNING[(backend, "*")] = base


if __name__ == "__main__":
    main()
