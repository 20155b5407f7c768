"""Whether a loss call's host time waits on the GPU (NOTES v50): the host's microseconds of the
forward and of ``backward()`` (and of each of our launches inside them), timed call by call
(a) with the GPU idle at each call's start (a synchronize before it, outside the timing) and (b)
back to back, calls 6-30 after a synchronize (the GPU by then behind: a call whose host time grows
there waits on it). Ours (``cross_entropy``, bf16 'mean', x a leaf) and torch eager's.

    PYTHONPATH=. python3 benchmarks/probes/loss_host_block.py [--shape 4096x50257 ...]
"""
from __future__ import annotations

import argparse
import collections
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", action="append")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()

    import torch
    import torch.nn.functional as F

    import portable_softmax as ps
    from portable_softmax import launch

    spent: dict[str, float] = collections.defaultdict(float)
    original = launch.LaunchRecord._launch

    def timed_launch(self, tensors):
        start = time.perf_counter()
        try:
            return original(self, tensors)
        finally:
            spent[f"launch {getattr(self.kernel, '__name__', self.kernel)}"] += time.perf_counter() - start

    launch.LaunchRecord._launch = timed_launch
    device = torch.device("cuda")
    print(f"{torch.cuda.get_device_name(device)}, bf16, host us a call (medians)")
    for text in args.shape or ["4096x50257", "8192x32000"]:
        rows, cols = (int(v) for v in text.lower().split("x"))
        torch.manual_seed(0)
        x = (torch.randn(rows, cols, device=device) * 2).to(torch.bfloat16).requires_grad_()
        target = torch.randint(0, cols, (rows,), device=device)
        for name, loss_fn in (("ours", ps.cross_entropy), ("torch", F.cross_entropy)):
            def step() -> None:
                spent.clear()
                x.grad = None
                start = time.perf_counter()
                loss = loss_fn(x, target)
                middle = time.perf_counter()
                loss.backward()
                end = time.perf_counter()
                spent["forward"] += middle - start
                spent["backward"] += end - middle
                spent["call"] += end - start

            for _ in range(5):
                step()
            found = {"idle": collections.defaultdict(list), "behind": collections.defaultdict(list)}
            for _ in range(args.rounds):
                for _ in range(10):
                    torch.cuda.synchronize()
                    step()
                    for key, value in spent.items():
                        found["idle"][key].append(value)
                torch.cuda.synchronize()
                for call in range(30):
                    step()
                    if call >= 5:
                        for key, value in spent.items():
                            found["behind"][key].append(value)
                torch.cuda.synchronize()
            for key in found["idle"]:
                idle = statistics.median(found["idle"][key]) * 1e6
                behind = statistics.median(found["behind"][key]) * 1e6
                print(f"{text:>12s} {name:6s} {key:40s} idle {idle:8.1f}  behind {behind:8.1f}", flush=True)
        del x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
