"""Why `bench --cases loss` read the split loss's short bf16 rows slower than loss_sweep.py did
(H100, 2026-11-25: 8192x32000 0.57 against 0.84, 4096x50257 0.47 against 0.79, same plans asked):
times the forward + backward of the two shapes with and without ignored targets (the bench ignores
every 7th; the sweep none), twice each in alternating order, and prints the plans the calls took.
Usage (GPU): python3 benchmarks/probes/loss_first_rows.py"""
import torch
import triton.testing

import portable_softmax
from portable_softmax import loss_launch


def plans() -> str:
    return "; ".join(sorted({f"{k[0]}{'+g' if k[1].write_grad else ''}:{r.plan.regime} p{r.plan.programs} "
                             f"x{r.plan.chunks}{' T' if r.plan.ticketed else ''} s{r.plan.num_stages}"
                             for k, r in loss_launch._records.items() if k[0] == "forward"}))


def main() -> None:
    device = torch.device("cuda")
    for n_rows, n_cols in ((8192, 32000), (4096, 50257)):
        torch.manual_seed(0)
        x0 = (torch.randn(n_rows, n_cols, device=device) * 2).to(torch.bfloat16)
        copy = triton.testing.do_bench(lambda: x0.clone(), return_mode="median")
        for round_ in range(2):
            for ignored in ((False, True) if round_ == 0 else (True, False)):
                target = torch.randint(0, n_cols, (n_rows,), device=device)
                if ignored:
                    target[::7] = -100
                x = x0.clone().requires_grad_()

                def step() -> None:
                    x.grad = None
                    portable_softmax.cross_entropy(x, target).backward()

                ms = triton.testing.do_bench(step, return_mode="median")
                print(f"{n_rows}x{n_cols} ignored={ignored!s:5} round {round_}: {ms:.3f} ms, {copy / ms:.2f} of floor; "
                      f"{plans()}", flush=True)


if __name__ == "__main__":
    main()
