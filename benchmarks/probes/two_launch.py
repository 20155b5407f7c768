"""Strided reductions in two launches, no program waiting on another (issue 18, NOTES v22): what
a column softmax would read if its reduction were split into R chunks by the streamed kernels
of rows sharded across ranks (``kernels.softmax_*_partials`` / ``_normalize``), instead of the
split tiles that hold their chunk while they wait for its peers.

The reduced dimension of length L is viewed as R groups of L / R ("outer" groups, so that the
streamed kernels take (chunk, tile) items): the partials launch writes each chunk's partials;
torch combines them per row (a few small kernels, counted in the time: the probe reads low) and
lays the result out once per chunk; the normalize launch reads it with one "rank" and writes its
chunk of the output. Forward: x read twice, y written (3 passes, at most 2/3 of copy);
backward: y and dy read twice, dx written (5 passes, at most 3/5). The library's split tiles,
torch eager and torch.compile in the same run.

    python benchmarks/probes/two_launch.py [--rows N]

``--rows N``: tiles span N adjacent rows (``Tuning.strided_rows`` for every element size) instead
of the device's row (16 for bf16, 32 for fp32): the streamed kernels', and the split tiles' too.
"""
from __future__ import annotations

import argparse
import dataclasses

import torch
from triton.testing import do_bench

from portable_softmax import device, launch, row_layout, tuning

# (name, shape made, view of it that is the input, dim, dtype)
CASES = [
    ("column (32768,1024) fp32 dim0", (32768, 1024), None, 0, torch.float32),
    ("column (32768,1024) bf16 dim0", (32768, 1024), None, 0, torch.bfloat16),
    ("transposed (4096,8192).t() bf16", (4096, 8192), lambda t: t.t(), -1, torch.bfloat16),
]
CHUNK_COUNTS = (8, 16, 32, 64)


def chunked(view: launch.RowView, chunks: int) -> launch.RowView:
    """``view`` (one group of rows side by side) with its rows cut into ``chunks`` groups."""
    assert view.n_outer == 1 and view.n_cols % chunks == 0
    length = view.n_cols // chunks
    return launch.RowView(chunks, view.rows_per_outer, length,
                          tuple((length * col, row, col) for _, row, col in view.strides))


def forward(x: torch.Tensor, y: torch.Tensor, view: launch.RowView, chunks: int) -> None:
    parts = chunked(view, chunks)
    stats = torch.empty(chunks, view.rows_per_outer, 2, device=x.device, dtype=torch.float32)
    launch.run_sharded("forward_partials", (x, stats), launch.RowView(
        parts.n_outer, parts.rows_per_outer, parts.n_cols, parts.strides[:1]), False, False, 1)
    peak = stats[..., 0].amax(0)
    total = (stats[..., 1] * torch.exp(stats[..., 0] - peak)).sum(0)
    combined = torch.stack((peak, total), -1).expand(chunks, -1, -1).contiguous()
    launch.run_sharded("forward_normalize", (x, combined, y), parts, False, False, 1)


def backward(y: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, view: launch.RowView, chunks: int) -> None:
    parts = chunked(view, chunks)
    stats = torch.empty(chunks, view.rows_per_outer, device=y.device, dtype=torch.float32)
    launch.run_sharded("backward_partials", (y, dy, stats), launch.RowView(
        parts.n_outer, parts.rows_per_outer, parts.n_cols, parts.strides[:2]), False, False, 1)
    combined = stats.sum(0).expand(chunks, -1).contiguous()
    launch.run_sharded("backward_normalize", (y, dy, combined, dx), parts, False, False, 1)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), f"streamed tiles of {args.rows or 'the default'} rows", flush=True)
    if args.rows:
        own = tuning.tuning_for(device.device_record("cuda"))
        tuning.TUNING[("cuda", "*")] = dataclasses.replace(own, strided_rows={2: args.rows, 4: args.rows,
                                                                             8: args.rows})
    print("| case | copy TB/s | ours split tiles | torch | compile | " +
          " | ".join(f"two launches R={r}" for r in CHUNK_COUNTS) + " |")
    print("|---|---|---|---|---|" + "---|" * len(CHUNK_COUNTS))
    for name, shape, make_view, dim, dtype in CASES:
        x = (torch.randn(shape, device="cuda") * 3).to(dtype)
        if make_view is not None:
            x = make_view(x)
        dim = dim % x.dim()
        y = torch.empty(x.shape, dtype=dtype, device="cuda")
        dy = torch.randn(x.shape, device="cuda").to(dtype)
        dx = torch.empty_like(y)
        reference = torch.softmax(x.double(), dim)
        y_torch = torch.softmax(x, dim)
        reference_dx = torch._softmax_backward_data(dy.double(), y_torch.double(), dim, torch.float64)
        dense = torch.empty(x.shape, dtype=dtype, device="cuda").normal_()
        copy = min(do_bench(lambda: dense.clone()) for _ in range(2))
        del dense
        nbytes = x.numel() * x.element_size()
        bandwidth = 2 * nbytes / copy

        def fraction(fn, passes):
            return passes * nbytes / do_bench(fn) / bandwidth

        fview = row_layout.row_view(tuple(x.shape), dim, x, y)
        bview = row_layout.row_view(tuple(x.shape), dim, y_torch, dy, dx)
        compiled_f = torch.compile(lambda t: torch.softmax(t, dim), dynamic=False)
        compiled_b = torch.compile(lambda a, g: torch._softmax_backward_data(g, a, dim, dtype), dynamic=False)
        cells = [f"{fraction(lambda: launch.run_forward(x, y, fview, False), 2):.2f} / "
                 f"{fraction(lambda: launch.run_backward(y_torch, dy, dx, bview, False), 3):.2f}",
                 f"{fraction(lambda: torch.softmax(x, dim), 2):.2f} / "
                 f"{fraction(lambda: torch._softmax_backward_data(dy, y_torch, dim, dtype), 3):.2f}",
                 f"{fraction(lambda: compiled_f(x), 2):.2f} / {fraction(lambda: compiled_b(y_torch, dy), 3):.2f}"]
        for chunks in CHUNK_COUNTS:
            y.fill_(float("nan"))
            dx.fill_(float("nan"))
            forward(x, y, fview, chunks)
            backward(y_torch, dy, dx, bview, chunks)
            errors = (rel(y, reference), rel(dx, reference_dx))
            ok = errors[0] < (1e-5 if dtype == torch.float32 else 2e-2) and errors[1] < (
                1e-4 if dtype == torch.float32 else 3e-2)
            cells.append(f"{fraction(lambda: forward(x, y, fview, chunks), 2):.2f} / "
                         f"{fraction(lambda: backward(y_torch, dy, dx, bview, chunks), 3):.2f}"
                         + ("" if ok else f" WRONG {errors[0]:.1e} {errors[1]:.1e}"))
        print(f"| {name} | {bandwidth / 1e9:.2f} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
