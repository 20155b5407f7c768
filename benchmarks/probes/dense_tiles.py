"""Probe (v13): does the tile kernel in Inductor's dense form close torch.compile's bf16 backward lead?

The v12 probe (``inductor_backward.py``) read Inductor's written-out backward at 1.03-1.04 of copy
for bf16 rows of 32768 and ours at 0.97-0.99; its three differences from ours (a group division,
64-bit offsets, masks by a runtime row length) cost 0.05 together there. This writes a variant of
``kernels.py`` without them, valid only for one contiguous group of rows whose length is the block's
and whose offsets fit in int32 (every shape this probe runs): the group division is gone, offsets
are int32, and the tile kernels' masks are the constant ``cols < BLOCK_N``, which Triton drops.
``sweep.py`` runs it with ``SWEEP_KERNELS`` set to the file this writes.

Usage: python3 benchmarks/probes/dense_tiles.py OUT.py
"""
import os
import sys

from portable_softmax import ops

SOURCE = os.path.join(os.path.dirname(ops.__file__), "kernels.py")
EDITS = [
    ("    outer = tile // tiles_per_outer\n"
     "    rows = (tile - outer * tiles_per_outer) * BLOCK_M + tl.arange(0, BLOCK_M)\n"
     "    return tl.cast(outer, tl.int64), rows, rows < rows_per_outer\n",
     "    outer = tile * 0\n"
     "    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)\n"
     "    return outer, rows, rows < rows_per_outer\n", 1),
    ("    return outer * outer_stride + rows.to(tl.int64) * row_stride\n", "    return rows * row_stride\n", 1),
    ("        mask = row_mask[:, None] & (cols < n_cols)\n        # -inf padding",
     "        mask = cols < BLOCK_N\n        # -inf padding", 1),
    ("        mask = row_mask[:, None] & (cols < n_cols)\n        y = _load(",
     "        mask = cols < BLOCK_N\n        y = _load(", 1),
]


def dense_source() -> str:
    text = open(SOURCE).read()
    for old, new, count in EDITS:
        assert text.count(old) == count, old
        text = text.replace(old, new)
    return text


if __name__ == "__main__":
    with open(sys.argv[1], "w") as out:
        out.write(dense_source())
