"""Probe (v12): why torch.compile's softmax backward leads ours by 0.02-0.05 of copy at N = 4096-32768.

Inductor's kernel for these rows (v7 ``inductor-kernels.log``) is one row per program of 16-32 warps
that reads y and dy twice (evict_last for the row's sum, evict_first for dx), as our twice-read tile
does. Nsight (v11) counted 160 M instructions for ours against 133 M for it at 16384x16384 bf16, and
the sm_90 SASS of ours issues about 110 instructions (an integer division for the row's group, 64-bit
offsets, masks) before its first load. This probe writes Inductor's kernel out and adds our
differences to it one at a time, so that one device call says which of them costs the time:

* ``ind``: Inductor's form: the row length a constexpr, int32 offsets, no masks, no loop.
* ``ind_i64``: offsets from a 64-bit row start (ours).
* ``ind_mask``: the row length a runtime argument, every access masked by it (ours).
* ``ind_div``: the row found through a group division, as ``_tile_rows`` does (ours).
* ``ind_all``: all three.
* ``ours``: the library (``op_calls._backward``); ``compile``: torch.compile of torch's backward.

Rows of 1024 or fewer (v13) run Inductor's short-row kernel instead, as its autotuner chose it on the
H200 (8 rows of the row per program, 2 warps, no masks, int32 offsets): ``ind_rows`` with its
``fma(-y, sum, y * dy)``, ``ind_rows_grad`` with ours' ``y * (dy - sum)``, and ``ind_rows_evict``
with the twice-read tiles' eviction hints on the loads (evict_first: nothing is read again).

Usage: python3 benchmarks/probes/inductor_backward.py [bfloat16,float32]
(``SWEEP_SHAPES`` as sweep.py reads it). Prints fractions of the copy's bandwidth (3·M·N·bytes).
"""
import os
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from portable_softmax import op_calls

SHAPES = [(32768, 4096), (16384, 8192), (16384, 16384), (16384, 32768)]
if os.environ.get("SWEEP_SHAPES"):
    SHAPES = [tuple(map(int, shape.split("x"))) for shape in os.environ["SWEEP_SHAPES"].split(",")]
# Inductor's choices at these rows (v7 inductor-kernels.log): 16 warps up to 8192, then 32.
VARIANTS = {"ind": (False, False, False), "ind_i64": (True, False, False), "ind_mask": (False, True, False),
            "ind_div": (False, False, True), "ind_all": (True, True, True)}


@triton.jit
def _backward(y_ptr, dy_ptr, dx_ptr, n_cols, groups, N: tl.constexpr, WIDE: tl.constexpr, MASKED: tl.constexpr,
              DIVIDED: tl.constexpr):
    row = tl.program_id(0)
    if DIVIDED:
        outer = row // groups
        row = row - outer * groups
    cols = tl.arange(0, N)
    if WIDE:
        offsets = row.to(tl.int64) * n_cols + cols
    else:
        offsets = row * N + cols
    # Inductor's unmasked form: an all-true constant mask, which Triton drops.
    mask = cols < n_cols if MASKED else cols < N
    y = tl.load(y_ptr + offsets, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    total = tl.sum(y * dy, 0)
    y = tl.load(y_ptr + offsets, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    tl.store(dx_ptr + offsets, tl.fma(-y, total, y * dy).to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _backward_rows(y_ptr, dy_ptr, dx_ptr, XBLOCK: tl.constexpr, N: tl.constexpr, OURS: tl.constexpr,
                   EVICT: tl.constexpr):
    rows = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    offsets = tl.arange(0, N)[None, :] + N * rows
    y = tl.load(y_ptr + offsets, eviction_policy=EVICT).to(tl.float32)
    dy = tl.load(dy_ptr + offsets, eviction_policy=EVICT).to(tl.float32)
    product = y * dy
    total = tl.sum(product, 1)[:, None]
    if OURS:
        dx = y * (dy - total)
    else:
        dx = tl.fma(-y, total, product)
    tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty))


SHORT_VARIANTS = {"ind_rows": (False, ""), "ind_rows_grad": (True, ""), "ind_rows_evict": (False, "evict_first")}


def _short_variant(flags, m: int, n: int):
    ours, evict = flags

    def run(y, dy):
        dx = torch.empty_like(y)
        _backward_rows[(m // 8,)](y, dy, dx, XBLOCK=8, N=n, OURS=ours, EVICT=evict, num_warps=2, num_stages=1)
        return dx
    return run


def _variant(flags, m: int, n: int):
    wide, masked, divided = flags
    warps = 16 if n <= 8192 else 32

    def run(y, dy):
        dx = torch.empty_like(y)
        _backward[(m,)](y, dy, dx, n, m + 1, N=n, WIDE=wide, MASKED=masked, DIVIDED=divided, num_warps=warps,
                        num_stages=1)
        return dx
    return run


def main() -> int:
    dtypes = [getattr(torch, d) for d in (sys.argv[1] if len(sys.argv) > 1 else "bfloat16").split(",")]
    compiled = torch.compile(lambda y, dy: torch._softmax_backward_data(dy, y, -1, y.dtype), dynamic=False)
    print(f"{'dtype':>9} {'M x N':>12}  name:fraction   (backward, fraction of copy)")
    for dtype in dtypes:
        for m, n in SHAPES:
            x = torch.randn(m, n, device="cuda", dtype=dtype)
            y = torch.softmax(x.float(), -1).to(dtype)
            dy = torch.randn_like(y)
            reference = torch._softmax_backward_data(dy.double(), y.double(), -1, torch.float64)
            copy = min(do_bench(lambda: x.clone(), return_mode="median") for _ in range(2))
            copy_gbs = 2 * x.numel() * x.element_size() / copy / 1e6
            runs = {"ours": lambda a, b: op_calls._backward(a, b, 1, dtype, False), "compile": compiled}
            if n <= 1024:
                runs.update({name: _short_variant(flags, m, n) for name, flags in SHORT_VARIANTS.items()})
            else:
                runs.update({name: _variant(flags, m, n) for name, flags in VARIANTS.items()})
            names = list(runs)
            cells = []
            for name in names:
                dx = runs[name](y, dy)
                error = ((dx.double() - reference).norm() / reference.norm()).item()
                ms = do_bench(lambda: runs[name](y, dy), return_mode="median")
                fraction = 3 * x.numel() * x.element_size() / ms / 1e6 / copy_gbs
                cells.append(f"{name}:{fraction:.2f}" if error < 1e-2 else f"{name}:wrong")
            print(f"{str(dtype)[6:]:>9} {f'{m}x{n}':>12} " + " ".join(cells))
            del x, y, dy, reference
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
