"""Probe (v48): what the cross-entropy's launch fitted on this GPU, shape by shape: the planned
grid and programs an SM, the register cap it launched with, and the binary's registers, spills
and shared memory as the driver reports them (``kernel.cache``), beside the plan's reason. For
a plan that reads fewer programs an SM than the kernel's resources seem to allow.

    python3 benchmarks/probes/loss_fit_report.py [SHAPE,...] [REDUCTION,...]   (bf16 forward + backward;
                                                                           default 'mean')
"""
import sys

import torch

import portable_softmax as ps
from portable_softmax import loss_launch


def main() -> None:
    shapes = sys.argv[1].split(",") if len(sys.argv) > 1 else ["8192x32000", "4096x53248", "4096x50257"]
    reductions = sys.argv[2].split(",") if len(sys.argv) > 2 else ["mean"]
    for shape, reduction in ((shape, reduction) for shape in shapes for reduction in reductions):
        n_rows, n_cols = (int(v) for v in shape.split("x"))
        x = torch.randn(n_rows, n_cols, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        target = torch.randint(0, n_cols, (n_rows,), device="cuda")
        loss = ps.cross_entropy(x, target, reduction=reduction)
        loss.backward(torch.ones_like(loss))
        torch.cuda.synchronize()
        for key, record in loss_launch._records.items():
            if record.plan.regime != "split":
                continue
            plan = record.plan
            print(f"{shape} {reduction} {key[0]}: p{plan.programs} occ{plan.occupancy} w{plan.num_warps} c{plan.block_n} "
                  f"x{plan.chunks} s{plan.num_stages} options {record.options}")
            print(f"    reason: {plan.reason}")
            for device_cache in record.kernel.device_caches.values():
                for compiled in device_cache[0].values():
                    compiled._init_handles()
                    print(f"    binary: regs {compiled.n_regs} spills {compiled.n_spills} shared "
                          f"{compiled.metadata.shared} warps {compiled.metadata.num_warps} "
                          f"maxnreg {getattr(compiled.metadata, 'maxnreg', None)}")
        loss_launch._forget()
        del x, target
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
