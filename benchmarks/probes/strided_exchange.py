"""What the exchange costs the split tiles of strided reductions (issue 18, NOTES v21): the
strided cases timed with the library's kernels and with probe variants of them, built here by
editing ``kernels.exchange._gather_tile``'s source (``kernel_variant.py``; the variants' results
are wrong; only their time is read): ``noread``, the wait but no slot read; ``nowait``, no
arrival count and no wait (the slots are read once, as found); ``noslots``, neither (each tile
normalised by constants). If ``noslots`` reads near a copy, the exchange is what the tiles lose;
if not, their loads and stores are.

    python benchmarks/probes/strided_exchange.py
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from triton.testing import do_bench

from kernel_variant import edited_kernels
from portable_softmax import launch, row_layout

WAIT = '''    tl.debug_barrier()
    tl.atomic_add(counters, 1, sem="release")
    _awaited_count(counters, CHUNKS)
    tl.debug_barrier()
'''
SLOT_READ = '''    v = tl.load(slots[:, None] + peers[None, :], mask=present, other=EMPTY_SLOT, cache_modifier=".cg")'''
VARIANTS = {
    "noread": [(SLOT_READ, "    v = tl.where(present, 0, EMPTY_SLOT).to(tl.int64)")],
    "nowait": [(WAIT, "")],
    "noslots": [(WAIT, ""), (SLOT_READ, "    v = tl.where(present, 0, EMPTY_SLOT).to(tl.int64)")],
}
CASES = [
    ("column (32768,1024) fp32 dim0", (32768, 1024), None, 0, torch.float32),
    ("column (32768,1024) bf16 dim0", (32768, 1024), None, 0, torch.bfloat16),
    ("transposed (4096,8192).t() bf16", (4096, 8192), lambda t: t.t(), -1, torch.bfloat16),
    ("NCHW (8,1000,64,64) fp32 dim1", (8, 1000, 64, 64), None, 1, torch.float32),
]


def variant_module(name: str, folder: Path):
    return edited_kernels(name, {"exchange": VARIANTS[name]}, folder)


def main() -> None:
    print(torch.cuda.get_device_name(), flush=True)
    library = launch._kernel_module
    with tempfile.TemporaryDirectory() as folder:
        modules = {"library": None, **{name: variant_module(name, Path(folder)) for name in VARIANTS}}
        print("| case | kernels | forward | backward |")
        print("|---|---|---|---|")
        for label, shape, view, dim, dtype in CASES:
            x = torch.randn(shape, device="cuda").to(dtype)
            if view is not None:
                x = view(x)
            dense = torch.empty(x.shape, dtype=dtype, device="cuda").normal_()
            copy = min(do_bench(lambda: dense.clone()) for _ in range(2))
            y = torch.empty(x.shape, dtype=dtype, device="cuda")
            dy, dx = torch.randn_like(y), torch.empty_like(y)
            forward_view = row_layout.row_view(tuple(x.shape), dim % x.dim(), x, y)
            backward_view = row_layout.row_view(tuple(x.shape), dim % x.dim(), y, dy, dx)
            for name, module in modules.items():
                launch._kernel_module = library if module is None else (lambda backend, m=module: m)
                launch._records.clear()
                forward = copy / do_bench(lambda: launch.run_forward(x, y, forward_view, False))
                y.copy_(torch.softmax(x.float(), dim).to(dtype))
                backward = 1.5 * copy / do_bench(lambda: launch.run_backward(y, dy, dx, backward_view, False))
                print(f"| {label} | {name} | {forward:.2f} | {backward:.2f} |", flush=True)
            launch._kernel_module = library
            launch._records.clear()


if __name__ == "__main__":
    main()
