"""The head's memory against its time (issue 33): ``linear_cross_entropy`` forward + backward
under chunk budgets from 64 MiB to 1 GiB, the weight's gradient summed in float32 (the default)
and in bfloat16, beside Liger's fused linear cross-entropy when importable.

    PYTHONPATH=. python3 benchmarks/head_budget.py [--shape 8192x4096x128256] [--json FILE]

A smaller chunk holds fewer logits, but each chunk adds its term to the whole (vocabulary x
hidden) weight gradient: the sum is read and written once a chunk, 2 GB a pass for a float32 sum
of Llama 3's head (1 GB in bfloat16), about 1.3 ms (0.65 ms) at copy speed. Predicted for 8192
tokens x 128256: each halving of the budget doubles the chunks, so 64 MiB (16 chunks of 512
tokens) costs about 16 x 1.3 = 21 ms more than no accumulation at all with a float32 sum, 10 ms
in bf16; the matmuls' own time is level down to chunks of a few hundred tokens.

Per row: milliseconds (``triton.testing.do_bench`` median), the peak memory allocated beyond the
inputs and their gradients (``bench_head._peak_extra_mb`` less the gradients), the chunks.
"""
from __future__ import annotations

import argparse
import json

BUDGETS_MIB = [64, 128, 256, 512, 1024]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="8192x4096x128256", help="tokens x hidden x vocabulary")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)

    import torch
    import triton.testing

    import portable_softmax
    from portable_softmax import bench_head, head_chunks

    n_tokens, hidden_size, vocab = (int(v) for v in args.shape.lower().split("x"))
    device = torch.device("cuda")
    torch.manual_seed(0)
    h = (torch.randn(n_tokens, hidden_size, device=device) * 0.5).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(vocab, hidden_size, device=device) * 0.02).to(torch.bfloat16).requires_grad_()
    t = torch.randint(0, vocab, (n_tokens,), device=device)
    t[::7] = -100
    gradients_mb = (h.numel() + w.numel()) * 2 / 2**20
    runs = [(f"ours {budget}M {'fp32' if acc == torch.float32 else 'bf16'}-sum",
             lambda budget=budget, acc=acc: portable_softmax.linear_cross_entropy(
                 h, w, t, chunk_bytes=budget << 20, accumulate_dtype=acc), budget)
            for acc in (torch.float32, torch.bfloat16) for budget in BUDGETS_MIB]
    try:
        from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

        runs.append(("liger", lambda: LigerFusedLinearCrossEntropyFunction.apply(h, w, t)[0], None))
    except ImportError:
        pass
    print(f"linear_cross_entropy {n_tokens} tokens x {hidden_size} -> {vocab}, bf16, on "
          f"{torch.cuda.get_device_name(device)}: forward + backward")
    print(f"{'run':24s} {'chunks':>6s} {'ms':>8s} {'beyond grads MB':>16s}", flush=True)
    rows = []
    for name, loss, budget in runs:
        def step() -> None:
            h.grad = w.grad = None
            loss().backward()

        step()
        extra = bench_head._peak_extra_mb(step, (h, w), device) - gradients_mb
        ms = triton.testing.do_bench(step, warmup=50, rep=300, return_mode="median")
        chunks = "" if budget is None else -(-n_tokens // head_chunks.chunk_rows(n_tokens, vocab, 2, budget << 20))
        rows.append({"run": name, "chunks": chunks, "ms": ms, "beyond_grads_MB": extra})
        print(f"{name:24s} {chunks:>6} {ms:8.2f} {extra:16.0f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shape": args.shape, "device": torch.cuda.get_device_name(device), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
