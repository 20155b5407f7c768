"""Probe (v11): what holds the bf16 split forward of long rows below 0.90 of copy?

Variants of the kernel package built by replacing lines of its modules (``kernel_variant.py``;
measurement only; most give wrong outputs), each run through the library's own planner and
launcher:

* ``base``: the library's kernels.
* ``noexp``: the split forward's exponentials replaced by a multiply: how much the special-function
  unit (MUFU) costs.
* ``nowait``: a chunk reads its row's slots once and goes on: what waiting on peers costs.
* ``nowait_noexp``: both.
* ``noexchange`` (and ``noexchange_noexp``): no publication and no read of the slots; each chunk
  is scaled by its own sum: the split grid's loads, reductions and stores alone.
* ``softexp``: every exponential of the split forward from a degree-4 polynomial on the FMA pipe
  (2^f on [-0.5, 0.5], 2.7e-6 relative) instead of MUFU: right outputs, other pipe.
* ``halfexp``: half of the chunk's columns (one of each pair) from the polynomial, half from MUFU.
* cache hints (v13), joined by ``_`` (``yef_xef``): ``yef`` / ``ycs`` store every output with
  ``eviction_policy="evict_first"`` / ``cache_modifier=".cs"`` (streaming); ``xef`` reads the split
  forward's input with ``evict_first``; ``xcg`` reads every input with ``cache_modifier=".cg"`` (L2
  only, not L1). Right outputs.

Usage: python3 benchmarks/probes/split_costs.py [variant,...] [bfloat16,float32]
(``SWEEP_SHAPES`` as sweep.py reads it).
"""
import os
import sys
import tempfile

import torch
from triton.testing import do_bench

from kernel_variant import KERNELS, edited_kernels
from portable_softmax import launch, launch_compile, row_layout

SHAPES = [(16384, 32768), (16384, 65536), (4096, 262144), (4096, 50257), (4096, 151936), (32, 128256)]
if os.environ.get("SWEEP_SHAPES"):
    SHAPES = [tuple(map(int, shape.split("x"))) for shape in os.environ["SWEEP_SHAPES"].split(",")]

SPLIT_EXP = "        e = tl.exp2(z * LOG2E)\n        total = tl.sum(e, 1)\n        if ALIGN > 1:"
WAIT = ("    while tl.sum((v == EMPTY_SLOT).to(tl.int32)) > 0:\n"
        "        v = tl.load(first_slot + peers, mask=present, other=0, volatile=True)\n")
EXCHANGE = ("        row_max, row_total = _exchange(slot_ptr, tile, chunk, row_mask, packed, CHUNKS, CHUNKS_P2, True, "
            "STAGES)\n")
STORE = "    tl.store(ptr + base[:, None] + cols * col_stride, value.to(ptr.dtype.element_ty), mask=mask)\n"
LOAD = "    v = tl.load(ptr + base[:, None] + cols * col_stride, mask=mask, other=OTHER, eviction_policy=EVICT)"
SPLIT_LOAD = "x = _load(x_ptr, x_base, cols, x_col_stride, mask, "
SOFT = '''

@_jit
def _exp2_soft(t):
    """2^t from a polynomial on the FMA pipe: 2^j * p(f), j = round(t), f = t - j in [-0.5, 0.5]."""
    t = tl.maximum(t, -127.0, propagate_nan=tl.PropagateNan.ALL)
    r = t + 12582912.0
    j = r - 12582912.0
    f = t - j
    p = 0.009570101276040077 * f + 0.05591785907745361
    p = p * f + 0.240247443318367
    p = p * f + 0.6931217908859253
    p = p * f + 0.9999992847442627
    scale = ((r.to(tl.int32, bitcast=True) + 127) << 23).to(tl.float32, bitcast=True)
    return p * scale


@_jit
def _exp2_half(t, BLOCK_N: tl.constexpr):
    a, b = tl.split(tl.reshape(t, [BLOCK_N // 2, 2]))
    return tl.reshape(tl.join(tl.exp2(a), _exp2_soft(b)), [1, BLOCK_N])
'''


def variant_edits(name: str) -> dict[str, list[tuple[str, str]]]:
    """The (old, new) replacements of variant ``name``, by module of the kernel package. The split
    kernels' texts are those of v11-v13: from commit 4016614 on, the wait (``WAIT``) reads its slots
    through ``_read_slots``, and ``kernel_variant`` exits naming the module whose text is gone."""
    split, exchange, common = [], [], []
    if "noexp" in name:
        split.append((SPLIT_EXP, SPLIT_EXP.replace("tl.exp2(z * LOG2E)", "z * LOG2E")))
    if "noexchange" in name:
        split.append((EXCHANGE, "        row_max, row_total = tl.max(chunk_max, 0), tl.sum(total, 0)\n"))
    if "nowait" in name:
        exchange.append((WAIT, ""))
    if name in ("softexp", "halfexp"):
        call = "_exp2_soft(z * LOG2E)" if name == "softexp" else "_exp2_half(z * LOG2E, BLOCK_N)"
        split.append((SPLIT_EXP, SPLIT_EXP.replace("tl.exp2(z * LOG2E)", call)))
        split.append(("\n\n@_jit\ndef softmax_forward_split(", SOFT + "\n\n@_jit\ndef softmax_forward_split("))
    if "yef" in name or "ycs" in name:
        hint = 'eviction_policy="evict_first"' if "yef" in name else 'cache_modifier=".cs"'
        common.append((STORE, STORE.replace("mask=mask)", f"mask=mask, {hint})")))
    if "xef" in name:
        source = (KERNELS / "split.py").read_text()
        split += [(line, line.replace('False, "")', 'False, "evict_first")')) for line in source.split("\n")
                  if SPLIT_LOAD in line and line.endswith('False, "")')]
    if "xcg" in name:
        common.append((LOAD, LOAD.replace("eviction_policy=EVICT)", 'eviction_policy=EVICT, cache_modifier=".cg")')))
    return {"split": split, "exchange": exchange, "common": common}


def load_variant(name: str, folder: str):
    return edited_kernels(name, variant_edits(name), folder)


def bench(fn):
    return do_bench(fn, warmup=10, rep=50, return_mode="median")


def main():
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else ["base", "noexp", "nowait", "nowait_noexp", "softexp"]
    dtypes = [getattr(torch, d) for d in (sys.argv[2] if len(sys.argv) > 2 else "bfloat16").split(",")]
    folder = tempfile.mkdtemp()
    modules = {name: load_variant(name, folder) for name in names}
    print(f"{'variant':>13} {'dtype':>8} {'shape':>12} {'fwd':>5} {'err':>8} plan")
    for dtype in dtypes:
        for m, n in SHAPES:
            x = torch.randn(m, n, device="cuda", dtype=dtype) * 3
            reference = torch.softmax(x.double(), -1)
            copy = bench(lambda: x.clone())
            out = torch.empty_like(x)
            view = row_layout.row_view((m, n), 1, x, out)
            rows = []
            for name, module in modules.items():
                launch._kernel_module = lambda backend, module=module: module
                launch._records.clear()
                launch_compile._resources_cache.clear()
                # Fresh exchange slots: a variant that does not wait may leave them full.
                launch._scratch = launch._Scratch()
                launch._ticket_scratch = launch._Scratch()
                out.fill_(float("nan"))
                plan = launch.run_forward(x, out, view, False)
                err = ((out.double() - reference).norm() / reference.norm()).item()
                rows.append((name, plan, bench(lambda: launch.run_forward(x, out, view, False)), err))
            copy = min(copy, bench(lambda: x.clone()))
            for name, plan, t, err in rows:
                print(f"{name:>13} {str(dtype)[6:]:>8} {f'{m}x{n}':>12} {copy / t:5.2f} {err:8.1e} "
                      f"{plan.regime} P{plan.programs} w{plan.num_warps} bn{plan.block_n} c{plan.chunks} "
                      f"a{plan.align}{'t' if plan.ticketed else ''} s{plan.num_stages} occ{plan.occupancy}", flush=True)
            del x, out, reference
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
