"""Whether a call captured in a CUDA graph keeps the split path (NOTES v49): split rows' softmax
forward, and forward + backward through autograd, and the loss's forward + ``loss.backward()``, each timed eagerly
(``triton.testing.do_bench``) and replayed from a graph (``do_bench_cudagraph``, which captures
through ``torch.cuda.graph``, on a stream of its own), with the regime each launch record
planned. Run once per package tree in a fresh process (``PYTHONPATH`` picks the tree): before
v49 a capture on a stream whose split scratch had never grown streamed its rows instead.

    PYTHONPATH=. python3 benchmarks/probes/graph_capture_split.py
"""
from __future__ import annotations


def main() -> None:
    import torch
    import triton.testing

    import portable_softmax as ps

    device = torch.device("cuda")
    torch.manual_seed(0)
    x = torch.randn(4096, 262144, device=device, dtype=torch.bfloat16)
    xr = x.clone().requires_grad_()
    dy = torch.randn_like(x)
    logits = (torch.randn(4096, 53248, device=device) * 2).to(torch.bfloat16).requires_grad_()
    target = torch.randint(0, 53248, (4096,), device=device)

    def loss_step() -> None:
        logits.grad = None
        ps.cross_entropy(logits, target).backward()

    cases = {
        "softmax forward bf16 4096x262144": lambda: ps.softmax(x, dim=-1),
        "softmax fwd+bwd bf16 4096x262144": lambda: torch.autograd.grad(ps.softmax(xr, dim=-1), xr, dy),
        "cross_entropy fwd+bwd bf16 4096x53248": loss_step,
    }
    print(f"{torch.cuda.get_device_name(device)}, package {ps.__file__}")
    print(f"{'case':40s} {'eager ms':>9s} {'graph ms':>9s}")
    for name, fn in cases.items():
        fn()
        eager = triton.testing.do_bench(fn, return_mode="median")
        graph = triton.testing.do_bench_cudagraph(fn, return_mode="median")
        print(f"{name:40s} {eager:9.3f} {graph:9.3f}", flush=True)


if __name__ == "__main__":
    main()
