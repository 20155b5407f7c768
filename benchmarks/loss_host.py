"""The loss's host time on a GPU (v29): whether a step's time grows with the number of calls, and
whether the host or the GPU sets it. For each case (rows x classes, bf16, 'mean') and path
(``fwd+bwd``: the loss and ``backward()``; ``fwd``: the loss alone, no gradient), ours against torch
eager ``F.cross_entropy`` and Liger (when importable), each checked against torch in float64 first:

* ``host``: microseconds a call spends in Python and launches alone (a synchronize every 10 calls,
  outside the timed part, keeps the launch queue from blocking), per window of 100 calls, six
  windows: a growing host time shows as a rising row;
* ``wall``: microseconds per call of 300 calls back to back after a synchronize (the slower of the
  host and the GPU sets it);
* ``do_bench``: ``triton.testing.do_bench``'s median, three times in a row (the runs that read
  0.42, 0.49, 0.57, 0.65 ms before v29 on the H100).

Usage (GPU): python3 benchmarks/loss_host.py [OUT_DIR]; LOSS_HOST_CASES (``8192x32000,4096x50257``; a case
``NxV:float32`` in another dtype than bf16).
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton.testing

import portable_softmax
from portable_softmax.selfcheck import relative_error

# "NxV" (bfloat16) or "NxV:dtype".
CASES = [(*(int(v) for v in case.partition(":")[0].split("x")), getattr(torch, case.partition(":")[2] or "bfloat16"))
         for case in os.environ.get("LOSS_HOST_CASES", "8192x32000,4096x50257").split(",")]


def implementations() -> dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    found = {"ours": portable_softmax.cross_entropy, "torch": F.cross_entropy}
    try:
        from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction

        found["liger"] = lambda x, t: LigerCrossEntropyFunction.apply(x, t, None)[0]
    except Exception as error:  # noqa: BLE001  (a peer that cannot load is reported, not fatal)
        print(f"liger unavailable: {error}")
    return found


def host_windows(step: Callable[[], None], windows: int = 6, calls: int = 100) -> list[float]:
    found = []
    for _ in range(windows):
        spent = 0.0
        for call in range(calls):
            if call % 10 == 0:
                torch.cuda.synchronize()
            start = time.perf_counter()
            step()
            spent += time.perf_counter() - start
        found.append(spent / calls * 1e6)
    torch.cuda.synchronize()
    return found


def wall(step: Callable[[], None], calls: int = 300) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else None
    rows = []
    for n_rows, n_cols, dtype in CASES:
        torch.manual_seed(0)
        x0 = (torch.randn(n_rows, n_cols, device="cuda") * 2).to(dtype)
        target = torch.randint(0, n_cols, (n_rows,), device="cuda")
        target[::7] = -100
        leaf = x0.double().requires_grad_()
        expected = F.cross_entropy(leaf, target)
        expected.backward()
        for name, fn in implementations().items():
            x = x0.clone().requires_grad_()
            try:
                loss = fn(x, target)
                loss.backward()
                error = max(relative_error(loss, expected), relative_error(x.grad, leaf.grad))
            except Exception as failure:  # noqa: BLE001
                print(f"{n_rows}x{n_cols} {name}: {type(failure).__name__}: {failure}")
                continue

            def train() -> None:
                x.grad = None
                fn(x, target).backward()

            def forward() -> None:
                with torch.no_grad():
                    fn(x, target)

            for path, step in (("fwd+bwd", train), ("fwd", forward)):
                case = f"{n_rows}x{n_cols}" + ("" if dtype == torch.bfloat16 else f":{str(dtype)[6:]}")
                row = dict(case=case, impl=name, path=path, error=error,
                           host_us=host_windows(step), wall_us=wall(step),
                           do_bench_ms=[triton.testing.do_bench(step, return_mode="median") for _ in range(3)])
                rows.append(row)
                print(f"{row['case']:>11} {name:6} {path:8} err {error:.1e}  host us/window "
                      f"{' '.join(f'{v:6.1f}' for v in row['host_us'])}  wall {row['wall_us']:7.1f} us  do_bench "
                      f"{' '.join(f'{v:.3f}' for v in row['do_bench_ms'])} ms", flush=True)
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "loss_host.json"), "w") as handle:
            json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), handle, indent=1)


if __name__ == "__main__":
    main()
