"""Launches that overlap the kernel before them (``kernels/dependency.py``) checked on a GPU: the
loss's forward + ``backward()`` and forward alone, many calls back to back, each with fresh
targets ignoring a different share of positions (so that stats read before the stats kernel
wrote them, a previous call's, would scale the loss and gradient wrongly), every result kept and
compared afterwards with torch's in float32. Also prints which of our launch records asked for
the overlap (``launch_pdl``), so a run shows the path was taken.

    python benchmarks/probes/overlap_check.py [--calls 40]
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import portable_softmax
from portable_softmax import loss_launch
from portable_softmax.launch import LaunchRecord

# (tokens, vocab, dtype, options): split rows pipelined, windowed, long; fp32 ticketed; tiles;
# the softcap (its wait comes first); weights and smoothing (the weighted stats).
CASES = [
    (8192, 32000, torch.bfloat16, {}),
    (4096, 50257, torch.bfloat16, {}),
    (2048, 256000, torch.bfloat16, {}),
    (4096, 32000, torch.float32, {}),
    (16384, 2048, torch.bfloat16, {}),
    (4096, 32000, torch.bfloat16, {"softcap": 30.0}),
    (4096, 32000, torch.bfloat16, {"weight": True, "label_smoothing": 0.1}),
]


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _reference(x: torch.Tensor, target: torch.Tensor, options: dict) -> tuple[torch.Tensor, torch.Tensor]:
    z = x.detach().float().requires_grad_()
    capped = options["softcap"] * torch.tanh(z / options["softcap"]) if "softcap" in options else z
    loss = F.cross_entropy(capped, target, weight=options.get("weight"),
                           label_smoothing=options.get("label_smoothing", 0.0))
    loss.backward()
    return loss.detach(), z.grad


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=40)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"{'case':<40} {'calls':>5} {'loss err':>9} {'grad err':>9} {'alone err':>9}")
    for n, v, dtype, raw in CASES:
        options = dict(raw)
        if options.pop("weight", False):
            options["weight"] = torch.rand(v, device="cuda") + 0.5
        x0 = (torch.randn(n, v, device="cuda") * 2).to(dtype)
        x = x0.clone().requires_grad_()
        kept = []
        for _ in range(args.calls):
            target = torch.randint(0, v, (n,), device="cuda")
            target[torch.rand(n, device="cuda") < float(torch.rand(()))] = -100
            x.grad = None
            loss = portable_softmax.cross_entropy(x, target, **options)
            loss.backward()
            with torch.no_grad():
                alone = portable_softmax.cross_entropy(x0, target, **options)
            kept.append((target, loss.detach(), x.grad, alone))
        torch.cuda.synchronize()
        worst = [0.0, 0.0, 0.0]
        for target, loss, grad, alone in kept:
            want_loss, want_grad = _reference(x0, target, options)
            worst = [max(worst[0], _relative(loss, want_loss)), max(worst[1], _relative(grad, want_grad)),
                     max(worst[2], _relative(alone, want_loss))]
        label = f"{n}x{v} {str(dtype).removeprefix('torch.')} {','.join(raw) or 'plain'}"
        print(f"{label:<40} {args.calls:>5} {worst[0]:>9.1e} {worst[1]:>9.1e} {worst[2]:>9.1e}")
    held = [*loss_launch._records.values(), *loss_launch.calls.values()]
    records = [r for found in held for r in (found if isinstance(found, tuple) else (getattr(found, "record", found),))
               if isinstance(r, LaunchRecord)]
    print("records (kernel, launched to overlap):",
          sorted({(r.kernel.fn.__name__, bool(r.options.get("launch_pdl"))) for r in records}))


if __name__ == "__main__":
    main()
