"""The fused variants on one GPU (issue 20): correctness against the composite in float64, then
fraction of copy of ours (fused), torch's composite eager and the composite under torch.compile,
forward and backward op, for the issue's three cases.

Bytes the op must move: x read and y written (a causal call reads only the kept part of x, about
half), the mask's own bytes once (a broadcast mask comes from cache); backward y and dy read, dx
written. Copy: ``clone`` of a contiguous tensor of as many elements as x.

    python benchmarks/fused_bench.py [--out results.json]
"""
from __future__ import annotations

import argparse
import json
import math

import torch
from triton.testing import do_bench

import portable_softmax as ps


def composite(x: torch.Tensor, scale, mask, causal: bool) -> torch.Tensor:
    z = x * scale if scale is not None else x
    if mask is not None:
        z = z.masked_fill(~mask, -math.inf)
    if causal:
        z = z.masked_fill(torch.ones(z.shape[-2], z.shape[-1], dtype=torch.bool, device=z.device).triu(1), -math.inf)
    return torch.softmax(z, -1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    torch.manual_seed(0)
    from torch._dynamo import config as dynamo_config

    dynamo_config.cache_size_limit = 64
    compiled = torch.compile(composite, dynamic=False)
    cases = [
        ("(4, 32, 2048, 2048) bf16, padding mask (4, 1, 1, 2048), scale", (4, 32, 2048, 2048), torch.bfloat16,
         lambda d: 0.125, lambda d: torch.rand(4, 1, 1, 2048, device=d) > 0.1, False),
        ("causal (4, 32, 4096, 4096) bf16", (4, 32, 4096, 4096), torch.bfloat16, lambda d: None, lambda d: None, True),
        ("per-row temperature (256, 151936) fp32", (256, 151936), torch.float32,
         lambda d: 1 / (torch.rand(256, 1, device=d) + 0.5), lambda d: None, False),
    ]
    rows = []
    print(torch.cuda.get_device_name(), torch.__version__)
    for name, shape, dtype, make_scale, make_mask, causal in cases:
        x = (torch.randn(shape, device="cuda") * 3).to(dtype)
        scale, mask = make_scale("cuda"), make_mask("cuda")
        kept = 0.5 if causal else 1.0
        moved = x.numel() * x.element_size()
        mask_bytes = mask.numel() if mask is not None else 0
        dense = torch.empty_like(x)
        copy = min(do_bench(lambda: dense.clone()) for _ in range(2))
        bandwidth = 2 * moved / copy
        y = ps.softmax(x, -1, scale=scale, mask=mask, causal=causal)
        # The check on the first batch entry and head (the whole float64 reference would not fit).
        part = (0,) * (x.dim() - 2) if x.dim() > 2 else (slice(None),)
        sub_scale = scale[part] if isinstance(scale, torch.Tensor) and x.dim() > 2 else scale
        sub_mask = mask[(0,) * (mask.dim() - 2)] if mask is not None else None
        reference = composite(x[part].double(), sub_scale.double() if isinstance(sub_scale, torch.Tensor) else sub_scale,
                              sub_mask, causal)
        finite = torch.isfinite(reference)
        error = ((y[part].double()[finite] - reference[finite]).norm() / reference[finite].norm()).item()
        leaf = x.detach().requires_grad_()
        y_grad = ps.softmax(leaf, -1, scale=scale, mask=mask, causal=causal)
        dy = torch.randn_like(x)
        entry = {"case": name, "error": error, "copy_ms": copy}
        forward_bytes = (1 + kept) * moved + mask_bytes
        backward_bytes = 3 * moved
        timings = {
            "ours": (lambda: ps.softmax(x, -1, scale=scale, mask=mask, causal=causal),
                     lambda: torch.autograd.grad(y_grad, leaf, dy, retain_graph=True)),
            "torch composite": (lambda: composite(x, scale, mask, causal), None),
            "torch.compile composite": (lambda: compiled(x, scale, mask, causal), None),
        }
        for label, (forward, backward) in timings.items():
            try:
                entry[f"{label} fwd"] = forward_bytes / do_bench(forward) / bandwidth
                if backward is not None:
                    entry[f"{label} bwd (autograd)"] = backward_bytes / do_bench(backward) / bandwidth
            except Exception as failure:  # a peer that fails on a case is a result
                entry[f"{label} error"] = repr(failure)[:200]
        rows.append(entry)
        print(json.dumps(entry), flush=True)
        del x, y, reference, leaf, y_grad, dy, dense
        torch.cuda.empty_cache()
    print("\n| case | error | " + " | ".join(k for k in rows[0] if k not in ("case", "error", "copy_ms")) + " |")
    for entry in rows:
        values = [f"{v:.2f}" if isinstance(v, float) else str(v) for k, v in entry.items()
                  if k not in ("case", "error", "copy_ms")]
        print(f"| {entry['case']} | {entry['error']:.1e} | " + " | ".join(values) + " |")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
