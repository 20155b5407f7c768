"""``portable-softmax warmup``: compile ahead of time what calls of given shapes and dtypes will
launch, so that a container image can carry Triton's cache (``TRITON_CACHE_DIR``) and a process's
first call of them compiles nothing.

On a GPU each call runs once, on tensors of its shape: what its first call compiles, it compiles
(``launch_plan``: one binary per kernel launched), into the cache Triton writes. On Triton's
interpreter (a CPU), or for a recorded chip (``--profile``), nothing is compiled: each call is
planned, and the kernels it would compile are listed, with whether the target's table of known
resources (``kernel_resources``) holds them.

    portable-softmax warmup --shape 4096x50257 --dtype bfloat16 --backward --loss
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch

from portable_softmax import launch_plan, row_layout, variants
from portable_softmax.arguments import parse_tensor_shape
from portable_softmax.device import backend_for, device_record
from portable_softmax.kernel_resources import ResourceTable, table_for
from portable_softmax.launch_plan import RowView, Variant
from portable_softmax.loss_planner import plan_elementwise, plan_stats, plan_sum
from portable_softmax.plan_grid import LaunchPlan, Target
from portable_softmax.planner import DTYPE_BYTES, call_windows
from portable_softmax.profiles import profile_names, profile_record
from portable_softmax.record import KernelResources
from portable_softmax.targets import target_for

FUNCTIONS = ("softmax", "log_softmax", "cross_entropy")


@dataclass(frozen=True)
class WarmupCall:
    """One call to warm up: ``function`` of a contiguous tensor of ``shape`` and ``dtype`` over
    ``dim`` (cross_entropy: logits (N, C) against class targets), and its backward."""

    function: str
    shape: tuple[int, ...]
    dtype: str
    dim: int
    backward: bool

    def label(self) -> str:
        over = "" if self.function == "cross_entropy" else f" dim {self.dim}"
        return (f"{self.function} {'x'.join(map(str, self.shape))} {self.dtype}{over}"
                f"{' forward+backward' if self.backward else ' forward'}")


def warmup_calls(shapes: Iterable[tuple[int, ...]], dtypes: Iterable[str], dims: Iterable[int], *, log: bool,
                 backward: bool, loss: bool) -> list[WarmupCall]:
    """The calls of every shape, dtype and dim: softmax (and log_softmax with ``log``); with
    ``loss`` the cross-entropy of each 2-D shape as (positions, classes); each with its backward
    where ``backward``.

    Raises:
        ValueError: a dim out of range for a shape, or ``loss`` with no 2-D shape.
    """
    shapes, dtypes, dims = list(shapes), list(dtypes), list(dims)
    functions = ["softmax", "log_softmax"] if log else ["softmax"]
    calls = []
    for shape in shapes:
        for dim in dims:
            if not -len(shape) <= dim < len(shape):
                raise ValueError(f"--dim {dim} is out of range for the shape {'x'.join(map(str, shape))} "
                                 f"(expected {-len(shape)} to {len(shape) - 1})")
        calls += [WarmupCall(function, tuple(shape), dtype, dim, backward)
                  for dtype in dtypes for dim in dims for function in functions]
    if loss:
        logits = [shape for shape in shapes if len(shape) == 2]
        if not logits:
            raise ValueError("--loss needs a 2-D --shape (positions x classes), e.g. 4096x50257")
        calls += [WarmupCall("cross_entropy", tuple(shape), dtype, 1, backward) for shape in logits for dtype in dtypes]
    return calls


@dataclass(frozen=True)
class PlannedLaunch:
    """One launch of a planned call: what it is, its plan, and the kernels it compiles, each with
    where its plan's resources came from (``IN_TABLE``, ``NEAR``, ``ESTIMATED``, ``UNSIZED``)."""

    what: str
    plan: LaunchPlan
    kernels: tuple[tuple[str, str], ...]


IN_TABLE = "in the table"
# A variant without a row of its own, sized from a near one (``ResourceTable.nearest``: another
# form, shape or chunk count of the same kernel, block and options); its first call checks it.
NEAR = "from a near row"
ESTIMATED = "estimated"
# Kernels whose grid is not sized from their resources (a sliced plan's two phases, the loss's
# stats and gradient scale): compiled at their first launch.
UNSIZED = "not sized from resources"


def plan_call(target: Target, table: Optional[ResourceTable], call: WarmupCall) -> list[PlannedLaunch]:
    """The launches of ``call`` on ``target`` and the kernels each compiles, planned from the
    table's rows (estimated where it has none; ``table`` None: the interpreter, which compiles
    nothing and reports no resources). Compiles nothing."""
    dtype = getattr(torch, call.dtype)
    size = DTYPE_BYTES[call.dtype]
    wide = call.dtype == "float64"
    if call.function == "cross_entropy":
        rows, classes = call.shape
        per_position = (0, 1 if rows > 1 else 0, 0)
        strides = tuple((0, classes if rows > 1 else 0, 1) if name in ("x", "grad") else per_position
                        for name in variants.loss_row_tensors("forward"))
        # Windows over the logits and the gradient, as loss_launch reads them for a split row.
        align, shifted = call_windows(1, rows, classes, [strides[0], strides[-1]], [size, size], True)
        # The default 'mean': with the gradient, its count and its sum by the forward's grid where
        # it can.
        facts = variants.LossFacts(acc_fp64=wide, write_grad=call.backward,
                                   wait_atomic=target.tuning.split_wait_atomic, shifted=shifted,
                                   counted=call.backward, summed=call.backward)
        loss = launch_plan.LossCall("forward", RowView(1, rows, classes, strides), facts, (-100,), size, True, align,
                                    target.record.cooperative_launch)
        known = _known(target, table, call.dtype, loss.writes_gradient, size)
        plan, chosen = launch_plan.plan_cross_entropy(target, loss, known, known)
        # With the gradient, the denominators of the default 'mean' first, one program
        # (``loss_reduction.stats``), unless the forward's grid counts them (``variants.loss_counts``);
        # the forward alone divides by them after it, in the sum's program (``loss_reduction.counted_mean``).
        stats = call.backward and not (variants.loss_counts(plan.config, facts)
                                       and variants.grid_count_fits(rows, plan.programs))
        found = [PlannedLaunch("stats", plan_stats(target, variants.STATS_BLOCK), ((variants.STATS_KERNEL, UNSIZED),))
                 ] if stats else []
        found += [PlannedLaunch("forward", plan, _kernels(table, call.dtype, chosen) * len(variants.launch_phases(
                      plan.config)))]
        if not variants.loss_sums(plan.config, facts):
            # The 'mean' from the forward's terms (``loss_reduction.reduced``): one program.
            found.append(PlannedLaunch("loss sum", plan_sum(target, variants.SUM_BLOCK, wide, not call.backward),
                                       ((variants.SUM_KERNEL, UNSIZED),)))
        if call.backward:
            scale = plan_elementwise(target, rows * classes, variants.GRAD_SCALE_BLOCK)
            found.append(PlannedLaunch("gradient scale", scale, ((variants.GRAD_SCALE_KERNEL, UNSIZED),)))
        return found
    directions = ("forward", "backward") if call.backward else ("forward",)
    found = []
    for direction in directions:
        tensors = [torch.empty(call.shape, dtype=dtype, device="meta") for _ in variants.TENSORS[direction]]
        view = _row_view(call.shape, call.dim, tensors)
        known = _known(target, table, call.dtype, direction == "backward", size * (len(tensors) - 1))
        softmax = launch_plan.softmax_call(target, direction, view, [size] * len(tensors), True,
                                           call.function == "log_softmax", wide)
        plan, chosen = launch_plan.plan_softmax(target, softmax, known, known)
        if plan.regime == variants.SLICED:
            kernels = tuple((variants.sharded_kernel_name(phase), UNSIZED) for phase in variants.phases(direction))
        else:
            kernels = _kernels(table, call.dtype, chosen) * len(variants.launch_phases(plan.config))
        found.append(PlannedLaunch(direction, plan, kernels))
    return found


def _row_view(shape: tuple[int, ...], dim: int, tensors: Sequence[torch.Tensor]) -> RowView:
    view = row_layout.row_view(shape, dim % len(shape), *tensors)
    assert view is not None  # contiguous tensors always have one
    return view


def _known(target: Target, table: Optional[ResourceTable], dtype: str, backward: bool,
           input_bytes: int) -> Callable[[Variant], KernelResources]:
    if table is None:
        return lambda variant: KernelResources(0, 0, variant.option_values["num_warps"])
    return launch_plan.known_resources(target, table, dtype, backward, input_bytes)


def _kernels(table: Optional[ResourceTable], dtype: str, chosen: Sequence[Variant]) -> tuple[tuple[str, str], ...]:
    def source(variant: Variant) -> str:
        key = variant.key(dtype)
        if table is None:
            return ESTIMATED
        return IN_TABLE if table.get(key) is not None else NEAR if table.nearest(key) is not None else ESTIMATED
    return tuple((variant.kernel, source(variant)) for variant in chosen)


def triton_cache_dir() -> str:
    """The folder Triton writes compiled kernels to (``TRITON_CACHE_DIR``, else its default)."""
    try:
        from triton import knobs

        return knobs.cache.dir
    except (ImportError, AttributeError):  # Triton before 3.4
        from triton.runtime.cache import default_cache_dir

        return os.environ.get("TRITON_CACHE_DIR") or default_cache_dir()


def compiled_kernels(folder: str) -> int:
    """The kernels compiled into a Triton cache folder: one group file each."""
    if not os.path.isdir(folder):
        return 0
    return sum(name.startswith("__grp__") for _, _, names in os.walk(folder) for name in names)


def run_call(call: WarmupCall, device: torch.device) -> None:
    """Make ``call`` once on ``device`` (its first call: what it compiles is compiled), and wait
    for it."""
    import portable_softmax as ps

    x = torch.empty(call.shape, dtype=getattr(torch, call.dtype), device=device).normal_()
    x.requires_grad_(call.backward)
    if call.function == "cross_entropy":
        out = ps.cross_entropy(x, torch.zeros(call.shape[0], dtype=torch.int64, device=device))
    else:
        out = (ps.log_softmax if call.function == "log_softmax" else ps.softmax)(x, call.dim)
    if call.backward:
        out.backward(torch.ones_like(out))
    getattr(torch, device.type).synchronize()


def _progress(items: Sequence[WarmupCall], show: bool) -> Iterable[WarmupCall]:
    """``items`` under tqdm's bar where tqdm is installed, else with a line on stderr each."""
    if not show:
        return items
    try:
        from tqdm import tqdm

        return tqdm(items, file=sys.stderr, unit="call", desc="warmup")
    except ImportError:
        def lines() -> Iterable[WarmupCall]:
            for index, item in enumerate(items, 1):
                print(f"warmup [{index}/{len(items)}] {item.label()}", file=sys.stderr, flush=True)
                yield item
        return lines()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shape", type=parse_tensor_shape, action="append", required=True,
                        help="a tensor's shape, e.g. 4096x50257 or 8x16x1024x1024; repeat for several")
    parser.add_argument("--dtype", action="append", choices=sorted(DTYPE_BYTES),
                        help="repeat for several (default: bfloat16)")
    parser.add_argument("--dim", type=int, action="append", help="the softmax dimension; repeat for several "
                                                                 "(default: -1)")
    parser.add_argument("--log", action="store_true", help="also log_softmax")
    parser.add_argument("--backward", action="store_true", help="also each call's backward")
    parser.add_argument("--loss", action="store_true",
                        help="also cross_entropy of each 2-D shape as (positions, classes)")
    parser.add_argument("--profile", choices=profile_names(),
                        help="plan for a recorded chip instead: list what would compile, compile nothing")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--json", action="store_true")


def run_command(args: argparse.Namespace) -> int:
    """``portable-softmax warmup``: 0 when every call ran (or was planned)."""
    import triton

    calls = warmup_calls(args.shape, args.dtype or ["bfloat16"], args.dim or [-1], log=args.log,
                         backward=args.backward, loss=args.loss)
    show = not args.no_progress
    device = torch.device(args.device or _default_device())
    record = profile_record(args.profile) if args.profile else device_record(device)
    interpreted = args.profile is None and backend_for(device).interpreted
    if args.profile or interpreted:
        target = target_for(record)
        table = None if interpreted else table_for(record.backend, record.arch, triton.__version__)
        rows = [{"call": call.label(), "launches": [
                    {"what": p.what, "regime": p.plan.regime, "programs": p.plan.programs,
                     "kernels": [{"kernel": kernel, "resources": source} for kernel, source in p.kernels]}
                    for p in plan_call(target, table, call)]} for call in _progress(calls, show)]
        where = "Triton's interpreter: nothing to compile" if interpreted else (
            f"recorded profile {args.profile}, Triton {triton.__version__}: planned, nothing compiled")
        _print_plans(record.name, where, rows, args.json)
        return 0
    folder = triton_cache_dir()
    rows = []
    for call in _progress(calls, show):
        before, started = compiled_kernels(folder), time.perf_counter()
        run_call(call, device)
        rows.append({"call": call.label(), "seconds": round(time.perf_counter() - started, 3),
                     "compiled": compiled_kernels(folder) - before})
    if args.json:
        print(json.dumps({"device": record.name, "cache": folder, "calls": rows}, indent=2))
        return 0
    print(f"warmup on {record.name} ({device}), Triton {triton.__version__}, cache {folder}")
    for row in rows:
        print(f"  {row['call']:<52} {row['seconds']:>7.2f} s  {row['compiled']} kernel(s) compiled")
    print(f"{sum(r['compiled'] for r in rows)} kernels compiled in {sum(r['seconds'] for r in rows):.1f} s "
          f"into {folder}")
    return 0


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _print_plans(name: str, where: str, rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        print(json.dumps({"device": name, "note": where, "calls": rows}, indent=2))
        return
    print(f"warmup on {name} ({where})")
    for row in rows:
        for launch in row["launches"]:
            kernels = ", ".join(f"{k['kernel']} ({k['resources']})" for k in launch["kernels"])
            compiles = "nothing to compile" if where.startswith("Triton's interpreter") else (
                f"{len(launch['kernels'])} to compile: {kernels}")
            print(f"  {row['call']:<52} {launch['what']:<14} {launch['regime']:<6} {launch['programs']:>7} "
                  f"programs; {compiles}")
