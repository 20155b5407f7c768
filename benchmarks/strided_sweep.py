"""Reductions along strided dimensions and sliced rows on one GPU (issue 18): correctness first,
then fraction of copy bandwidth for ours under several strided tunings, torch eager and
torch.compile, forward and the backward op, in one run.

    python benchmarks/strided_sweep.py --out DIR

Outputs are laid out as torch lays its own out (contiguous), whatever the input's layout. Bytes:
forward 2x the tensor, backward 3x; copy = x.clone() of the same tensor.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

from portable_softmax import device, launch, row_layout, tuning

# (name, shape of the tensor made, the view of it that is the input, dim, dtype)
CASES = [
    ("column (32768,1024) fp32 dim0", (32768, 1024), None, 0, torch.float32),
    ("column (32768,1024) bf16 dim0", (32768, 1024), None, 0, torch.bfloat16),
    ("column (16384,2048) bf16 dim0", (16384, 2048), None, 0, torch.bfloat16),
    ("transposed (4096,8192).t() bf16", (4096, 8192), lambda t: t.t(), -1, torch.bfloat16),
    ("NCHW (16,21,512,512) fp32 dim1", (16, 21, 512, 512), None, 1, torch.float32),
    ("NCHW (64,1024,32,32) bf16 dim1", (64, 1024, 32, 32), None, 1, torch.bfloat16),
    ("NCHW (8,1000,64,64) fp32 dim1", (8, 1000, 64, 64), None, 1, torch.float32),
    ("sliced (4096,50304)[:, :50257] bf16", (4096, 50304), lambda t: t[:, :50257], -1, torch.bfloat16),
    ("contiguous (4096,50257) bf16", (4096, 50257), None, -1, torch.bfloat16),
    ("contiguous (32768,1024) fp32", (32768, 1024), None, -1, torch.float32),
]
# Tunings tried beside the default ("ours"): a label and the CUDA tuning's changes ("split": False
# plans without the split path). Earlier sweeps (NOTES v20-v21): held tiles without their register
# cap ("notilefit": {"tile_fit_bytes": 0}); split tiles capped for 3 and 4 programs per SM whatever
# the caps spill (split_fit_bytes 196608 and 262144, split_fit_max_spills 256: slower everywhere);
# 8K elements a program (lower); float32 tiles of 16 rows (strided_rows {4: 16}: lower); ticketed
# grids for every split tile (split_ticket_bytes 0: +0.02-0.04 for bf16 columns on the H200, not
# taken); the loop regime (lower everywhere). Kernel variants built and removed: software-pipelined
# split tiles, and tiles of two chunks trading partials through slots per reader (both slower).
# v21 run 16 (H200): split tiles of wider rows where they have few chunks (Tuning.strided_split_rows
# and strided_split_slots): the bf16 backward of 1024 channels gained (0.62 -> 0.74 at 64 rows);
# wider forward tiles lost. Taken for the bf16 backward; run 17 checks it against none on the H100.
# Run 18 (H200): bf16 tiles of 32 rows everywhere (strided_rows {2: 32}): the 1024-channel forward
# then splits 32 x 512 in two chunks instead of holding 16 x 1024 whole: 0.64 -> 0.56, not taken.
# Run 19 (H200): the 1024-channel bf16 forward split as the backward now is, 64 rows x 128 in 8
# chunks (strided_rows {2: 64} at 8K elements a program), and 32 x 256 in 4: 0.64 -> 0.47 and
# 0.50 (the held 16 x 1024 tile stays): settings "fwd64x128" {"strided_rows": {2: 64, 4: 32, 8: 16},
# "strided_split_elements": 8192} and "fwd32x256" (strided_rows {2: 32, ...}, 8192).
# v22 run 9 (H200): split tiles of 64 rows wherever they split (settings "wide64bf16", "wide64":
# strided_split_rows 64 for bf16, then every dtype, strided_split_slots 1 << 30), their exchange
# slots unbounded, with and without an exchange in which the last chunk to arrive combines
# the partials once for all (built, measured, removed: slower in every case, NOTES v22). The wide
# tiles lost with either exchange (column bf16 0.41 -> 0.21-0.23, transposed 0.46 -> 0.27-0.29).
# Run 10 (H100): where torch.compile leads (the bf16 column's backward, 0.52 against 0.60):
# ticketed split tiles everywhere (split_ticket_bytes 0), twice the elements a program holds, both.
# (ticketed tiles of 16 chunks or more were taken: Tuning.strided_ticket_chunks.)
# v23 run 1 (H100): wider tiles at more exchange slots than the 512 in force ("slots2048",
# "slots2048fwd" with bf16 forward tiles of 32 rows, "slots4096"): level or slower (the bf16
# column's backward 0.59 -> 0.38 at 4096). Runs 4-5 (H200): the sliced regime (two launches),
# which the H200's row takes for long bf16 columns, against none ("noslices") and for every dtype
# ("slices").
# Run 6 (H200): the sliced regime's own settings (slice length "s512" "s2048", elements a step
# "t4k" "t16k", warps "w8", programs a unit "s512u8") over the bf16 columns, and fp32 columns
# sliced at 16K elements a step ("fp32t16k"): the defaults led. Run 8: every strided row of 1024
# or more sliced (the transposed input, the channels of NCHW tensors), in slices of 1024 and 256.
_FROM_1024 = {(direction, element): 1024 for direction in ("forward", "backward") for element in (2, 4)}
SWEEP = [("sliced", {"strided_slices": _FROM_1024}),
         ("sliced256", {"strided_slices": _FROM_1024, "slice_elements": 256})]
# Cases the sweep's settings change (reductions along a strided dimension, and contiguous tiles
# as a check).
SWEPT = ("column", "transposed", "NCHW", "contiguous (32768")
REPEATS = 5


def ours_forward(x: torch.Tensor, dim: int) -> torch.Tensor:
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    launch.run_forward(x, y, row_layout.row_view(tuple(x.shape), dim % x.dim(), x, y), False)
    return y


def ours_backward(y: torch.Tensor, dy: torch.Tensor, dim: int) -> torch.Tensor:
    dx = torch.empty(y.shape, dtype=y.dtype, device=y.device)
    launch.run_backward(y, dy, dx, row_layout.row_view(tuple(y.shape), dim % y.dim(), y, dy, dx), False)
    return dx


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="the default tuning only")
    parser.add_argument("--only", nargs="+", help="the cases whose names contain one of these")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    from torch._dynamo import config as dynamo_config

    dynamo_config.cache_size_limit = 256
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    # The device's own row (by name, architecture or default): each SWEEP setting changes it.
    device_tuning = tuning.tuning_for(device.device_record("cuda"))
    planned = launch.plan_launch
    rows = []
    failures = 0
    for name, shape, view, dim, dtype in CASES:
        if args.only and not any(part in name for part in args.only):
            continue
        x = (torch.randn(shape, device="cuda") * 3).to(dtype)
        if view is not None:
            x = view(x)
        bytes_moved = x.numel() * x.element_size()
        reference = torch.softmax(x.double(), dim)
        dy = torch.randn(x.shape, device="cuda").to(dtype)
        reference_dx = torch._softmax_backward_data(dy.double(), reference, dim % x.dim(), torch.float64)
        # The copy of a contiguous tensor of as many elements (a sliced view's clone is slower).
        dense = torch.empty(x.shape, dtype=dtype, device="cuda").normal_()
        copy = min(do_bench(lambda: dense.clone()) for _ in range(2))
        del dense
        bandwidth = 2 * bytes_moved / copy
        y_torch = torch.softmax(x, dim)
        # dx from y_torch (rounded to the dtype) differs from the float64 reference by y's own
        # rounding: torch's backward op on the same y sets how far ours may be (ours gave 2.8e-5
        # on a column of 32768 fp32 in every setting, over the fixed 1e-5).
        torch_dx_error = rel(torch._softmax_backward_data(dy, y_torch, dim % x.dim(), dtype), reference_dx)
        compiled_forward = torch.compile(lambda t: torch.softmax(t, dim), dynamic=False)
        compiled_backward = torch.compile(lambda y, g: torch._softmax_backward_data(g, y, dim % x.dim(), dtype),
                                          dynamic=False)
        entry = {"case": name, "copy_ms": copy, "copy_tbs": bandwidth / 1e9}
        timings = {
            "torch": (lambda: torch.softmax(x, dim),
                      lambda: torch._softmax_backward_data(dy, y_torch, dim % x.dim(), dtype)),
            "compile": (lambda: compiled_forward(x), lambda: compiled_backward(y_torch, dy)),
        }
        for label, (forward, backward) in timings.items():
            entry[f"{label}_fwd"] = 2 * bytes_moved / do_bench(forward) / bandwidth
            entry[f"{label}_bwd"] = 3 * bytes_moved / do_bench(backward) / bandwidth
        settings = [None] + ([] if args.quick or not any(k in name for k in SWEPT) else SWEEP)
        for setting in settings:
            label = "ours" if setting is None else f"ours {setting[0]}"
            allow_split = True
            if setting is not None:
                changes = dict(setting[1])
                allow_split = changes.pop("split", True)
                tuning.TUNING[("cuda", "*")] = dataclasses.replace(device_tuning, **changes)
            if not allow_split:
                launch.plan_launch = lambda *a, **k: planned(*a, **{**k, "allow_split": False})
            try:
                # Several launches each: a race in an exchange shows in some of them.
                forward_error = max(rel(ours_forward(x, dim), reference) for _ in range(REPEATS))
                backward_error = max(rel(ours_backward(y_torch, dy, dim), reference_dx) for _ in range(REPEATS))
                plan_f = [r.plan for r in launch._records.values()][-2:]
                ok = forward_error < (1e-5 if dtype == torch.float32 else 2e-2) and \
                    backward_error < max(1e-5 if dtype == torch.float32 else 2e-2, 2 * torch_dx_error)
                failures += not ok
                entry[f"{label}_err"] = (forward_error, backward_error)
                entry[f"{label}_fwd"] = 2 * bytes_moved / do_bench(lambda: ours_forward(x, dim)) / bandwidth
                entry[f"{label}_bwd"] = 3 * bytes_moved / do_bench(lambda: ours_backward(y_torch, dy, dim)) / bandwidth
                entry[f"{label}_plans"] = [f"{p.regime} {p.block_m}x{p.block_n} c{p.chunks} w{p.num_warps} "
                                           f"p{p.programs}{' T' if p.ticketed else ''}" for p in plan_f]
            except Exception as error:  # a setting that fails to compile or launch is reported, not fatal
                entry[f"{label}_error"] = repr(error)[:300]
                failures += 1
            finally:
                tuning.TUNING.pop(("cuda", "*"), None)
                launch.plan_launch = planned
        rows.append(entry)
        print(json.dumps(entry), flush=True)
        del x, y_torch, dy, reference, reference_dx
        torch.cuda.empty_cache()
    (args.out / "strided_sweep.json").write_text(json.dumps(rows, indent=1))
    print("\n| case | copy TB/s | torch fwd/bwd | compile fwd/bwd | ours fwd/bwd | best sweep fwd | best sweep bwd |")
    print("|---|---|---|---|---|---|---|")
    for entry in rows:
        sweep_f = max(((v, k) for k, v in entry.items() if k.startswith("ours ") and k.endswith("_fwd")),
                      default=(0, "-"))
        sweep_b = max(((v, k) for k, v in entry.items() if k.startswith("ours ") and k.endswith("_bwd")),
                      default=(0, "-"))
        print(f"| {entry['case']} | {entry['copy_tbs']:.2f} | {entry['torch_fwd']:.2f} / {entry['torch_bwd']:.2f} | "
              f"{entry['compile_fwd']:.2f} / {entry['compile_bwd']:.2f} | "
              f"{entry.get('ours_fwd', 0):.2f} / {entry.get('ours_bwd', 0):.2f} | "
              f"{sweep_f[0]:.2f} {sweep_f[1][5:-4]} | {sweep_b[0]:.2f} {sweep_b[1][5:-4]} |")
    print("\n| case | setting | fwd | bwd | plans |")
    print("|---|---|---|---|---|")
    for entry in rows:
        for key in entry:
            if key.startswith("ours") and key.endswith("_fwd"):
                label = key[:-4]
                print(f"| {entry['case']} | {label} | {entry[key]:.2f} | {entry.get(label + '_bwd', 0):.2f} | "
                      f"{'; '.join(entry.get(label + '_plans', []))} |")
    print(f"failures: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
