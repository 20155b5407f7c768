"""The ``portable-softmax`` command.

    portable-softmax                    the main job: device record, plans, correctness, timing
    portable-softmax info [--json]      the present device's normalized record
    portable-softmax plan --profile NAME --shape MxN --dtype DTYPE [--backward] [--json]
    portable-softmax bench [--M M --N N] [--dtype ...] [--backward] [--peers ...] [--cases rows|real|fused|loss|head|all]
    portable-softmax compile --target cuda:90 --target hip:gfx942 [--json]
    portable-softmax warmup --shape 4096x50257 --dtype bfloat16 [--backward] [--loss] [--profile NAME]
    portable-softmax validate [--out DIR] [--no-bench]

Global options (before or after the command): --device DEV, -v/--verbose.
"""
from __future__ import annotations

import argparse
import functools
import importlib
import json
import logging
import os
import sys
from typing import NoReturn, Optional, Sequence

import torch

from portable_softmax.device import device_record
from portable_softmax.planner import DTYPE_BYTES, contiguous_align
from portable_softmax.targets import plan_launch
from portable_softmax.arguments import parse_shape
from portable_softmax.profiles import profile_names, profile_record

PROG = "portable-softmax"
logger = logging.getLogger(__name__)


def parse_device(text: str) -> str:
    """``--device``: a torch device that this torch has and can see, else a usage error (asking
    torch for a device it was built without ends in an AssertionError deep inside torch)."""
    if text.strip().lower().split(":")[0] == "npu" and getattr(torch, "npu", None) is None:
        # torch knows 'npu' only once torch_npu is imported (torch's device-backend autoload
        # usually does that); try it ourselves.
        try:
            importlib.import_module("torch_npu")
        except ImportError:
            raise argparse.ArgumentTypeError(
                f"device {text!r}: torch_npu is not installed (install the torch_npu release made for "
                f"torch {torch.__version__})") from None
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"unknown device {text!r}: expected cpu, cuda[:N], npu[:N] or a "
                                         f"plugin's device type") from None
    if device.type == "cpu":
        return text
    module = getattr(torch, device.type, None)
    if module is None:
        hint = " (ROCm builds of torch name their GPUs 'cuda')" if device.type == "hip" else ""
        raise argparse.ArgumentTypeError(f"device {text!r}: torch {torch.__version__} has no {device.type!r} "
                                         f"devices{hint}")
    # A plugin's device module need not have these (docs/design.md: Adding a backend).
    if hasattr(module, "is_available") and not module.is_available():
        built = device.type != "cuda" or torch.version.cuda is not None or torch.version.hip is not None
        why = "none is visible here" if built else "this torch was built without CUDA or ROCm"
        raise argparse.ArgumentTypeError(f"device {text!r}: no {device.type} device ({why}; torch {torch.__version__})")
    count = module.device_count() if hasattr(module, "device_count") else None
    if count is not None and device.index is not None and device.index >= count:
        raise argparse.ArgumentTypeError(f"device {text!r}: there are {count} {device.type} device(s) here "
                                         f"({device.type}:0 to {device.type}:{count - 1})")
    return text


def _cmd_check(args: argparse.Namespace) -> int:
    from portable_softmax import selfcheck

    return 0 if selfcheck.run(args.device) else 1


def _cmd_validate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from portable_softmax import validate

    out = Path(args.out)
    passed = validate.run(args.device, out, benchmark=not args.no_bench)
    print((out / "report.md").read_text())
    written = [name for name in ("report.md", "report.json", "bandwidth.png") if (out / name).exists()]
    print(f"wrote {', '.join(written)} in {out.resolve()}")
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
    # The launches the package itself refuses there (op_arguments._validate) have no plan to show.
    if args.dtype == "float64" and not record.supports_fp64:
        raise ValueError(f"float64 is not supported on {record.name} (backend {record.backend!r}): "
                         f"plan float32, float16 or bfloat16")
    if args.dtype == "bfloat16" and not record.supports_bf16:
        raise ValueError(f"bfloat16 is not supported on {record.name} ({record.arch}): plan float32 or float16")
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


class _Parser(argparse.ArgumentParser):
    """An argument parser whose mistakes end in one line, ``portable-softmax: error: ...`` (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: error: {message} (see `{self.prog} --help`)\n")


def _global_options(in_command: bool) -> argparse.ArgumentParser:
    """The options every command takes, before or after its name. After it they default to
    SUPPRESS, so that a command without them keeps what was given before its name."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS if in_command else False,
                         help="log launch decisions (and show the traceback of an internal error)")
    options.add_argument("--device", type=parse_device, default=argparse.SUPPRESS if in_command else None,
                         help="torch device (default: the current accelerator, else cpu)")
    return options


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                     parents=[_global_options(in_command=False)])
    parser.set_defaults(func=_cmd_check)
    commands = parser.add_subparsers(dest="command")
    common = [_global_options(in_command=True)]

    check = commands.add_parser("check", help="the main job (also the default)", parents=common)
    check.set_defaults(func=_cmd_check)

    info = commands.add_parser("info", help="print the present device's normalized record", parents=common)
    info.add_argument("--json", action="store_true")
    info.set_defaults(func=_cmd_info)

    plan = commands.add_parser("plan", help="print the launch plan for a shape on a recorded chip or this device",
                               parents=common)
    plan.add_argument("--profile", choices=profile_names(), help="a recorded chip (default: the present device)")
    plan.add_argument("--shape", type=parse_shape, required=True, help="rows x columns, e.g. 4096x50257")
    plan.add_argument("--dtype", default="float32", choices=sorted(DTYPE_BYTES))
    plan.add_argument("--backward", action="store_true")
    plan.add_argument("--json", action="store_true")
    plan.set_defaults(func=_cmd_plan)

    validate = commands.add_parser("validate", help="conformance + short benchmark report for a vendor (JSON, Markdown, PNG)",
                                   parents=common)
    validate.add_argument("--out", default="validate-report", help="report folder")
    validate.add_argument("--no-bench", action="store_true", help="skip the benchmark")
    validate.set_defaults(func=_cmd_validate)

    bench = commands.add_parser("bench", help="bandwidth vs x.clone() for us and the peers (GPU)", parents=common)
    bench.add_argument("--M", type=int, help="rows (with --N: one shape instead of the sweep)")
    bench.add_argument("--N", type=int, help="columns")
    bench.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float16", "float32"])
    bench.add_argument("--backward", action="store_true", help="also time the backward kernels")
    bench.add_argument("--cases", choices=["rows", "real", "fused", "loss", "head", "all"], default="rows",
                       help="rows: 2-D rows (default); real: calls as models make them (attention scores, NCHW "
                            "channels, a column, a transposed input, sliced vocabulary rows, router rows, and the "
                            "fused calls: a padding mask with a scale, causal attention, a per-row temperature), "
                            "forward, backward op and backward through autograd; fused: those fused calls alone; "
                            "loss: cross_entropy forward+backward and forward of (tokens, vocabulary) logits (add "
                            "quack to --peers where it runs, and inplace for ours with inplace_backward); head: "
                            "linear_cross_entropy, the LLM head and its loss forward+backward, bfloat16 (peers: torch "
                            "compile liger cce quack); all: rows, then real. "
                            "--dtype picks the real cases "
                            "of those dtypes")
    bench.add_argument("--small", action="store_true",
                       help="with --cases real, loss or head: the cases' small stand-in shapes timed by the host's clock (runs on "
                            "a CPU through Triton's interpreter; a check, not a measurement)")
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
                                                   "without a GPU; report registers, spills, shared memory",
                                       parents=common)
    crosscompile.add_arguments(compile_)
    compile_.set_defaults(func=crosscompile.run_command, check_values=functools.partial(_check_compile, compile_))

    from portable_softmax import warmup

    warm = commands.add_parser("warmup", help="compile ahead of time what calls of given shapes and dtypes launch "
                                              "(into Triton's cache); on the interpreter or --profile, plan only",
                               parents=common)
    warmup.add_arguments(warm)
    warm.set_defaults(func=warmup.run_command)
    return parser


def _check_compile(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What ``compile``'s option types (declared with its code) let through: a timeout of 0 s or
    less would time every compile out at once, no jobs would compile nothing."""
    if not args.timeout > 0:
        parser.error(f"argument --timeout: expected a positive number of seconds, got {args.timeout:g}")
    if args.jobs < 1:
        parser.error(f"argument --jobs: expected 1 or more, got {args.jobs}")


def _quiet_stdout() -> None:
    """Point stdout at the null device: Python flushes it again at exit, which would raise once
    more into a closed pipe (the recipe of Python's ``signal`` documentation)."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # a stdout without a file descriptor (captured, in tests)
        pass


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The ``portable-softmax`` command; returns its exit status (argument mistakes exit 2)."""
    args = build_parser().parse_args(argv)
    if getattr(args, "check_values", None) is not None:
        args.check_values(args)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    try:
        status = args.func(args)
        sys.stdout.flush()  # here, where a closed pipe is answered below, not at exit
        return status
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader left (`portable-softmax plan ... | head`): stop quietly, with the status of a
        # tool that SIGPIPE ended (128 + 13).
        _quiet_stdout()
        return 141
    except (ValueError, TypeError, RuntimeError, OSError) as error:
        logger.debug("traceback", exc_info=True)
        print(f"{PROG}: error: {_one_line(error)}", file=sys.stderr)
        return 2
    except Exception as error:  # a bug: still one line, the traceback with -v
        logger.debug("traceback", exc_info=True)
        print(f"{PROG}: internal error: {type(error).__name__}: {_one_line(error)} (run with -v for the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
