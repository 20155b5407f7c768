"""Where the loop-windows branch's streamed forward alone loses a NaN on the GPU (NOTES v38: a
counted bf16 row with a NaN in its edge elements gave 0.0 on the H200, where torch gives NaN and
the CPU interpreter agrees with torch). Rows of 301 classes, "sliced" (rows 320 apart, each
starting aligned: a tail edge of 301 % ALIGN elements) and "odd-stride" (rows 307 apart), the
loop regime forced as ``tests/test_loss.py::test_streamed_forward_alone_reads_aligned_windows``
does; for each column in the row's first and last 16, a NaN there alone, every row counted
(target 0): ours (loss, lse) against torch's, and the plan's ALIGN.

    PYTHONPATH=$PWD python3 benchmarks/probes/loss_window_nan.py
"""
from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn.functional as F

import portable_softmax as ps
from portable_softmax import loss_launch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
from regimes import force_regime  # noqa: E402


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n_cols = 301
    with pytest.MonkeyPatch.context() as patch:
        force_regime(patch, "loop", device)
        for dtype in (torch.bfloat16, torch.float32):
            for layout, stride in (("sliced", 320), ("odd-stride", 307)):
                for value in ("nan", "inf"):
                    bad = []
                    for col in [*range(16), *range(n_cols - 16, n_cols)]:
                        torch.manual_seed(0)
                        x = (torch.randn(4 * stride, device=device) * 3).to(dtype).view(4, stride)[:, :n_cols]
                        x[1, col] = float(value)
                        target = torch.zeros(4, dtype=torch.long, device=device)
                        loss, lse = ps.cross_entropy(x, target, reduction="none", return_lse=True)
                        theirs = F.cross_entropy(x.double(), target, reduction="none")
                        their_lse = torch.logsumexp(x.double(), 1)
                        if not torch.equal(loss.isnan(), theirs.isnan()) or not torch.equal(lse.isnan(),
                                                                                             their_lse.isnan()):
                            bad.append(f"col {col}: loss {loss[1].item():.4g} (torch {theirs[1].item():.4g}) "
                                       f"lse {lse[1].item():.4g} (torch {their_lse[1].item():.4g})")
                    aligns = {record.plan.align for record in loss_launch._records.values()}
                    print(f"{str(dtype):15} {layout:10} {value}: {len(bad)} of 32 columns differ; plan align "
                          f"{aligns}", flush=True)
                    for line in bad:
                        print("   ", line)
                    loss_launch._records.clear()


if __name__ == "__main__":
    main()
