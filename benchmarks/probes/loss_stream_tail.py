"""Probe (v47): what the streamed forward alone's last, mostly empty block costs a row of 50257.

bf16 rows of 50257 stream through aligned windows in blocks of 8192: seven blocks, the last 1112
columns long (14% of a block), each block the same instructions. Variants of the kernel package
(``kernel_variant.py``; measurement only) through the library's planner and launcher:

* ``base``: the library's kernels.
* ``notail``: the stream stops before its last partial block (wrong losses): the time a row would
  take if its tail cost nothing. If it reads within 3% of ``base``, the tail is not worth a loop of
  its own.

    python3 benchmarks/probes/loss_stream_tail.py [variant,...] [SHAPE,...]
"""
import sys
import tempfile

import torch
from triton.testing import do_bench

from kernel_variant import edited_kernels
import portable_softmax as ps
from portable_softmax import launch, launch_compile, loss_launch

STREAM = "        for start in tl.range(0, span, BLOCK_N):\n            lane_max, lane_sum, lane_dot, lane_prob = _stream_block("
NOTAIL = ("        for start in tl.range(0, span - BLOCK_N + 1, BLOCK_N):\n"
          "            lane_max, lane_sum, lane_dot, lane_prob = _stream_block(")


def main() -> None:
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else ["base", "notail"]
    shapes = sys.argv[2].split(",") if len(sys.argv) > 2 else ["4096x50257", "4096x50256", "8192x32000"]
    folder = tempfile.mkdtemp()
    modules = {name: edited_kernels(name, {"loss": [(STREAM, NOTAIL)]} if name == "notail" else {}, folder)
               for name in names}
    print(f"{'variant':>8} {'shape':>12} {'fwd ms':>8} {'floor':>6} plan", flush=True)
    for shape in shapes:
        n_rows, n_cols = (int(v) for v in shape.split("x"))
        x = torch.randn(n_rows, n_cols, device="cuda", dtype=torch.bfloat16) * 3
        target = torch.randint(0, n_cols, (n_rows,), device="cuda")
        # A read of the logits: a sum, at copy speed's half of the bytes (the floor's N V b).
        copy = do_bench(lambda: x.clone(), warmup=10, rep=50, return_mode="median") / 2
        for _ in range(2):
            for name, module in modules.items():
                launch._kernel_module = loss_launch._kernel_module = lambda backend, module=module: module
                loss_launch._forget()
                launch_compile._resources_cache.clear()
                ps.cross_entropy(x, target)
                ms = do_bench(lambda: ps.cross_entropy(x, target), warmup=10, rep=100, return_mode="median")
                plans = {record.plan for key, record in loss_launch._records.items() if key[0] == "forward"}
                text = "; ".join(f"{p.regime} p{p.programs} w{p.num_warps} c{p.block_n} a{p.align}" for p in plans)
                print(f"{name:>8} {shape:>12} {ms:8.4f} {copy / ms:6.2f} {text}", flush=True)
        del x, target
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
