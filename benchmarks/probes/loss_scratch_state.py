"""After each split-loss call: the split scratch's slots left full (the persistent path needs them
empty between launches) and the call's loss/gradient against torch; then the time of repeated
calls. Probes the slowdown loss_first_rows.py saw after the first timed run (H100, 2026-11-25).
Usage (GPU): PYTHONPATH=. python3 benchmarks/probes/loss_scratch_state.py"""
import torch
import torch.nn.functional as F
import triton.testing

import portable_softmax
from portable_softmax import launch


def dirty() -> str:
    found = []
    for name in ("_scratch", "_ticket_scratch", "_counted_scratch", "_phased_scratch"):
        for key, (slots, counters) in getattr(launch, name)._buffers.items():
            found.append(f"{name}: {(slots != -1).sum().item()}/{slots.numel()} slots full, "
                         f"{(counters != 0).sum().item()}/{counters.numel()} counters set")
    return "; ".join(found) or "no scratch"


def main() -> None:
    device = torch.device("cuda")
    for n_rows, n_cols, ignored in ((8192, 32000, False), (8192, 32000, True), (4096, 50257, False)):
        torch.manual_seed(0)
        x0 = (torch.randn(n_rows, n_cols, device=device) * 2).to(torch.bfloat16)
        target = torch.randint(0, n_cols, (n_rows,), device=device)
        if ignored:
            target[::7] = -100
        reference = F.cross_entropy(x0.float(), target)
        xr = x0.float().requires_grad_()
        F.cross_entropy(xr, target).backward()
        for call in range(4):
            x = x0.clone().requires_grad_()
            loss = portable_softmax.cross_entropy(x, target)
            loss.backward()
            torch.cuda.synchronize()
            err = ((x.grad.float() - xr.grad).norm() / xr.grad.norm()).item()
            print(f"{n_rows}x{n_cols} ignored={ignored} call {call}: loss err {abs(loss.item() - reference.item()):.1e}, "
                  f"grad err {err:.1e}; {dirty()}", flush=True)

        def step() -> None:
            x.grad = None
            portable_softmax.cross_entropy(x, target).backward()

        for _ in range(3):
            print(f"  do_bench {triton.testing.do_bench(step, return_mode='median'):.3f} ms; {dirty()}", flush=True)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8), flush=True)


if __name__ == "__main__":
    main()
