"""Whether the split loss's slow readings are a state of the GPU, of the host or of the kernel
(NOTES v49): one shape's forward + ``loss.backward()`` timed again and again for ``--seconds``,
each round by ``do_bench`` (host included), by ``do_bench_cudagraph`` (host left out) and the
logits' copy beside them (the memory's own speed), with the GPU's SM clock, memory clock,
power and temperature read by ``nvidia-smi`` after each round. A round between rounds
(``--flip``) lays a tuning override over the row in force and takes it back, so that the call
is planned and its records made again (as ``loss_sweep.py``'s settings do).

    PYTHONPATH=. python3 benchmarks/probes/loss_slow_state.py --shape 4096x53248 --seconds 90
"""
from __future__ import annotations

import argparse
import subprocess
import time


def _smi() -> str:
    query = "clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"
    out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                         text=True, check=False)
    return out.stdout.strip().replace(", ", " ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="4096x53248")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--flip", action="store_true", help="plan the call again between rounds")
    args = parser.parse_args()

    import torch
    import triton.testing

    import portable_softmax
    from portable_softmax import loss_launch, tuning
    from portable_softmax.device import device_record

    rows, cols = (int(v) for v in args.shape.lower().split("x"))
    device = torch.device("cuda")
    torch.manual_seed(0)
    x0 = (torch.randn(rows, cols, device=device) * 2).to(getattr(torch, args.dtype))
    target = torch.randint(0, cols, (rows,), device=device)
    x = x0.clone().requires_grad_()
    floor_bytes = 2 * x0.numel() * x0.element_size()

    def step() -> None:
        x.grad = None
        portable_softmax.cross_entropy(x, target).backward()

    step()
    torch.cuda.synchronize()
    record = device_record(device)
    key = (record.backend, record.name)
    print(f"{torch.cuda.get_device_name(device)}, {args.dtype} {rows}x{cols}; ms and fraction of the copy floor")
    print(f"{'t s':>6s} {'do_bench':>9s} {'graph':>9s} {'copy':>7s} {'copy TB/s':>9s}  sm MHz, mem MHz, W, C, throttle")
    start = time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        if args.flip:
            tuning.TUNING[key] = tuning.replace(tuning.tuning_for(record), split_stages=3)
            loss_launch._records.clear()
            step()
            tuning.TUNING.pop(key, None)
            loss_launch._records.clear()
            step()
        plain = triton.testing.do_bench(step, return_mode="median")
        graph = triton.testing.do_bench_cudagraph(step, return_mode="median")
        copy = triton.testing.do_bench(lambda: x0.clone(), return_mode="median")
        print(f"{time.perf_counter() - start:6.1f} {plain:9.3f} {graph:9.3f} {copy:7.3f} "
              f"{floor_bytes / copy / 1e9:9.2f}  {_smi()}  floor {copy / plain:.2f} {copy / graph:.2f}", flush=True)


if __name__ == "__main__":
    main()
