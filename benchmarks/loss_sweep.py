"""The cross-entropy's long rows under tuning overrides: the split regime (v26) against the streamed
loop (v25), forward + ``loss.backward()`` and forward alone, fraction of the copy floor, per shape,
dtype and setting (issue 32), each checked against torch in float64 first.

    PYTHONPATH=. python3 benchmarks/loss_sweep.py             # the default run (below)
    PYTHONPATH=. python3 benchmarks/loss_sweep.py --shape 8192x128256 --dtype bfloat16 --setting base --setting loop
    PYTHONPATH=. python3 benchmarks/loss_sweep.py --all      # every setting on every shape and dtype (long)

The default run times ``base``, ``loop`` and ``alone-split`` on the six shapes of
``portable-softmax bench --cases loss`` in both dtypes, and the split regime's other settings
(``EXPLORE``) on ``EXPLORE_SHAPES`` in bf16, the dtype that misses its floor: about 6 minutes on
an H100 (estimated), most of it compiling (each split kernel is
specialised on its rows' chunk count, and the launch tries register caps).

A setting is a set of ``Tuning`` fields laid over the row in force for the device (through
``portable_softmax.tuning.TUNING``, keyed by the device's name so that it wins over every other
row). Floor: ``x.clone()`` timed before and after each shape (the faster kept), which reads and
writes N·V·b: the floor of forward + backward (read the logits once, write the gradient once);
half of it the forward's. Times are ``triton.testing.do_bench`` medians (``--graph``: of
``do_bench_cudagraph``, the host's time left out). Targets uniform over the
vocabulary, every seventh ignored (-100), as ``portable-softmax bench --cases loss``. The check
(``_check``): the loss with and without the gradient, the first rows' gradient and lse, each
against torch's in float64 (relative error of the whole tensor); a setting off torch beyond the
dtype's tolerance fails the run (exit 1).

Nothing GPU-only is imported before ``main`` runs.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

# The shapes of ``portable-softmax bench --cases loss`` (``bench_loss.SHAPES``).
SHAPES = [(8192, 32000), (4096, 50257), (8192, 128256), (4096, 151936), (4096, 256000), (16384, 128256)]
DTYPES = ["bfloat16", "float32"]
# name -> Tuning fields over the row in force. "base": the row in force, unchanged.
SETTINGS: dict[str, dict[str, Any]] = {
    "base": {},
    # v25's streamed rows: each row read twice where the gradient is written.
    "loop": {"loss_split": frozenset()},
    # The forward alone with the waiting exchange (v26-v30: every chunk waits on its row's peers)
    # rather than by arrival (the row's last chunk alone writes its terms; nothing waits), split
    # (the CUDA rows stream it since v37): only the forward alone (``fwd``) differs from ``base``.
    "no-arrival": {"loss_split": frozenset({"gradient", "loss"}), "loss_arrival": False},
    # The split regime's choices the planner makes from the softmax's measurements:
    # 8 warps a chunk of 8192 (32 elements a thread) rather than 4: more programs an SM.
    "split-w8": {"loss_split_elements_per_thread": 32},
    # A program per item taken by ticket, whatever the bytes a unit holds.
    "split-ticketed": {"split_ticket_bytes": 0, "split_ticket_waves": 0},
    "split-w8-ticketed": {"loss_split_elements_per_thread": 32, "split_ticket_bytes": 0, "split_ticket_waves": 0},
    # A persistent grid, pipelined as planned; and unpipelined.
    "split-persistent": {"split_tickets": frozenset()},
    "split-unpipelined": {"split_tickets": frozenset(), "split_pipelined": frozenset()},
    # Chunks of 4096: more items, fewer registers each.
    "split-c4096": {"split_chunk": 4096},
    # No register caps (the launch's split_fit).
    "split-nofit": {"split_fit_bytes": 0},
    # bf16 chunks of as many bytes as fp32's 8192 (32 KB), which read 0.97-1.03 of the floor
    # forward alone by ticket: 8 warps (64 elements a thread), and 4; by ticket; and with padding
    # allowed, so that odd rows (50257) keep wide chunks.
    "split-c16k": {"split_chunk": 16384},
    "split-c16k-w4": {"split_chunk": 16384, "loss_split_elements_per_thread": 128},
    "split-c16k-ticketed": {"split_chunk": 16384, "split_ticket_bytes": 0, "split_ticket_waves": 0},
    "split-c16k-pad": {"split_chunk": 16384, "split_max_padding": 0.3},
    # Chunks of 8192 on rows whose last chunk is mostly padding (50257: 7 chunks, 12%) rather
    # than 4096 at 2 warps.
    "split-pad15": {"split_max_padding": 0.15},
    # Chunks of 8192 where the table holds no row of their form: a cap whose estimate spills is
    # compiled and tried rather than refused (v48: 4 programs an SM, 122-128 registers, none spilled).
    "split-pad15-fit": {"split_max_padding": 0.15, "split_fit_max_spills": 64, "split_programs_per_unit": 4},
    # Odd vocabularies (v49): chunks of 8192 under a cap that fits 4 programs a unit; more
    # programs a unit for the chunks of 4096 (caps that spill), or chunks of 2048 (1 warp).
    "split-c8192-fit": {"split_max_padding": 1.0, "loss_window_chunk": 0, "split_fit_max_spills": 64,
                        "split_programs_per_unit": 4},
    # Aligned rows in chunks of 8192 however much of their last chunk is padding (v49).
    "split-nohalve": {"split_max_padding": 1.0},
    "split-spills32": {"split_fit_max_spills": 32},
    "split-spills64": {"split_fit_max_spills": 64},
    "split-c2048": {"loss_window_chunk": 2048},
    "split-c2048-spills32": {"loss_window_chunk": 2048, "split_fit_max_spills": 32},
    # A register cap that spills up to 16 words a thread (8 by default): more programs an SM.
    "split-spills16": {"split_fit_max_spills": 16},
    # The forward alone split by arrival (the default before v37; the CUDA rows now stream it).
    "alone-split": {"loss_split": frozenset({"gradient", "loss"})},
    # The forward alone streamed (the loop regime: each program its rows, no exchange).
    # Blocks of 4096 at the planner's warps (before v37), and the v37 row's 8192 at 8 warps.
    "alone-loop": {"loss_split": frozenset({"gradient"}), "loss_alone_chunk": 4096, "loss_loop_warps": 0},
    # Blocks of 4 or 8 lane rows of 2048 (v34: the block reduced within each thread). 8 warps: the
    # planner's 16 elements a thread would give 16 or 32, whose threads and vectors outnumber the
    # lanes, and the middle axis would be reduced across warps.
    "alone-loop-c8k": {"loss_split": frozenset({"gradient"}), "loss_alone_chunk": 8192, "loss_loop_warps": 8},
    "alone-loop-c16k": {"loss_split": frozenset({"gradient"}), "loss_alone_chunk": 16384, "loss_loop_warps": 8},
    "alone-loop-c8k-w4": {"loss_split": frozenset({"gradient"}), "loss_alone_chunk": 8192, "loss_loop_warps": 4},
    # The forward alone of short rows as one tile a row (v39: the short rows' forward alone reads
    # 0.71-0.74, kernel-bound): a program holds its whole row, every load in flight at once, one
    # reduction; rows of up to 32768 (8192x32000) or 65536 (4096x50257) elements. The forward
    # that writes the gradient holds half as many (its plans unchanged at these rows).
    # The forward alone's streamed program capped to fit 5 or 6 programs a unit, for 2- and 4-byte
    # logits (v41; the H200's row takes 5 for 2-byte logits), or none.
    "alone-loop-fit5": {"loss_loop_fit": {2: 5, 4: 5}},
    "alone-loop-fit6": {"loss_loop_fit": {2: 6, 4: 6}},
    "alone-loop-nofit": {"loss_loop_fit": {}},
    # 4 an SM (v51): rows of 4096 tokens fill 6.2 waves of 5 an SM (the last a fifth full), 7.8 of 4.
    "alone-loop-fit4": {"loss_loop_fit": {2: 4, 4: 4}},
    # The streamed grid: resident programs times 1, 2 (the base's 4) or 16 (8192 rows: a program a row).
    "alone-waves1": {"tile_waves": 1},
    "alone-waves2": {"tile_waves": 2},
    "alone-waves16": {"tile_waves": 16},
    # The H200's program a row where the rows fill 12 waves (v45), off.
    "alone-no-row-programs": {"loss_alone_row_waves": 0},
    # A program a row whatever the waves (v51: 4096 rows).
    "alone-row-programs": {"loss_alone_row_waves": 1},
    # Blocks of 4096 since the running values went a thread's vector (v45: sm_90 bf16 rows of 32000
    # cost the same instructions as in 8192, rows of 50257 3.7% fewer; 39-40 registers, so 6
    # programs an SM fit uncapped-alike).
    "alone-c4k": {"loss_alone_chunk": 4096, "loss_loop_warps": 8},
    "alone-c4k-fit6": {"loss_alone_chunk": 4096, "loss_loop_warps": 8, "loss_loop_fit": {2: 6}},
    "alone-tile32k": {"row_elements": 32768},
    "alone-tile64k": {"row_elements": 65536},
    # Programs a unit for the split forms (the register cap fitted to them).
    "ppu3": {"split_programs_per_unit": 3},
    "ppu4": {"split_programs_per_unit": 4},
    "ppu5": {"split_programs_per_unit": 5},
    # The pipeline's depth (3 by default on CUDA).
    "stages2": {"split_stages": 2},
    "stages4": {"split_stages": 4},
}
DEFAULT_SETTINGS = ["base", "loop", "alone-split"]
# Compiles dominate the run (the split kernels are specialised on their rows' chunk count, and
# the launch compiles each candidate grid with register caps): three settings by default.
EXPLORE = ["split-w8", "split-ticketed", "split-unpipelined"]
EXPLORE_SHAPES = [(8192, 32000), (8192, 128256)]
EXPLORE_DTYPES = ["bfloat16"]
IGNORED_EVERY = 7
CHECK_ROWS = 64
# Relative error accepted (the loss is rounded to the input's dtype; the gradient is rounded once).
TOLERANCE = {"bfloat16": 1e-2, "float32": 1e-5}


def _shape(text: str) -> tuple[int, int]:
    rows, cols = text.lower().split("x")
    return int(rows), int(cols)


def _relative_error(found, expected) -> float:
    expected = expected.double()
    return float((found.double() - expected).norm() / expected.norm().clamp_min(1e-300))


def _apply(setting: dict[str, Any], device) -> None:
    """Lay ``setting`` over the tuning row in force for ``device`` (or take it back when empty)."""
    from portable_softmax import tuning
    from portable_softmax.device import device_record

    record = device_record(device)
    key = (record.backend, record.name)
    tuning.TUNING.pop(key, None)
    if setting:
        tuning.TUNING[key] = tuning.replace(tuning.tuning_for(record), **setting)


def _plans(n_cols: int) -> str:
    """The plans the last calls took for rows of ``n_cols``: direction, regime, programs, warps,
    chunk (and a split row's chunks, T for ticketed, its windows), stages, occupancy."""
    from portable_softmax import loss_launch

    found = []
    for key, record in loss_launch._records.items():
        if key[0] in ("forward", "backward") and key[2].n_cols == n_cols:
            plan = record.plan
            kind = f"{key[0]}{'+grad' if key[0] == 'forward' and key[1].write_grad else ''}"
            split = (f" x{plan.chunks}{' T' if plan.ticketed else ''}{f' a{plan.align}' if plan.align > 1 else ''}"
                     if plan.regime == "split" else "")
            found.append(f"{kind}:{plan.regime} p{plan.programs} w{plan.num_warps} c{plan.block_n}{split} "
                         f"s{plan.num_stages} occ{plan.occupancy}")
    return "; ".join(sorted(set(found)))


def _check(x, target, reduction: str = "mean", options: dict[str, Any] | None = None) -> tuple[float, float]:
    """The worst relative errors against torch in float64 of (the loss with the gradient, the
    loss alone, lse) and of the first rows' gradient; 'none' (each row's loss, its gradient
    formed in the backward from the saved lse) against torch's row losses. ``options``: the
    package's (weight, label_smoothing, z_loss, softcap), against their float64 composite."""
    import torch

    import portable_softmax

    if reduction == "none":
        return _check_rows(x, target)
    options = options or {}
    leaf = x.detach().clone().requires_grad_()
    loss = portable_softmax.cross_entropy(leaf, target, **options)
    loss.backward()
    with torch.no_grad():
        alone, lse = portable_softmax.cross_entropy(x, target, return_lse=True, **options)
    counted = target != -100
    weight = options.get("weight")
    denominator = weight.double()[target[counted]].sum() if weight is not None else counted.sum()
    expected = torch.zeros((), dtype=torch.float64, device=x.device)
    for start in range(0, x.shape[0], 1024):
        expected += _reference(x[start:start + 1024].double(), target[start:start + 1024], options, denominator,
                               counted.sum())
    head = x[:CHECK_ROWS].detach().double().requires_grad_()
    _reference(head, target[:CHECK_ROWS], options, denominator, counted.sum()).backward()
    capped = _capped(head.detach(), options)
    losses = max(_relative_error(loss.detach(), expected), _relative_error(alone, expected),
                 _relative_error(lse[:CHECK_ROWS], torch.logsumexp(capped, 1)))
    return losses, _relative_error(leaf.grad[:CHECK_ROWS], head.grad)


def _capped(z, options: dict[str, Any]):
    """The logits after the softcap (``softcap * tanh(z / softcap)``), as the package takes them."""
    import torch

    softcap = options.get("softcap")
    return softcap * torch.tanh(z / softcap) if softcap else z


def _reference(z, target, options: dict[str, Any], denominator, count):
    """The float64 composite of the package's 'mean' over rows ``z`` (torch's cross-entropy with
    its weight and smoothing, the softcap before it, the z-loss over the counted rows), as this
    block's share of the whole batch's: divided by the batch's ``denominator`` (summed weights of
    the counted targets) and ``count`` (counted targets, the z-loss's)."""
    import torch
    import torch.nn.functional as F

    weight = options.get("weight")
    capped = _capped(z, options)
    loss = F.cross_entropy(capped, target, weight=None if weight is None else weight.double(), reduction="sum",
                           label_smoothing=options.get("label_smoothing", 0.0)) / denominator
    if options.get("z_loss"):
        lse = torch.logsumexp(capped, 1)[target != -100]
        loss = loss + options["z_loss"] * (lse * lse).sum() / count
    return loss


def _check_rows(x, target) -> tuple[float, float]:
    """``_check`` of reduction='none': the row losses (with and without the gradient) and the
    first rows' gradient under an incoming gradient of random weights."""
    import torch
    import torch.nn.functional as F

    import portable_softmax

    leaf = x.detach().clone().requires_grad_()
    loss = portable_softmax.cross_entropy(leaf, target, reduction="none")
    weights = torch.rand(loss.shape, device=x.device, dtype=loss.dtype)
    loss.backward(weights)
    with torch.no_grad():
        alone = portable_softmax.cross_entropy(x, target, reduction="none")
    expected = torch.cat([F.cross_entropy(x[start:start + 1024].double(), target[start:start + 1024],
                                          reduction="none") for start in range(0, x.shape[0], 1024)])
    head = x[:CHECK_ROWS].detach().double().requires_grad_()
    F.cross_entropy(head, target[:CHECK_ROWS], reduction="none").backward(weights[:CHECK_ROWS].double())
    losses = max(_relative_error(loss.detach(), expected), _relative_error(alone, expected))
    return losses, _relative_error(leaf.grad[:CHECK_ROWS], head.grad)


def _runs(args: argparse.Namespace) -> list[tuple[str, tuple[int, int], str]]:
    """(dtype, shape, setting) in the order timed: by dtype and shape, so that a shape's floor is
    timed around its settings."""
    if args.all or args.setting or args.shape or args.dtype:
        names = list(SETTINGS) if args.all else args.setting or DEFAULT_SETTINGS
        return [(dtype, shape, name) for dtype in args.dtype or DTYPES for shape in args.shape or SHAPES
                for name in names]
    runs = []
    for dtype in DTYPES:
        for shape in SHAPES:
            names = DEFAULT_SETTINGS + (EXPLORE if dtype in EXPLORE_DTYPES and shape in EXPLORE_SHAPES else [])
            runs += [(dtype, shape, name) for name in names]
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=_shape, action="append", help="tokens x vocabulary; repeat (default: "
                        + " ".join(f"{r}x{c}" for r, c in SHAPES) + ")")
    parser.add_argument("--dtype", action="append", choices=DTYPES, help="repeat (default: both)")
    parser.add_argument("--setting", action="append", choices=sorted(SETTINGS),
                        help=f"repeat (default: {' '.join(DEFAULT_SETTINGS)}, and {' '.join(EXPLORE)} on "
                             f"{' '.join(f'{r}x{c}' for r, c in EXPLORE_SHAPES)} in {' '.join(EXPLORE_DTYPES)})")
    parser.add_argument("--all", action="store_true", help="every setting on every shape and dtype given")
    parser.add_argument("--no-check", action="store_true", help="skip the comparison with torch in float64")
    parser.add_argument("--graph", action="store_true",
                        help="time each call replayed from a CUDA graph (triton.testing.do_bench_cudagraph): the "
                             "kernels' time without the host's, which sets do_bench's for rows of 0.25-0.4 ms in "
                             "some rounds (NOTES v49)")
    parser.add_argument("--reduction", default="mean", choices=("mean", "sum", "none"),
                        help="the loss's reduction ('none': the backward takes a ones gradient)")
    parser.add_argument("--weight", action="store_true", help="class weights (uniform in [0.5, 1.5])")
    parser.add_argument("--label-smoothing", type=float, default=0.0)
    parser.add_argument("--z-loss", type=float, default=0.0)
    parser.add_argument("--softcap", type=float, default=None)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)

    import torch
    import triton.testing

    import portable_softmax

    device = torch.device("cuda")
    rows: list[dict[str, Any]] = []
    failed = False
    print(f"cross_entropy sweep on {torch.cuda.get_device_name(device)} (torch {torch.__version__}); fraction of "
          f"the copy floor (fwd+bwd: 2NVb, fwd: NVb); reduction={args.reduction!r}; options "
          f"{dict(weight=args.weight, label_smoothing=args.label_smoothing, z_loss=args.z_loss, softcap=args.softcap)}; "
          f"errors against torch in float64")
    print(f"{'dtype':9s} {'N x V':>13s} {'setting':18s} {'fwd+bwd ms':>10s} {'floor':>6s} {'fwd ms':>8s} "
          f"{'floor':>6s} {'loss err':>9s} {'grad err':>9s}  plans", flush=True)
    runs = _runs(args)
    groups = list(dict.fromkeys((dtype, shape) for dtype, shape, _ in runs))
    for dtype_name, (n_rows, n_cols) in groups:
        dtype = getattr(torch, dtype_name)
        torch.manual_seed(0)
        x0 = (torch.randn(n_rows, n_cols, device=device) * 2).to(dtype)
        target = torch.randint(0, n_cols, (n_rows,), device=device)
        target[::IGNORED_EVERY] = -100
        x = x0.clone().requires_grad_()
        # The backward's incoming gradient: none for a reduced loss, ones for each row's ('none').
        incoming = torch.ones(n_rows, device=device, dtype=dtype) if args.reduction == "none" else None
        options: dict[str, Any] = {k: v for k, v in (("label_smoothing", args.label_smoothing),
                                                     ("z_loss", args.z_loss), ("softcap", args.softcap)) if v}
        if args.weight:
            options["weight"] = torch.rand(n_cols, device=device) + 0.5
        copy_ms = [triton.testing.do_bench(lambda: x0.clone(), return_mode="median")]
        shape_rows = []
        for _, _, name in (run for run in runs if run[:2] == (dtype_name, (n_rows, n_cols))):
            _apply(SETTINGS[name], device)
            row: dict[str, Any] = {"dtype": dtype_name, "N": n_rows, "V": n_cols, "setting": name,
                                   "reduction": args.reduction,
                                   **{k: sorted(v) if isinstance(v, frozenset) else v
                                      for k, v in SETTINGS[name].items()}}
            try:
                if not args.no_check:
                    row["loss_err"], row["grad_err"] = _check(x0, target, args.reduction, options)
                    if not max(row["loss_err"], row["grad_err"]) <= TOLERANCE[dtype_name]:
                        failed = True

                def step() -> None:
                    x.grad = None
                    portable_softmax.cross_entropy(x, target, reduction=args.reduction, **options).backward(incoming)

                def forward() -> None:
                    with torch.no_grad():
                        portable_softmax.cross_entropy(x0, target, reduction=args.reduction, **options)

                if args.graph:
                    row["fwdbwd_ms"] = triton.testing.do_bench_cudagraph(step, return_mode="median")
                    row["fwd_ms"] = triton.testing.do_bench_cudagraph(forward, return_mode="median")
                else:
                    row["fwdbwd_ms"] = triton.testing.do_bench(step, return_mode="median")
                    row["fwd_ms"] = triton.testing.do_bench(forward, return_mode="median")
                row["plans"] = _plans(n_cols)
            except Exception as error:  # a setting that fails to compile or launch is reported
                row["error"] = " ".join(repr(error).split())[:200]
                failed = True
            shape_rows.append(row)
        _apply({}, device)
        copy_ms.append(triton.testing.do_bench(lambda: x0.clone(), return_mode="median"))
        for row in shape_rows:
            row["copy_ms"] = min(copy_ms)
            label = f"{dtype_name:9s} {n_rows:>6d}x{n_cols:<6d} {row['setting']:18s}"
            if "error" in row:
                print(f"{label} {row['error']}")
                continue
            row["of_floor"] = row["copy_ms"] / row["fwdbwd_ms"]
            row["fwd_of_floor"] = row["copy_ms"] / 2 / row["fwd_ms"]
            errors = (f"{row['loss_err']:9.1e} {row['grad_err']:9.1e}" if "loss_err" in row
                      else f"{'':9s} {'':9s}")
            print(f"{label} {row['fwdbwd_ms']:10.3f} {row['of_floor']:6.2f} {row['fwd_ms']:8.3f} "
                  f"{row['fwd_of_floor']:6.2f} {errors}  {row['plans']}", flush=True)
        rows += shape_rows
        del x, x0
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)
    if failed:
        print("FAILED: a setting errored or was off torch's float64 beyond tolerance", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
