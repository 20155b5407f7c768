"""A column softmax in two launches shaped as Inductor shapes an outer reduction (issue 18, NOTES
v23): what the long columns would read without programs that wait on each other.

The input is (L, C) contiguous, reduced over dim 0. The first launch gives each program a block of
XB adjacent columns (XB * element bytes contiguous in every row) and one of R slices of the L rows;
it streams its slice in steps of RB rows and writes the slice's partials per column (forward: the
maximum and the sum of exponentials against it; backward: the sum of y * dy). The second launch
gives each program the same block and slice: it combines the R partials of its columns in a fixed
order (no atomics: the result is the same on every run) and writes its slice of the output.

Passes over the tensor: forward 3 (x read twice, y written: at most 2/3 of copy), backward 5 (y
and dy read twice, dx written: at most 3/5), less what the second launch finds in L2. With
``reverse`` the second launch takes its programs in the opposite order to the first, so that its
first programs read the slices the first launch read last, and each program walks its slice from
its end: the first launch's grid is resident at once (one wave), so what is left in L2 (50 MB on
the H100 and H200, against a 64 MiB bf16 input) is the end of every slice.

    python benchmarks/probes/column_two_pass.py

Standalone kernels (a probe: only their time and their error are read); the library's split tiles,
torch eager and torch.compile in the same run.
"""
from __future__ import annotations

import itertools

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from portable_softmax import launch, row_layout

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _block(pid, n_col_blocks, n_programs, REVERSE: tl.constexpr):
    if REVERSE:
        pid = n_programs - 1 - pid
    return pid % n_col_blocks, pid // n_col_blocks


@triton.jit
def forward_partials(x_ptr, m_ptr, s_ptr, L, C, slice_rows, n_col_blocks,
                     XB: tl.constexpr, RB: tl.constexpr, ELEMENTWISE: tl.constexpr, KEEP: tl.constexpr):
    cb, r = _block(tl.program_id(0), n_col_blocks, tl.num_programs(0), False)
    cols = cb * XB + tl.arange(0, XB)
    col_ok = cols < C
    row0 = r * slice_rows
    if ELEMENTWISE:
        # Each element of the [RB, XB] block keeps its own maximum and sum: no reduction across
        # threads in the loop, one exponential an element (exp of the smaller less the larger).
        m_acc = tl.full([RB, XB], -float("inf"), tl.float32)
        s_acc = tl.zeros([RB, XB], tl.float32)
        for k in tl.range(0, slice_rows, RB):
            rows = row0 + k + tl.arange(0, RB)
            ok = (rows < L)[:, None] & col_ok[None, :]
            x = tl.load(x_ptr + rows[:, None].to(tl.int64) * C + cols[None, :], mask=ok, other=-float("inf"))
            x = x.to(tl.float32)
            new_m = tl.maximum(m_acc, x)
            gap = tl.where(new_m == -float("inf"), float("inf"), tl.abs(x - m_acc))
            e = tl.exp2(-gap * LOG2E)
            s_acc = tl.where(x > m_acc, s_acc * e + 1.0, s_acc + e)
            m_acc = new_m
        m = tl.max(m_acc, 0)
        ref = tl.where(m == -float("inf"), 0.0, m)
        s = tl.sum(tl.where(m_acc == -float("inf"), 0.0, s_acc * tl.exp2((m_acc - ref[None, :]) * LOG2E)), 0)
    else:
        m = tl.full([XB], -float("inf"), tl.float32)
        s = tl.zeros([XB], tl.float32)
        for k in tl.range(0, slice_rows, RB):
            rows = row0 + k + tl.arange(0, RB)
            ok = (rows < L)[:, None] & col_ok[None, :]
            x = tl.load(x_ptr + rows[:, None].to(tl.int64) * C + cols[None, :], mask=ok, other=-float("inf"),
                        eviction_policy=KEEP)
            x = x.to(tl.float32)
            new_m = tl.maximum(m, tl.max(x, 0))
            ref = tl.where(new_m == -float("inf"), 0.0, new_m)
            s = s * tl.exp2((m - ref) * LOG2E) + tl.sum(tl.exp2((x - ref[None, :]) * LOG2E), 0)
            m = new_m
    tl.store(m_ptr + r * C + cols, m, mask=col_ok)
    tl.store(s_ptr + r * C + cols, s, mask=col_ok)


@triton.jit
def forward_normalize(x_ptr, y_ptr, m_ptr, s_ptr, L, C, slice_rows, n_col_blocks, R,
                      XB: tl.constexpr, RB: tl.constexpr, R_P2: tl.constexpr, REVERSE: tl.constexpr,
                      DROP: tl.constexpr):
    cb, r = _block(tl.program_id(0), n_col_blocks, tl.num_programs(0), REVERSE)
    cols = cb * XB + tl.arange(0, XB)
    col_ok = cols < C
    parts = tl.arange(0, R_P2)
    present = (parts < R)[:, None] & col_ok[None, :]
    pm = tl.load(m_ptr + parts[:, None] * C + cols[None, :], mask=present, other=-float("inf"))
    ps = tl.load(s_ptr + parts[:, None] * C + cols[None, :], mask=present, other=0.0)
    big = tl.max(pm, 0)
    total = tl.sum(ps * tl.exp2((pm - big[None, :]) * LOG2E), 0)
    ref = tl.where(big == -float("inf"), 0.0, big)
    scale = 1.0 / total
    row0 = r * slice_rows
    for k in tl.range(0, slice_rows, RB):
        if REVERSE:
            k = slice_rows - RB - k
        rows = row0 + k + tl.arange(0, RB)
        ok = (rows < L)[:, None] & col_ok[None, :]
        offs = rows[:, None].to(tl.int64) * C + cols[None, :]
        x = tl.load(x_ptr + offs, mask=ok, other=-float("inf"), eviction_policy=DROP).to(tl.float32)
        y = tl.exp2((x - ref[None, :]) * LOG2E) * scale[None, :]
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=ok, eviction_policy=DROP)


@triton.jit
def backward_partials(y_ptr, dy_ptr, s_ptr, L, C, slice_rows, n_col_blocks, XB: tl.constexpr, RB: tl.constexpr,
                      KEEP: tl.constexpr):
    cb, r = _block(tl.program_id(0), n_col_blocks, tl.num_programs(0), False)
    cols = cb * XB + tl.arange(0, XB)
    col_ok = cols < C
    row0 = r * slice_rows
    acc = tl.zeros([RB, XB], tl.float32)
    for k in tl.range(0, slice_rows, RB):
        rows = row0 + k + tl.arange(0, RB)
        ok = (rows < L)[:, None] & col_ok[None, :]
        offs = rows[:, None].to(tl.int64) * C + cols[None, :]
        y = tl.load(y_ptr + offs, mask=ok, other=0.0, eviction_policy=KEEP).to(tl.float32)
        dy = tl.load(dy_ptr + offs, mask=ok, other=0.0, eviction_policy=KEEP).to(tl.float32)
        acc += y * dy
    tl.store(s_ptr + r * C + cols, tl.sum(acc, 0), mask=col_ok)


@triton.jit
def backward_normalize(y_ptr, dy_ptr, dx_ptr, s_ptr, L, C, slice_rows, n_col_blocks, R,
                       XB: tl.constexpr, RB: tl.constexpr, R_P2: tl.constexpr, REVERSE: tl.constexpr,
                       DROP: tl.constexpr):
    cb, r = _block(tl.program_id(0), n_col_blocks, tl.num_programs(0), REVERSE)
    cols = cb * XB + tl.arange(0, XB)
    col_ok = cols < C
    parts = tl.arange(0, R_P2)
    present = (parts < R)[:, None] & col_ok[None, :]
    total = tl.sum(tl.load(s_ptr + parts[:, None] * C + cols[None, :], mask=present, other=0.0), 0)
    row0 = r * slice_rows
    for k in tl.range(0, slice_rows, RB):
        if REVERSE:
            k = slice_rows - RB - k
        rows = row0 + k + tl.arange(0, RB)
        ok = (rows < L)[:, None] & col_ok[None, :]
        offs = rows[:, None].to(tl.int64) * C + cols[None, :]
        y = tl.load(y_ptr + offs, mask=ok, other=0.0, eviction_policy=DROP).to(tl.float32)
        dy = tl.load(dy_ptr + offs, mask=ok, other=0.0, eviction_policy=DROP).to(tl.float32)
        tl.store(dx_ptr + offs, (y * (dy - total[None, :])).to(dx_ptr.dtype.element_ty), mask=ok,
                 eviction_policy=DROP)


def two_pass_forward(x, y, m, s, R, XB, RB, warps, reverse, elementwise=True, hints=False):
    L, C = x.shape
    n_col_blocks = triton.cdiv(C, XB)
    slice_rows = triton.cdiv(triton.cdiv(L, R), RB) * RB
    grid = (n_col_blocks * R,)
    forward_partials[grid](x, m, s, L, C, slice_rows, n_col_blocks, XB=XB, RB=RB, ELEMENTWISE=elementwise,
                           KEEP="evict_last" if hints else "", num_warps=warps)
    forward_normalize[grid](x, y, m, s, L, C, slice_rows, n_col_blocks, R, XB=XB, RB=RB,
                            R_P2=triton.next_power_of_2(R), REVERSE=reverse, DROP="evict_first" if hints else "",
                            num_warps=warps)


def two_pass_backward(y, dy, dx, s, R, XB, RB, warps, reverse, hints=False):
    L, C = y.shape
    n_col_blocks = triton.cdiv(C, XB)
    slice_rows = triton.cdiv(triton.cdiv(L, R), RB) * RB
    grid = (n_col_blocks * R,)
    backward_partials[grid](y, dy, s, L, C, slice_rows, n_col_blocks, XB=XB, RB=RB,
                            KEEP="evict_last" if hints else "", num_warps=warps)
    backward_normalize[grid](y, dy, dx, s, L, C, slice_rows, n_col_blocks, R, XB=XB, RB=RB,
                             R_P2=triton.next_power_of_2(R), REVERSE=reverse, DROP="evict_first" if hints else "",
                             num_warps=warps)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


SHAPES = [((32768, 1024), torch.bfloat16), ((32768, 1024), torch.float32)]
SLICES = (32,)
WIDTHS = {2: (64,), 4: (32, 64)}
STEPS = (64, 128)
WARPS = (4,)


def main() -> None:
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    for shape, dtype in SHAPES:
        x = (torch.randn(shape, device="cuda") * 3).to(dtype)
        L, C = shape
        dense = torch.empty(shape, dtype=dtype, device="cuda").normal_()
        copy = min(do_bench(lambda: dense.clone()) for _ in range(2))
        del dense
        nbytes = x.numel() * x.element_size()
        bandwidth = 2 * nbytes / copy

        def fraction(fn, passes):
            return passes * nbytes / do_bench(fn) / bandwidth

        reference = torch.softmax(x.double(), 0)
        y_torch = torch.softmax(x, 0)
        dy = torch.randn(shape, device="cuda").to(dtype)
        reference_dx = torch._softmax_backward_data(dy.double(), y_torch.double(), 0, torch.float64)
        y = torch.empty_like(x)
        dx = torch.empty_like(x)
        fview = row_layout.row_view(tuple(x.shape), 0, x, y)
        bview = row_layout.row_view(tuple(x.shape), 0, y_torch, dy, dx)
        compiled_f = torch.compile(lambda t: torch.softmax(t, 0), dynamic=False)
        compiled_b = torch.compile(lambda a, g: torch._softmax_backward_data(g, a, 0, dtype), dynamic=False)
        name = f"column {shape} {str(dtype)[6:]}"
        print(f"\n## {name}: copy {bandwidth / 1e9:.2f} TB/s")
        print(f"ours split tiles {fraction(lambda: launch.run_forward(x, y, fview, False), 2):.2f} / "
              f"{fraction(lambda: launch.run_backward(y_torch, dy, dx, bview, False), 3):.2f}; "
              f"torch.compile {fraction(lambda: compiled_f(x), 2):.2f} / "
              f"{fraction(lambda: compiled_b(y_torch, dy), 3):.2f}", flush=True)
        results = []
        for R, XB, RB, warps, elementwise, reverse, hints in itertools.product(
                SLICES, WIDTHS[x.element_size()], STEPS, WARPS, (False,), (False, True), (False, True)):
            if XB * RB > 16384 or XB * RB < 1024:
                continue
            m = torch.empty(R, C, device="cuda")
            s = torch.empty(R, C, device="cuda")
            y.fill_(float("nan"))
            dx.fill_(float("nan"))
            two_pass_forward(x, y, m, s, R, XB, RB, warps, reverse, elementwise, hints)
            two_pass_backward(y_torch, dy, dx, s, R, XB, RB, warps, reverse, hints)
            errors = (rel(y, reference), rel(dx, reference_dx))
            ok = errors[0] < (1e-5 if dtype == torch.float32 else 2e-2) and errors[1] < (
                1e-4 if dtype == torch.float32 else 3e-2)
            f = fraction(lambda: two_pass_forward(x, y, m, s, R, XB, RB, warps, reverse, elementwise, hints), 2)
            b = fraction(lambda: two_pass_backward(y_torch, dy, dx, s, R, XB, RB, warps, reverse, hints), 3)
            results.append((f, b, R, XB, RB, warps, f'{int(reverse)}{int(hints)}', ok, errors))
        print("| R | XB | RB | warps | reverse, hints | fwd | bwd | check |")
        print("|---|---|---|---|---|---|---|---|")
        best = sorted(results, key=lambda e: -e[0])[:6] + sorted(results, key=lambda e: -e[1])[:6]
        for f, b, R, XB, RB, warps, elementwise, ok, errors in best:
            print(f"| {R} | {XB} | {RB} | {warps} | {elementwise} | {f:.2f} | {b:.2f} | "
                  f"{'ok' if ok else f'WRONG {errors[0]:.1e} {errors[1]:.1e}'} |")
        print(f"wrong settings: {sum(not e[7] for e in results)} of {len(results)}", flush=True)


if __name__ == "__main__":
    main()
