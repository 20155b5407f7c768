"""Tuning sweep on one GPU: each variant of the backend's tuning table, forward and backward
fraction of x.clone() bandwidth on the shapes that matter, in one run (METHOD.md: one call, many
variants). The copy is timed before and after a shape's variants and the faster kept, as ``bench``
does: a first copy into freshly allocated memory runs slow. Usage: python3 benchmarks/sweep.py
[bfloat16,float32] [variant,...]; ``SWEEP_KERNELS=folder`` runs the kernels of that copy of the
kernel package (a probe's variant, ``probes/kernel_variant.py``) instead of the library's. The
``LOOP_VARIANTS`` are planned with the split path closed: the loop regime, as AMD and Ascend
stream long rows. ``SWEEP_SCALE=row``: the forward takes a per-row scale tensor (the fused
variant, ``kernels.fused``; its reference softmax(x * scale)); the backward stays plain."""
import dataclasses
import os
import sys

import torch
from triton.testing import do_bench

from portable_softmax import device, fused, launch, launch_plan, row_layout, tuning
from probes.kernel_variant import load_kernels

SHAPES = [(32768, 128), (32768, 256), (32768, 1024), (16384, 32768), (4096, 262144), (4096, 50257),
          (4096, 151936), (256, 151936), (32, 128256), (1, 128256)]
if os.environ.get("SWEEP_SHAPES"):
    SHAPES = [tuple(map(int, shape.split("x"))) for shape in os.environ["SWEEP_SHAPES"].split(",")]


def _widths(low: int, high: int) -> frozenset:
    """The power-of-two row widths from low to high (``Tuning.reread_cols``)."""
    return frozenset(1 << k for k in range(low.bit_length() - 1, high.bit_length()))


VARIANTS = {
    "base": {},
    "nofit": dict(split_fit_bytes=0),
    "fit64k": dict(split_fit_bytes=65536),
    "fit96k": dict(split_fit_bytes=98304),
    "c4k": dict(split_chunk=4096),
    "split_c4k_w4": dict(split_chunk=4096, split_elements_per_thread=32),
    "tile4k": dict(tile_elements=4096),
    "tile2k": dict(tile_elements=2048),
    "tile_ept8": dict(elements_per_thread=8),
    "tile_ept32": dict(elements_per_thread=32),
    "row32k": dict(row_elements=32768),
    "pad_off": dict(split_max_padding=1.0),
    "pad5": dict(split_max_padding=0.05),
    # v51: bf16 rows of 8193-16384 held as one tile (no windows: off 16-byte boundaries, an element
    # an instruction) split instead, through windows: as planned, chunks of 2048 or more, unhalved.
    "rows8k_split": dict(row_elements=8192),
    "rows8k_split_min2k": dict(row_elements=8192, split_min_chunk=2048),
    "rows8k_split_pad_off": dict(row_elements=8192, split_max_padding=1.0),
    # v52: odd rows of 2049-8191 columns (held or twice-read tiles, no windows) split through windows.
    "odd_split_2k": dict(split_min_cols=2048),
    # v52: tiles of one row read element by element, as before their windows.
    "tile_win_off": dict(tile_windows={}),
    # v52: fewer warps a tile of one row (and a twice-read one), windows on and off.
    "ept32_rr32": dict(elements_per_thread=32, reread_elements_per_thread=32),
    "win_off_ept32_rr32": dict(tile_windows={}, elements_per_thread=32, reread_elements_per_thread=32),
    "win_none": dict(split_windows=frozenset()),
    "win_fwd": dict(split_windows=frozenset({"forward"})),
    "win_bwd": dict(split_windows=frozenset({"backward"})),
    "tile_loop_all": dict(tile_loop_occupancy=tuning.both_directions(1 << 20)),
    "fit80k": dict(split_fit_bytes=81920),
    # v19: more bytes in flight per unit for the H200's faster memory.
    "fit128k": dict(split_fit_bytes=131072),
    "fit192k": dict(split_fit_bytes=196608),
    "fit256k": dict(split_fit_bytes=262144),
    # v20: held tiles without the register cap for two 32-KB tiles per SM (tile_fit_bytes).
    "notilefit": dict(tile_fit_bytes=0),
    # v21: forward chunks of 4096 for float32 only (the H200's per-row temperature; the backward
    # and bfloat16 keep theirs): in every split grid (run 1), then in ticketed grids only.
    "fwd4k32": dict(ticket_chunk={("forward", 4): 4096}),
    "noticketchunk": dict(ticket_chunk={}),
    "noticket": dict(split_tickets=frozenset()),
    "ticket_bwd": dict(split_tickets=frozenset({"forward", "backward"})),
    "ticket_all": dict(split_tickets=frozenset({"forward", "backward"}), split_ticket_bytes=0),
    "pipe_fwd": dict(split_pipelined=frozenset({"forward"})),
    "pipe_both": dict(split_pipelined=frozenset({"forward", "backward"})),
    "pipe_bwd": dict(split_pipelined=frozenset({"backward"})),
    "pipe_nt": dict(split_pipelined=frozenset({"forward", "backward"}), split_tickets=frozenset()),
    "pipe_s4": dict(split_pipelined=frozenset({"forward", "backward"}), split_stages=4),
    "pipe_fit128k": dict(split_pipelined=frozenset({"forward", "backward"}), split_fit_bytes=131072),
    "pipe_c4k": dict(split_pipelined=frozenset({"forward", "backward"}), split_chunk=4096,
                     split_elements_per_thread=32),
    # v10 (sweeps/run2-reread.log) swept twice-read tiles per direction: rows of 4096-65536.
    "no_reread": dict(reread_cols={}),
    "nofill": dict(tile_wave_fill=0.0),
    "tile4k_e64": dict(tile_elements=4096, elements_per_thread=64),
    "fill4": dict(split_fill_per_unit=4),
    "fill8": dict(split_fill_per_unit=8),
    "rr_all16k": dict(reread_cols={(d, b): _widths(16384, 16384) for d in ("forward", "backward") for b in (2, 4, 8)}),
    # v11: a program per tile (tile or twice-read) at any occupancy, as Inductor's grids are.
    "pt_all": dict(tile_loop_occupancy=tuning.both_directions(1)),
    "pt2": dict(tile_loop_occupancy=tuning.both_directions(2)),
    "pt3": dict(tile_loop_occupancy=tuning.both_directions(3)),
    "pt4": dict(tile_loop_occupancy=tuning.both_directions(4)),
    "rr_b4k_pt": dict(tile_loop_occupancy=tuning.both_directions(1),
                      reread_cols={("forward", 4): _widths(16384, 16384), ("backward", 4): _widths(4096, 32768)}),
    "rr_b4k": dict(reread_cols={("forward", 4): _widths(16384, 16384), ("backward", 4): _widths(4096, 32768)}),
    "e32": dict(split_elements_per_thread=32),
    "c16k_e128": dict(split_chunk=16384, split_elements_per_thread=128),
    "ppu3": dict(split_programs_per_unit=3),
    "ppu4": dict(split_programs_per_unit=4),
    "pipe_s2": dict(split_stages=2),
    # v12: twice-read bf16 backward rows (a program per row, no loop over tiles) over wider ranges.
    "rr_b8k": dict(reread_cols={("forward", 4): _widths(16384, 16384), ("backward", 4): _widths(8192, 32768)}),
    # v13: held tiles in the kernels' dense form too, per direction.
    "dense_bwd": dict(dense_tiles=frozenset({"backward"})),
    "dense_both": dict(dense_tiles=frozenset({"forward", "backward"})),
    "rr_b16k32k": dict(reread_cols={("forward", 4): _widths(16384, 16384), ("backward", 4): _widths(16384, 32768)}),
    # v36: the loop regime forced (LOOP_VARIANTS), blocks of 4096 (the plan's) and 8192.
    "loop": {},
    "loop_c8k": dict(loop_chunk=8192),
}

# The variants planned without the split path (as tests/regimes.force_regime plans the loop).
LOOP_VARIANTS = frozenset({"loop", "loop_c8k"})
ROW_SCALE = os.environ.get("SWEEP_SCALE") == "row"


def bench(fn):
    return do_bench(fn, warmup=10, rep=50, return_mode="median")


def _marks(plan) -> str:
    """' reread' and ' per-tile' where a plan has them (older trees' plans may lack the fields)."""
    return "".join(f" {mark}" for mark in ("reread", "per_tile") if getattr(plan, mark, False))


def _without_split(plan_launch):
    """``plan_launch`` with the split path closed: rows longer than a tile stream (the loop)."""
    return lambda *args, **options: plan_launch(*args, **{**options, "allow_split": False})


def _use_kernels(folder: str) -> None:
    module = load_kernels(folder, "portable_softmax_sweep_kernels")
    launch._kernel_module = lambda backend: module


def main():
    if os.environ.get("SWEEP_KERNELS"):
        _use_kernels(os.environ["SWEEP_KERNELS"])
    dtypes = [getattr(torch, d) for d in (sys.argv[1] if len(sys.argv) > 1 else "bfloat16,float32").split(",")]
    chosen = sys.argv[2].split(",") if len(sys.argv) > 2 else list(VARIANTS)
    record = device.device_record("cuda")
    backend = record.backend
    # The device's own row (by name, architecture or default): variants change it.
    base = tuning.tuning_for(record)
    plan_launch = launch_plan.plan_launch
    print(f"{'variant':>14} {'dtype':>8} {'shape':>12} {'regime':>6} {'fwd':>5} {'bwd':>5}")
    for dtype in dtypes:
        for m, n in SHAPES:
            x = torch.randn(m, n, device="cuda", dtype=dtype) * 3
            copy = bench(lambda: x.clone())
            rows = []
            scale = torch.rand(m, 1, device="cuda") + 0.5
            reference = torch.softmax(x.double() * (scale.double() if ROW_SCALE else 1), -1)
            y, dy = reference.to(dtype), torch.randn_like(x)
            dx = torch.empty_like(x)
            y64, dy64 = y.double(), dy.double()
            grad = y64 * (dy64 - (dy64 * y64).sum(-1, keepdim=True))
            del y64, dy64
            forward_view = row_layout.row_view((m, n), 1, x, y)
            backward_view = row_layout.row_view((m, n), 1, y, dy, dx)
            for name in chosen:
                tuning.TUNING[(backend, "*")] = dataclasses.replace(base, **VARIANTS[name])
                launch_plan.plan_launch = _without_split(plan_launch) if name in LOOP_VARIANTS else plan_launch
                try:
                    out = torch.full_like(x, float("nan"))
                    if ROW_SCALE:
                        fusion, mask_t, scale_t = fused._fusion(x, 1, scale, None, False)
                        # (The loop variants' split path is closed by ``_without_split`` above.)
                        record = launch.build_record("forward", (x, out, mask_t, scale_t), forward_view, False,
                                                     False, fusion=fusion)
                        forward = lambda: record((x, out, mask_t, scale_t))  # noqa: E731
                        forward()
                        plan = record.plan
                    else:
                        forward = lambda: launch.run_forward(x, out, forward_view, False)  # noqa: E731
                        plan = forward()
                    err = ((out.double() - reference).norm() / reference.norm()).item()
                    f = bench(forward)
                    dx.fill_(float("nan"))
                    bplan = launch.run_backward(y, dy, dx, backward_view, False)
                    berr = ((dx.double() - grad).norm() / grad.norm()).item()
                    b = bench(lambda: launch.run_backward(y, dy, dx, backward_view, False))
                    rows.append((name, plan, bplan, f, b, err, berr))
                except Exception as e:
                    print(f"{name:>14} {str(dtype)[6:]:>8} {f'{m}x{n}':>12} error {type(e).__name__}: {str(e)[:100]}")
            copy = min(copy, bench(lambda: x.clone()))
            for name, plan, bplan, f, b, err, berr in rows:
                print(f"{name:>14} {str(dtype)[6:]:>8} {f'{m}x{n}':>12} {plan.regime:>6} {copy / f:5.2f} "
                      f"{1.5 * copy / b:5.2f} err {err:.1e}/{berr:.1e} P{plan.programs} w{plan.num_warps} bm{plan.block_m} "
                      f"bn{plan.block_n} c{plan.chunks} a{plan.align}{'t' if plan.ticketed else ''} s{plan.num_stages} "
                      f"occ{plan.occupancy}{_marks(plan)} | bwd {bplan.regime} a{bplan.align}"
                      f"{'t' if bplan.ticketed else ''} s{bplan.num_stages} P{bplan.programs} w{bplan.num_warps} "
                      f"bn{bplan.block_n} occ{bplan.occupancy}{_marks(bplan)}", flush=True)
            del x, y, dy, dx, reference, grad, scale
            torch.cuda.empty_cache()
    # Back to the backend's own rows: writing ``base`` under "*" would give every device of the
    # backend this device's row (the H200's by name).
    tuning.TUNING.pop((backend, "*"), None)
    launch_plan.plan_launch = plan_launch


if __name__ == "__main__":
    main()
