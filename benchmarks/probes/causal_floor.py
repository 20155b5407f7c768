"""The memory floor of a causal softmax (issue 20): what the bytes a causal forward must move
reach on this GPU when nothing is computed. A "causal copy" reads the kept part of each row
(key <= query) and writes the whole row (the kept values, zeros past them), the traffic of
``softmax(x, causal=True)``: half of x read, all of y written. Timed beside a clone (read and
write alike), a fill (write only) and our causal forward, at several warp counts, on the count the
bench uses (1.5 x the tensor's bytes for a causal forward).

    python benchmarks/probes/causal_floor.py [--shape 4 32 4096 4096]
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

import portable_softmax as ps


@triton.jit
def causal_copy(x_ptr, y_ptr, n_queries, n_keys, BLOCK: tl.constexpr, READ: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    query = row % n_queries
    cols = tl.arange(0, BLOCK)
    inside = cols < n_keys
    if READ:
        x = tl.load(x_ptr + row * n_keys + cols, mask=inside & (cols <= query), other=0.0)
    else:
        x = tl.zeros([BLOCK], y_ptr.dtype.element_ty)
    tl.store(y_ptr + row * n_keys + cols, x, mask=inside)


LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _causal_row(x_ptr, y_ptr, row, query, n_keys, scale, WIDTH: tl.constexpr):
    """A causal row softmax over its first WIDTH columns (all it keeps), zeros past them."""
    cols = tl.arange(0, WIDTH)
    kept = (cols <= query) & (cols < n_keys)
    x = tl.load(x_ptr + row * n_keys + cols, mask=kept, other=-float("inf")).to(tl.float32)
    x = tl.where(kept, x * scale, -float("inf"))
    e = tl.exp2((x - tl.max(x, 0)) * LOG2E)
    tl.store(y_ptr + row * n_keys + cols, e * (1.0 / tl.sum(e, 0)), mask=cols < n_keys)
    for start in tl.range(WIDTH, n_keys, WIDTH):
        tl.store(y_ptr + row * n_keys + start + cols, tl.zeros([WIDTH], tl.float32), mask=start + cols < n_keys)


@triton.jit
def causal_softmax(x_ptr, y_ptr, n_queries, n_keys, scale, BLOCK: tl.constexpr, LADDER: tl.constexpr):
    """A minimal causal softmax, a program per row: the whole row's tile (LADDER false), or the
    smallest of BLOCK / 4, BLOCK / 2, BLOCK that holds what the row keeps (the compute of the rest
    skipped, not only its loads)."""
    row = tl.program_id(0).to(tl.int64)
    query = row % n_queries
    if LADDER:
        if query < BLOCK // 4:
            _causal_row(x_ptr, y_ptr, row, query, n_keys, scale, BLOCK // 4)
        elif query < BLOCK // 2:
            _causal_row(x_ptr, y_ptr, row, query, n_keys, scale, BLOCK // 2)
        else:
            _causal_row(x_ptr, y_ptr, row, query, n_keys, scale, BLOCK)
    else:
        _causal_row(x_ptr, y_ptr, row, query, n_keys, scale, BLOCK)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", nargs="+", type=int, default=[4, 32, 4096, 4096])
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    x = torch.randn(*args.shape, device=args.device, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    rows, keys = x.numel() // x.shape[-1], x.shape[-1]
    moved = x.numel() * x.element_size()
    copy = min(do_bench(lambda: x.clone(), return_mode="median") for _ in range(2))
    copy_rate = 2 * moved / copy

    def fraction(ms: float, count: float) -> str:
        return f"{count * moved / ms / copy_rate:.2f}"

    # Correct first: the causal copy is tril of each (queries, keys) matrix.
    causal_copy[(rows,)](x, y, x.shape[-2], keys, BLOCK=triton.next_power_of_2(keys), READ=True, num_warps=4)
    assert torch.equal(y, torch.tril(x)), "causal copy differs from tril"
    print(f"copy {copy * 1e3:.1f} us ({copy_rate / 1e6:.0f} GB/s); fractions of copy on the causal count "
          f"(1.5 x {moved / 2**20:.0f} MiB; the fill on 1 x)")
    for warps in (2, 4, 8, 16):
        for read in (True, False):
            ms = min(do_bench(lambda: causal_copy[(rows,)](x, y, x.shape[-2], keys, BLOCK=triton.next_power_of_2(keys),
                                                           READ=read, num_warps=warps), return_mode="median")
                     for _ in range(2))
            name = "causal copy" if read else "write only "
            print(f"{name} warps {warps:2d}: {ms * 1e3:7.1f} us  {fraction(ms, 1.5 if read else 1.0)}")
    reference = torch.softmax(torch.where(torch.ones(keys, keys, dtype=torch.bool, device=x.device).tril(),
                                          x.double() * 0.125, -float("inf")), -1)
    for ladder in (False, True):
        for warps in (4, 8):
            def call():
                causal_softmax[(rows,)](x, y, x.shape[-2], keys, 0.125, BLOCK=triton.next_power_of_2(keys),
                                        LADDER=ladder, num_warps=warps)
            y.fill_(float("nan"))
            call()
            error = ((y.double() - reference).norm() / reference.norm()).item()
            ms = min(do_bench(call, return_mode="median") for _ in range(2))
            print(f"minimal causal softmax{' ladder' if ladder else '       '} warps {warps:2d}: {ms * 1e3:7.1f} us  "
                  f"{fraction(ms, 1.5)}  (error {error:.1e})")
    del reference
    fill = min(do_bench(lambda: y.fill_(0), return_mode="median") for _ in range(2))
    print(f"torch fill_       : {fill * 1e3:7.1f} us  {fraction(fill, 1.0)}")
    ours = min(do_bench(lambda: ps.softmax(x, -1, causal=True), return_mode="median") for _ in range(2))
    print(f"ours causal fwd   : {ours * 1e3:7.1f} us  {fraction(ours, 1.5)}")
    # With the minimal kernels' scale (a multiply and a select per element more than causal alone).
    scaled = min(do_bench(lambda: ps.softmax(x, -1, causal=True, scale=0.125), return_mode="median") for _ in range(2))
    print(f"ours causal+scale : {scaled * 1e3:7.1f} us  {fraction(scaled, 1.5)}")
    plain = min(do_bench(lambda: ps.softmax(x, -1), return_mode="median") for _ in range(2))
    print(f"ours plain fwd    : {plain * 1e3:7.1f} us  {fraction(plain, 2.0)}")


if __name__ == "__main__":
    main()
