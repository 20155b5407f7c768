"""The ``portable-softmax`` command.

    portable-softmax                    the main job: device record, plans, correctness, timing
    portable-softmax info [--json]      the present device's normalized record
    portable-softmax plan --profile NAME --shape MxN --dtype DTYPE [--backward] [--json]
    portable-softmax bench [--M M --N N] [--dtype ...] [--backward] [--peers ...]
    portable-softmax compile --target cuda:90 --target hip:gfx942 [--json]
    portable-softmax [--device DEV] validate [--out DIR] [--no-bench]
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Optional, Sequence

from portable_softmax.device import device_record
from portable_softmax.planner import DTYPE_BYTES, contiguous_align, plan_launch
from portable_softmax.profiles import profile_names, profile_record


def parse_shape(text: str) -> tuple[int, int]:
    try:
        rows, cols = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a shape like 4096x50257, got {text!r}") from None
    if rows < 1 or cols < 1:
        raise argparse.ArgumentTypeError(f"shape {text!r} must be positive")
    return rows, cols


def _cmd_check(args: argparse.Namespace) -> int:
    from portable_softmax import selfcheck

    return 0 if selfcheck.run(args.device) else 1


def _cmd_validate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from portable_softmax import validate

    passed = validate.run(args.device, Path(args.out), benchmark=not args.no_bench)
    print(Path(args.out, "report.md").read_text())
    return 0 if passed else 1


def _cmd_bench(args: argparse.Namespace) -> int:
    from portable_softmax import bench

    return bench.main(args)


def _cmd_info(args: argparse.Namespace) -> int:
    record = device_record(args.device).to_dict()
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        for key, value in record.items():
            print(f"{key:>24}: {value}")
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    record = profile_record(args.profile) if args.profile else device_record(args.device)
    rows, cols = args.shape
    plan = plan_launch(record, rows, cols, args.dtype, backward=args.backward,
                       align=contiguous_align(rows, cols, DTYPE_BYTES[args.dtype]))
    if args.json:
        print(json.dumps({"device": record.to_dict(), "shape": [rows, cols], "dtype": args.dtype,
                          "backward": args.backward, **plan.to_dict()}, indent=2))
    else:
        print(f"{record.name} ({record.backend}, {record.arch}, {record.compute_units} units): "
              f"{rows}x{cols} {args.dtype} {'backward' if args.backward else 'forward'}")
        for key, value in plan.to_dict().items():
            print(f"{key:>18}: {value}")
        print("(registers estimated: pass through `portable-softmax compile` for a compiled kernel's counts)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="portable-softmax", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log launch decisions")
    parser.add_argument("--device", help="torch device (default: the current accelerator, else cpu)")
    parser.set_defaults(func=_cmd_check)
    commands = parser.add_subparsers(dest="command")

    check = commands.add_parser("check", help="the main job (also the default)")
    check.set_defaults(func=_cmd_check)

    info = commands.add_parser("info", help="print the present device's normalized record")
    info.add_argument("--json", action="store_true")
    info.set_defaults(func=_cmd_info)

    plan = commands.add_parser("plan", help="print the launch plan for a shape on a recorded chip or this device")
    plan.add_argument("--profile", choices=profile_names(), help="a recorded chip (default: the present device)")
    plan.add_argument("--shape", type=parse_shape, required=True, help="rows x columns, e.g. 4096x50257")
    plan.add_argument("--dtype", default="float32", choices=sorted(DTYPE_BYTES))
    plan.add_argument("--backward", action="store_true")
    plan.add_argument("--json", action="store_true")
    plan.set_defaults(func=_cmd_plan)

    validate = commands.add_parser("validate", help="conformance + short benchmark report for a vendor (JSON, Markdown, PNG)")
    validate.add_argument("--out", default="validate-report", help="report folder")
    validate.add_argument("--no-bench", action="store_true", help="skip the benchmark")
    validate.set_defaults(func=_cmd_validate)

    bench = commands.add_parser("bench", help="bandwidth vs x.clone() for us and the peers (GPU)")
    bench.add_argument("--M", type=int, help="rows (with --N: one shape instead of the sweep)")
    bench.add_argument("--N", type=int, help="columns")
    bench.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float16", "float32"])
    bench.add_argument("--backward", action="store_true", help="also time the backward kernels")
    bench.add_argument("--peers", nargs="+", default=["torch", "compile", "liger", "flaggems"],
                       help="implementations to time beside ours (those not importable are skipped)")
    bench.add_argument("--warmup", type=int, default=25, help="do_bench warm-up, milliseconds")
    bench.add_argument("--rep", "--iters", dest="rep", type=int, default=100, help="do_bench repetition, milliseconds")
    bench.add_argument("--profile-only", action="store_true", help="one forward call, for ncu")
    bench.add_argument("--eager", action="store_true",
                       help="microseconds per call back to back (forward, backward op, forward+grad through "
                            "autograd) instead of bandwidth")
    bench.add_argument("--calls", type=int, default=300, help="calls per timing with --eager")
    bench.add_argument("--out", default="bench-results", help="folder for the JSON and PNG")
    bench.add_argument("--no-progress", action="store_true")
    bench.set_defaults(func=_cmd_bench)

    from portable_softmax import crosscompile

    compile_ = commands.add_parser("compile", help="compile every kernel variant the plans use for GPU targets, "
                                                   "without a GPU; report registers, spills, shared memory")
    crosscompile.add_arguments(compile_)
    compile_.set_defaults(func=crosscompile.run_command)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    try:
        return args.func(args)
    except (ValueError, TypeError, RuntimeError) as error:
        print(f"portable-softmax: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
