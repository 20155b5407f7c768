"""Probe (v8): is the split forward's persistent loop what holds it below the copy?

The library's split forward runs a persistent grid: each program takes item after item (a chunk of
a row), and a row's chunks wait on each other. The tile kernels gained 0.06 when their loop gave
way to a program per tile (NOTES v7). This probe times a split forward with a program per item on
the same shapes:

* ``ticket``: each program takes its item from an atomic counter as it starts, so every item
  numbered below it belongs to a program that has started; a row's programs then wait only on
  started programs or on programs that will start once a complete row ends (deadlock-free while a
  row's chunks fit the chip at once);
* ``order``: the item is the program id (relies on in-order dispatch; a measurement only).

The exchange slots and the counter are reset before each launch (included in the time).
Usage: python3 benchmarks/probes/nonpersistent_split.py
"""
import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from portable_softmax import launch, row_layout
from portable_softmax.kernels.common import LOG2E
from portable_softmax.kernels.exchange import EMPTY_SLOT, _bits_float, _float_bits


@triton.jit
def _row_exchange(slot_ptr, row, chunk, chunk_max, total, CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr):
    """Publish this chunk's (max, sum), wait for the row's others, and return the row's maximum and
    its sum of exp(x - maximum)."""
    slots = slot_ptr + row.to(tl.int64) * CHUNKS
    tl.atomic_xchg(slots + chunk, (_float_bits(chunk_max) << 32) | _float_bits(total), sem="relaxed")
    peers = tl.arange(0, CHUNKS_P2)
    live = peers < CHUNKS
    v = tl.load(slots + peers, mask=live, other=0, volatile=True)
    while tl.sum((v == EMPTY_SLOT).to(tl.int32)) > 0:
        v = tl.load(slots + peers, mask=live, other=0, volatile=True)
    peer_max = tl.where(live, _bits_float(v >> 32), -float("inf"))
    peer_sum = tl.where(live, _bits_float(v), 0.0)
    row_max = tl.max(peer_max, 0)
    return row_max, tl.sum(peer_sum * tl.exp2((peer_max - row_max) * LOG2E), 0)


@triton.jit
def split_forward_once(x_ptr, y_ptr, slot_ptr, ticket_ptr, n_cols, row_stride, BLOCK_N: tl.constexpr,
                       CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr, TICKET: tl.constexpr):
    if TICKET:
        item = tl.atomic_add(ticket_ptr, 1, sem="relaxed")
    else:
        item = tl.program_id(0)
    row = item // CHUNKS
    chunk = item - row * CHUNKS
    cols = chunk * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    base = row.to(tl.int64) * row_stride
    x = tl.load(x_ptr + base + cols, mask=mask, other=-float("inf")).to(tl.float32)
    chunk_max = tl.max(x, 0)
    ref = tl.where(chunk_max == -float("inf"), 0.0, chunk_max)
    e = tl.exp2((x - ref) * LOG2E)
    total = tl.sum(e, 0)
    row_max, row_total = _row_exchange(slot_ptr, row, chunk, chunk_max, total, CHUNKS, CHUNKS_P2)
    scale = tl.exp2((chunk_max - row_max) * LOG2E) / row_total
    tl.store(y_ptr + base + cols, (e * scale).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _halves(words):
    """The two bf16 of each int32 word, widened to fp32."""
    return (words << 16).to(tl.float32, bitcast=True), (words & -65536).to(tl.float32, bitcast=True)


@triton.jit
def split_forward_once_paired(x_ptr, y_ptr, slot_ptr, ticket_ptr, n_cols, row_stride, BLOCK_N: tl.constexpr,
                              CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr):
    """As split_forward_once for bf16 rows of even length, held as int32 words of two elements and
    widened again after the exchange (v8's PAIRED form); ``n_cols >> 31`` is a zero the compiler
    cannot prove, which keeps it from holding the widened values instead."""
    item = tl.atomic_add(ticket_ptr, 1, sem="relaxed")
    row = item // CHUNKS
    chunk = item - row * CHUNKS
    cols = chunk * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    mask = cols < n_cols // 2
    base = row.to(tl.int64) * row_stride
    words = tl.load((x_ptr + base).to(tl.pointer_type(tl.int32)) + cols, mask=mask, other=-8323200)
    lo, hi = _halves(words)
    chunk_max = tl.maximum(tl.max(lo, 0), tl.max(hi, 0))
    ref = tl.where(chunk_max == -float("inf"), 0.0, chunk_max)
    lo, hi = _halves(words ^ (n_cols >> 31))
    total = tl.sum(tl.exp2((lo - ref) * LOG2E), 0) + tl.sum(tl.exp2((hi - ref) * LOG2E), 0)
    row_max, row_total = _row_exchange(slot_ptr, row, chunk, chunk_max, total, CHUNKS, CHUNKS_P2)
    inverse = 1.0 / row_total
    lo, hi = _halves(words | (n_cols >> 31))
    y_lo = (tl.exp2((lo - row_max) * LOG2E) * inverse).to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32)
    y_hi = (tl.exp2((hi - row_max) * LOG2E) * inverse).to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32)
    tl.store((y_ptr + base).to(tl.pointer_type(tl.int32)) + cols, (y_lo & 0xFFFF) | (y_hi << 16), mask=mask)


def main() -> None:
    shapes = [(16384, 32768), (16384, 65536), (8192, 131072), (4096, 262144), (4096, 151936)]
    # (elements per block, warps, register cap) per dtype: 64 elements per thread, as the library.
    configs = {torch.bfloat16: [(8192, 4, 80, False), (8192, 4, None, True), (8192, 4, 64, True), (8192, 4, 56, True),
                                (16384, 8, None, True), (16384, 8, 64, True), (4096, 2, 64, True)],
               torch.float32: [(8192, 4, None, False), (4096, 2, None, False)]}
    print(f"{'dtype':>9} {'shape':>12} {'variant':>22} {'fwd':>5} {'err':>8}")
    for dtype in (torch.bfloat16, torch.float32):
        for m, n in shapes:
            x = torch.randn(m, n, device="cuda", dtype=dtype) * 3
            y = torch.empty_like(x)
            reference = torch.softmax(x.double(), -1)
            copy = do_bench(lambda: x.clone(), warmup=10, rep=50, return_mode="median")
            view = row_layout.row_view((m, n), 1, x, y)
            plan = launch.run_forward(x, y, view, False)
            rows = [(f"library c{plan.chunks} occ{plan.occupancy}",
                     do_bench(lambda: launch.run_forward(x, y, view, False), warmup=10, rep=50, return_mode="median"),
                     ((y.double() - reference).norm() / reference.norm()).item())]
            ticket = torch.zeros(1, dtype=torch.int32, device="cuda")
            for block_n, warps, cap, paired in configs[dtype]:
                chunks = triton.cdiv(n, block_n)
                slots = torch.full((m * chunks,), -1, dtype=torch.int64, device="cuda")
                options = {"num_warps": warps} if cap is None else {"num_warps": warps, "maxnreg": cap}

                def once():
                    slots.fill_(-1)
                    ticket.zero_()
                    kernel, extra = (split_forward_once_paired, {}) if paired else (split_forward_once, {"TICKET": True})
                    kernel[(m * chunks,)](x, y, slots, ticket, n, n, BLOCK_N=block_n, CHUNKS=chunks,
                                          CHUNKS_P2=triton.next_power_of_2(chunks), **extra, **options)
                y.fill_(float("nan"))
                once()
                torch.cuda.synchronize()
                err = ((y.double() - reference).norm() / reference.norm()).item()
                rows.append((f"ticket{' paired' if paired else ''} {block_n} w{warps} cap{cap or '-'}", do_bench(once, warmup=10, rep=50,
                                                                                   return_mode="median"), err))
            copy = min(copy, do_bench(lambda: x.clone(), warmup=10, rep=50, return_mode="median"))
            for name, ms, err in rows:
                print(f"{str(dtype)[6:]:>9} {f'{m}x{n}':>12} {name:>22} {copy / ms:5.2f} {err:8.1e}", flush=True)
            del x, y, reference, slots
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
