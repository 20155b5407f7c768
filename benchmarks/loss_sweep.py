"""The cross-entropy's streamed (loop) regime under tuning overrides: forward + ``loss.backward()``
and forward alone, fraction of the copy floor, per shape, dtype and setting (issue 32).

    PYTHONPATH=. python3 benchmarks/loss_sweep.py            # every shape, dtype and setting
    PYTHONPATH=. python3 benchmarks/loss_sweep.py --check    # loss and gradient against torch in float64 first
    PYTHONPATH=. python3 benchmarks/loss_sweep.py --shape 8192x128256 --dtype bfloat16 --setting base --setting l2-off

A setting is a set of ``Tuning`` fields laid over the row in force for the device (through
``portable_softmax.tuning.TUNING``, keyed by the device's name so that it wins over every other
row): the chunk (``loop_chunk``), the warps (``loss_loop_warps``), the pipeline depth
(``loss_loop_stages``) and the L2-fit grid of the forward that writes the gradient
(``loss_l2_share``, 0 = off). Floor: ``x.clone()`` timed before and after each shape (the faster
kept), which reads and writes N·V·b: the floor of forward + backward (read the logits once,
write the gradient once); half of it the forward's. Times are ``triton.testing.do_bench``
medians. Targets uniform over the vocabulary, every seventh ignored (-100), as
``portable-softmax bench --cases loss``.

Nothing GPU-only is imported before ``main`` runs.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

SHAPES = [(8192, 32000), (8192, 128256), (4096, 256000)]
DTYPES = ["bfloat16", "float32"]
# name -> Tuning fields over the row in force. "base": the row in force, unchanged.
SETTINGS: dict[str, dict[str, Any]] = {
    "base": {},
    "l2-off": {"loss_l2_share": 0.0},
    "l2-0.5": {"loss_l2_share": 0.5},
    "l2-1.0": {"loss_l2_share": 1.0},
    **{f"c{chunk}-w{warps}": {"loop_chunk": chunk, "loss_loop_warps": warps}
       for chunk in (2048, 4096, 8192) for warps in (4, 8, 16)},
    **{f"c{chunk}-w{warps}-l2off": {"loop_chunk": chunk, "loss_loop_warps": warps, "loss_l2_share": 0.0}
       for chunk, warps in ((4096, 8), (8192, 8), (8192, 16))},
    "stages2": {"loss_loop_stages": 2},
    "stages3": {"loss_loop_stages": 3},
    "c8192-w16-stages2": {"loop_chunk": 8192, "loss_loop_warps": 16, "loss_loop_stages": 2},
}
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
    """The loop plans the last calls took for rows of ``n_cols``: direction, programs, warps,
    chunk, stages."""
    from portable_softmax import loss_launch

    found = []
    for key, record in loss_launch._records.items():
        if key[0] in ("forward", "backward") and key[2].n_cols == n_cols:
            plan = record.plan
            kind = f"{key[0]}{'+grad' if key[0] == 'forward' and key[1].write_grad else ''}"
            found.append(f"{kind}:{plan.regime} p{plan.programs} w{plan.num_warps} c{plan.block_n} "
                         f"s{plan.num_stages} occ{plan.occupancy}")
    return "; ".join(sorted(set(found)))


def _check(x, target) -> tuple[float, float]:
    """The loss's and the first rows' gradient's relative errors against torch in float64."""
    import torch
    import torch.nn.functional as F

    import portable_softmax

    leaf = x.detach().clone().requires_grad_()
    loss = portable_softmax.cross_entropy(leaf, target)
    loss.backward()
    expected = torch.zeros((), dtype=torch.float64, device=x.device)
    for start in range(0, x.shape[0], 1024):
        expected += F.cross_entropy(x[start:start + 1024].double(), target[start:start + 1024], reduction="sum")
    counted = (target != -100).sum()
    head = x[:CHECK_ROWS].detach().double().requires_grad_()
    (F.cross_entropy(head, target[:CHECK_ROWS], reduction="sum") / counted).backward()
    return _relative_error(loss.detach(), expected / counted), _relative_error(leaf.grad[:CHECK_ROWS], head.grad)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=_shape, action="append", help="tokens x vocabulary; repeat (default: "
                        + " ".join(f"{r}x{c}" for r, c in SHAPES) + ")")
    parser.add_argument("--dtype", action="append", choices=DTYPES, help="repeat (default: both)")
    parser.add_argument("--setting", action="append", choices=sorted(SETTINGS), help="repeat (default: all)")
    parser.add_argument("--check", action="store_true", help="compare loss and gradient with torch in float64 "
                        "under each setting before timing it")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)

    import torch
    import triton.testing

    import portable_softmax

    device = torch.device("cuda")
    names = args.setting or list(SETTINGS)
    rows: list[dict[str, Any]] = []
    failed = False
    print(f"cross_entropy loop sweep on {torch.cuda.get_device_name(device)} (torch {torch.__version__}); "
          f"fraction of the copy floor (fwd+bwd: 2NVb, fwd: NVb)")
    print(f"{'dtype':9s} {'N x V':>13s} {'setting':22s} {'fwd+bwd ms':>10s} {'floor':>6s} {'fwd ms':>8s} "
          f"{'floor':>6s} {'loss err':>9s} {'grad err':>9s}  plans")
    for dtype_name in args.dtype or DTYPES:
        dtype = getattr(torch, dtype_name)
        for n_rows, n_cols in args.shape or SHAPES:
            torch.manual_seed(0)
            x0 = (torch.randn(n_rows, n_cols, device=device) * 2).to(dtype)
            target = torch.randint(0, n_cols, (n_rows,), device=device)
            target[::IGNORED_EVERY] = -100
            x = x0.clone().requires_grad_()
            copy_ms = [triton.testing.do_bench(lambda: x0.clone(), return_mode="median")]
            shape_rows = []
            for name in names:
                _apply(SETTINGS[name], device)
                row: dict[str, Any] = {"dtype": dtype_name, "N": n_rows, "V": n_cols, "setting": name,
                                       **SETTINGS[name]}
                try:
                    if args.check:
                        row["loss_err"], row["grad_err"] = _check(x0, target)
                        if max(row["loss_err"], row["grad_err"]) > TOLERANCE[dtype_name]:
                            failed = True

                    def step() -> None:
                        x.grad = None
                        portable_softmax.cross_entropy(x, target).backward()

                    def forward() -> None:
                        with torch.no_grad():
                            portable_softmax.cross_entropy(x0, target)

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
                label = f"{dtype_name:9s} {n_rows:>6d}x{n_cols:<6d} {row['setting']:22s}"
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
