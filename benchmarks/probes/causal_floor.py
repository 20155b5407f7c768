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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", nargs="+", type=int, default=[4, 32, 4096, 4096])
    args = parser.parse_args()
    print(torch.cuda.get_device_name())
    x = torch.randn(*args.shape, device="cuda", dtype=torch.bfloat16)
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
    print(f"copy {copy * 1e3:.1f} us ({copy_rate / 1e9:.0f} GB/s); fractions of copy on the causal count "
          f"(1.5 x {moved / 2**20:.0f} MiB; the fill on 1 x)")
    for warps in (2, 4, 8, 16):
        for read in (True, False):
            ms = min(do_bench(lambda: causal_copy[(rows,)](x, y, x.shape[-2], keys, BLOCK=triton.next_power_of_2(keys),
                                                           READ=read, num_warps=warps), return_mode="median")
                     for _ in range(2))
            name = "causal copy" if read else "write only "
            print(f"{name} warps {warps:2d}: {ms * 1e3:7.1f} us  {fraction(ms, 1.5 if read else 1.0)}")
    fill = min(do_bench(lambda: y.fill_(0), return_mode="median") for _ in range(2))
    print(f"torch fill_       : {fill * 1e3:7.1f} us  {fraction(fill, 1.0)}")
    ours = min(do_bench(lambda: ps.softmax(x, -1, causal=True), return_mode="median") for _ in range(2))
    print(f"ours causal fwd   : {ours * 1e3:7.1f} us  {fraction(ours, 1.5)}")
    plain = min(do_bench(lambda: ps.softmax(x, -1), return_mode="median") for _ in range(2))
    print(f"ours plain fwd    : {plain * 1e3:7.1f} us  {fraction(plain, 2.0)}")


if __name__ == "__main__":
    main()
