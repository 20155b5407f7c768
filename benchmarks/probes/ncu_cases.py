"""Probe (v11): hardware counters for a few kernels, for Nsight Compute.

Runs the named case once to compile and plan, then once more inside the NVTX range "measure",
so that ncu profiles only the second call:

    ncu --clock-control none --nvtx --nvtx-include "measure/" --metrics ... \
        python3 benchmarks/probes/ncu_cases.py CASE

Cases: our forward (bf16 and fp32, the split path), x.clone(), and the backward of ours and of
torch.compile at a row length where torch.compile leads (NOTES v10); reductions along a strided
dimension (a column, channels of NCHW; NOTES v20); the loss's forward that writes the gradient, bf16
against fp32, where bf16 reads below fp32 on the H200 (NOTES v31-v32: issue-bound or not).
"""
import sys

import torch

import portable_softmax as ps
from portable_softmax import op_calls


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
        return lambda: op_calls._backward(y, dy, 1, y.dtype, False)

    def strided(shape, dim, dtype, backward=False):
        # A reduction along a strided dimension (issue 18): the forward, or the backward op.
        x = torch.randn(shape, device="cuda", dtype=dtype)
        if backward:
            y = torch.softmax(x, dim)
            dy = torch.randn_like(y)
            return lambda: op_calls._backward(y, dy, dim, y.dtype, False)
        return lambda: ps.softmax(x, dim)

    def loss_with_gradient(m, n, dtype):
        # cross_entropy's forward on logits that require grad: the split kernel writing the gradient.
        x = torch.randn(m, n, device="cuda", dtype=dtype, requires_grad=True)
        target = torch.randint(0, n, (m,), device="cuda")
        return lambda: ps.cross_entropy(x, target)

    def loss_alone(m, n, dtype):
        # cross_entropy's forward alone (no gradient): the streamed loop, one read of the logits.
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        target = torch.randint(0, n, (m,), device="cuda")
        return lambda: ps.cross_entropy(x, target)

    def clone_of(shape, dtype):
        x = torch.randn(shape, device="cuda", dtype=dtype)
        return lambda: x.clone()

    return {
        # v20: what long columns and bf16 channel tiles read from DRAM against what they need.
        "ours_fwd_column_bf16": lambda: strided((32768, 1024), 0, torch.bfloat16),
        "ours_fwd_column_fp32": lambda: strided((32768, 1024), 0, torch.float32),
        "ours_fwd_nchw1024_bf16": lambda: strided((64, 1024, 32, 32), 1, torch.bfloat16),
        "ours_bwd_nchw1024_bf16": lambda: strided((64, 1024, 32, 32), 1, torch.bfloat16, True),
        "clone_column_bf16": lambda: clone_of((32768, 1024), torch.bfloat16),
        "ours_fwd_bf16_4096x262144": lambda: forward(4096, 262144, torch.bfloat16),
        "ours_fwd_fp32_4096x262144": lambda: forward(4096, 262144, torch.float32),
        "clone_bf16_4096x262144": lambda: clone(4096, 262144, torch.bfloat16),
        "ours_fwd_bf16_16384x32768": lambda: forward(16384, 32768, torch.bfloat16),
        "ours_bwd_bf16_16384x16384": lambda: backward(16384, 16384, torch.bfloat16, False),
        "compile_bwd_bf16_16384x16384": lambda: backward(16384, 16384, torch.bfloat16, True),
        "ours_loss_grad_bf16_8192x128256": lambda: loss_with_gradient(8192, 128256, torch.bfloat16),
        "ours_loss_grad_fp32_8192x128256": lambda: loss_with_gradient(8192, 128256, torch.float32),
        "clone_bf16_8192x128256": lambda: clone(8192, 128256, torch.bfloat16),
        # v38: at 8192 tokens the bf16 gradient form reads 0.84 at 128256 and 0.77 at 256000.
        "ours_loss_grad_bf16_8192x256000": lambda: loss_with_gradient(8192, 256000, torch.bfloat16),
        "ours_loss_grad_bf16_8192x151936": lambda: loss_with_gradient(8192, 151936, torch.bfloat16),
        # v39: the short rows' kernels, not the host, set their time (forward alone 0.71-0.74).
        "ours_loss_alone_bf16_8192x32000": lambda: loss_alone(8192, 32000, torch.bfloat16),
        "ours_loss_alone_bf16_4096x50257": lambda: loss_alone(4096, 50257, torch.bfloat16),
        "ours_loss_grad_bf16_8192x32000": lambda: loss_with_gradient(8192, 32000, torch.bfloat16),
        "clone_bf16_8192x32000": lambda: clone(8192, 32000, torch.bfloat16),
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
