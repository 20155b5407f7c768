"""Probe (v11): hardware counters for a few kernels, for Nsight Compute.

Runs the named case once to compile and plan, then once more inside the NVTX range "measure",
so that ncu profiles only the second call:

    ncu --clock-control none --nvtx --nvtx-include "measure/" --metrics ... \
        python3 benchmarks/probes/ncu_cases.py CASE

Cases: our forward (bf16 and fp32, the split path), x.clone(), and the backward of ours and of
torch.compile at a row length where torch.compile leads (NOTES v10).
"""
import sys

import torch

import portable_softmax as ps
from portable_softmax import ops


def cases():
    """Each case builds its tensors only when chosen, and returns the call to profile."""
    def forward(m, n, dtype):
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        return lambda: ps.softmax(x, -1)

    def clone(m, n, dtype):
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        return lambda: x.clone()

    def backward(m, n, dtype, compiled):
        y = torch.softmax(torch.randn(m, n, device="cuda", dtype=dtype), -1)
        dy = torch.randn_like(y)
        if compiled:
            fn = torch.compile(lambda y, dy: torch._softmax_backward_data(dy, y, -1, y.dtype), dynamic=False)
            return lambda: fn(y, dy)
        return lambda: ops._backward(y, dy, 1, y.dtype, False)

    return {
        "ours_fwd_bf16_4096x262144": lambda: forward(4096, 262144, torch.bfloat16),
        "ours_fwd_fp32_4096x262144": lambda: forward(4096, 262144, torch.float32),
        "clone_bf16_4096x262144": lambda: clone(4096, 262144, torch.bfloat16),
        "ours_fwd_bf16_16384x32768": lambda: forward(16384, 32768, torch.bfloat16),
        "ours_bwd_bf16_16384x16384": lambda: backward(16384, 16384, torch.bfloat16, False),
        "compile_bwd_bf16_16384x16384": lambda: backward(16384, 16384, torch.bfloat16, True),
    }


def main():
    fn = cases()[sys.argv[1]]()
    fn()
    torch.cuda.synchronize()
    with torch.cuda.nvtx.range("measure"):
        fn()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
