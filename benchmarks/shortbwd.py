"""The backward of short rows (issue 34, item 9), on one GPU in one call: where its time goes.

For each case (rows x columns, dtype) the backward (dx from y and dy; 3 passes: read y and dy,
write dx) of ours, torch eager and FlagGems (when importable), checked against torch in float64,
then timed four ways:

* ``dev``: ``do_bench``'s median with the cache flushed between calls, as ``bench`` times; it hides
  up to the flush's time (~85 us on an H100) of host work a call;
* ``kernel``: the GPU kernels' own time per call, from the profiler (no launch gaps, no host);
* ``wall``: wall time per call of calls back to back, as an eager loop pays (the slower of the host
  and the GPU sets it);
* for the autograd path, ``fwd+bwd - fwd``: the wall time of a forward with ``autograd.grad`` less
  that of the forward alone.

Paths: the op (ours ``op_calls._backward``, our custom operator ``torch.ops.portable_softmax.
softmax_backward``, ``torch._softmax_backward_data``, FlagGems' ``softmax_backward``) and through
autograd (``torch.autograd.grad`` of a kept graph: ours ``portable_softmax.softmax``, torch's,
FlagGems' through ``flag_gems.use_gems``). Fractions of copy as ``bench`` counts them: 3 x the
tensor's bytes over the time, against a ``clone`` of as many elements (the faster of one timed
before and one after the case). The floor: 3 x bytes over a 1-GiB clone's bandwidth.

Then the host's share on a tiny (8, 781) tensor (wall per call back to back, where the GPU's part
is a few microseconds), each layer of the path; and a sweep of our backward's tuning
(``SHORTBWD_VARIANTS``, comma-separated names of ``VARIANTS``; the op, ``dev`` and ``kernel``, with
the plan each takes). Usage: python3 benchmarks/shortbwd.py [OUT_DIR]; ``SHORTBWD_CASES``
(``1823x781,...``) and ``SHORTBWD_DTYPES`` (``bfloat16,float32``) pick the cases; ``SHORTBWD_DEVICE=cpu``
runs it through Triton's interpreter with wall times only (a check of the script, not a measurement).
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any, Optional

import torch

import portable_softmax
from portable_softmax import op_calls, torch_ops, tuning
from portable_softmax.device import device_record
from portable_softmax.selfcheck import relative_error, tolerance

CASES = [(1823, 781), (32768, 256), (4096, 781), (8192, 1024)]
DTYPES = [torch.bfloat16, torch.float32]
TINY = (8, 781)

# Our backward's tuning, as rows over the backend's own (``Tuning``): short rows get 2 warps for a
# 1024-element tile (16 elements a thread, 32 values with y and dy); more warps each holding less
# (ept8, ept4), taller tiles (tile2k, tile4k), rows of 1024 read twice (rr1024: 4 warps, the second
# read from L2), no wave filling (nofill), held tiles not in the dense form (nodense). NOTES v33:
# masked tiles of one group without the group's integer division and 64-bit offsets (flat);
# FlagGems' tile shapes (fgshape: 4 warps a 1024-element tile, neither the register cap nor the
# taller tiles that ept8 took on the H100 from an estimate of the uncapped binary's registers, 48
# where it compiles to 32), and those in the flat form (fgshape_flat).
VARIANTS = {
    "base": {},
    "ept8": dict(elements_per_thread=8),
    "ept4": dict(elements_per_thread=4),
    "tile2k": dict(tile_elements=2048),
    "tile4k": dict(tile_elements=4096),
    "tile2k_ept8": dict(tile_elements=2048, elements_per_thread=8),
    "rr1024": dict(reread_cols={("backward", 4): frozenset({1024, 4096, 16384, 32768}),
                                ("backward", 8): frozenset({1024})}),
    "nofill": dict(tile_wave_fill=0.0),
    "nodense": dict(dense_tiles=frozenset({"forward"})),
    "flat": dict(flat_tiles=frozenset({"backward"})),
    "fgshape": dict(elements_per_thread=8, tile_fit_bytes=0, tile_wave_fill=0.0),
    "fgshape_flat": dict(elements_per_thread=8, tile_fit_bytes=0, tile_wave_fill=0.0,
                         flat_tiles=frozenset({"backward"})),
}
DEFAULT_VARIANTS = "base,ept8,ept4,rr1024"


DEVICE = os.environ.get("SHORTBWD_DEVICE", "cuda")
GPU = DEVICE != "cpu"


def _env_list(name: str, default: str) -> list[str]:
    return [word for word in os.environ.get(name, default).split(",") if word]


def synchronize() -> None:
    if GPU:
        torch.cuda.synchronize()


def dev_us(fn: Callable[[], Any]) -> float:
    """``do_bench``'s median, microseconds (device events, the cache flushed between calls); on
    the CPU a few calls' wall time."""
    if not GPU:
        return wall_us(fn, calls=2, repeats=1)
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def wall_us(fn: Callable[[], Any], calls: int = 200, repeats: int = 3) -> float:
    """Wall microseconds per call, ``calls`` back to back between synchronizes; the least of
    ``repeats`` (others' work on the host only ever adds). On the CPU (the interpreter: tens of
    milliseconds a call) two calls, once."""
    if not GPU:
        calls, repeats = 2, 1
    best = float("inf")
    for _ in range(repeats):
        for _ in range(10 if GPU else 1):
            fn()
        synchronize()
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        synchronize()
        best = min(best, (time.perf_counter() - started) / calls * 1e6)
    return best


def kernel_us(fn: Callable[[], Any], calls: int = 30) -> tuple[Optional[float], str]:
    """The GPU kernels' time per call (profiler), and their names; None where the profiler fails."""
    if not GPU:
        return None, ""
    try:
        from torch.profiler import ProfilerActivity, profile

        for _ in range(5):
            fn()
        synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            synchronize()
        total, names = 0.0, {}
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                duration = getattr(event, "device_time", None) or event.cuda_time
                total += duration
                names[event.name[:40]] = names.get(event.name[:40], 0) + 1
        return total / calls, "; ".join(f"{name} x{count // calls}" for name, count in names.items())
    except Exception as error:  # noqa: BLE001 (a profiler that does not start is reported, not fatal)
        return None, f"profiler: {type(error).__name__}: {str(error)[:80]}"


def poisoned(fn: Callable[[], torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """``fn()`` after a block of ``like``'s size was filled with NaN and freed: the caching
    allocator hands it to the next allocation of that size, so an element the op leaves unwritten
    shows as NaN rather than as a value an earlier call left there."""
    block = torch.full_like(like, float("nan"))
    del block
    return fn()


def _flaggems() -> Optional[Any]:
    try:
        import importlib

        # The module, not the function of the same name that flag_gems.ops re-exports.
        return importlib.import_module("flag_gems.ops.softmax")
    except Exception as error:  # noqa: BLE001 (an absent or broken peer is a result)
        print(f"flaggems unavailable: {type(error).__name__}: {error}")
        return None


def _gems_config(gems: Any, case: Optional[Case] = None) -> str:
    """The configuration FlagGems' autotuner chose for its backward (for ``case``'s shape and dtype;
    else the latest), as far as its wrappers show it."""
    found = getattr(gems, "softmax_backward_kernel_inner", None)
    for _ in range(4):
        cache = getattr(found, "cache", None)
        if isinstance(cache, dict) and cache:
            entries = [(key, config) for key, config in cache.items()
                       if case is None or (tuple(key[:2]) == case.shape and str(case.dtype) in key)]
            key, config = (entries or list(cache.items()))[-1]
            return f"{key}: {config}"[:120]
        found = getattr(found, "fn", None)
    return "?"


def _record(y: torch.Tensor, dy: torch.Tensor) -> Any:
    """Our backward's launch record for these tensors (found as ``op_calls._backward`` keys it), or None."""
    key = (y.shape, y.stride(), dy.stride(), y.dtype, dy.dtype, y.device, y.dim() - 1, y.dtype, False,
           y.data_ptr() % 16 == 0, dy.data_ptr() % 16 == 0, op_calls._overrides())
    return getattr(getattr(op_calls._backward_calls.get(key), "__self__", None), "record", None)


def _plan(y: torch.Tensor, dy: torch.Tensor) -> str:
    """The plan of our backward's record for these tensors."""
    record = _record(y, dy)
    plan = getattr(record, "plan", None)
    if plan is None:
        return "?"
    cap = getattr(record, "options", {}).get("maxnreg")
    return (f"{plan.regime} {plan.block_m}x{plan.block_n} w{plan.num_warps} P{plan.programs} occ{plan.occupancy}"
            + (" dense" if plan.dense else "") + (" flat" if plan.flat else "") + (" reread" if plan.reread else "")
            + (f" cap{cap}" if cap else ""))


class Case:
    """One problem's tensors, reference and copy timings."""

    def __init__(self, rows: int, cols: int, dtype: torch.dtype) -> None:
        self.shape, self.dtype = (rows, cols), dtype
        x = torch.randn(self.shape, device=DEVICE, dtype=torch.float32) * 3
        self.x = x.to(dtype)
        self.y = torch.softmax(self.x.float(), -1).to(dtype)
        self.dy = torch.randn(self.shape, device=DEVICE).to(dtype)
        y64, dy64 = self.y.double(), self.dy.double()
        self.reference = y64 * (dy64 - (dy64 * y64).sum(-1, keepdim=True))
        self.torch_error = relative_error(torch._softmax_backward_data(self.dy, self.y, -1, dtype), self.reference)
        self.bytes = self.y.numel() * self.y.element_size()
        self._dense = torch.randn(self.shape, device=DEVICE).to(dtype)
        self.copy_us = [dev_us(lambda: self._dense.clone())]
        self.copy_wall_us = wall_us(lambda: self._dense.clone())

    def finish(self) -> None:
        self.copy_us.append(dev_us(lambda: self._dense.clone()))
        del self._dense

    def fraction(self, us: Optional[float]) -> Optional[float]:
        """3 passes over the tensor against a clone (2 passes) of it, as ``bench`` counts."""
        return None if not us else 3 * self.bytes / us / (2 * self.bytes / min(self.copy_us))

    def check(self, result: torch.Tensor) -> tuple[float, bool]:
        error = relative_error(result, self.reference)
        return error, error <= tolerance(self.dtype, self.torch_error)


def op_paths(gems: Optional[Any]) -> dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    paths = {
        "torch": lambda y, dy: torch._softmax_backward_data(dy, y, -1, y.dtype),
        "ours": lambda y, dy: op_calls._backward(y, dy, y.dim() - 1, y.dtype, False),
    }
    if torch_ops.AVAILABLE:
        paths["ours:custom_op"] = lambda y, dy: torch_ops.softmax_backward(y, dy, y.dim() - 1, False, y.dtype)
    if gems is not None:
        paths["flaggems"] = lambda y, dy: gems.softmax_backward(dy, y, -1, y.dtype)
    return paths


class _Gems:
    """FlagGems' softmax and its backward registered for aten while held (``flag_gems.use_gems``)."""

    def __init__(self) -> None:
        import flag_gems

        self._context = flag_gems.use_gems(include=["softmax", "softmax_backward"])

    def __enter__(self) -> None:
        import flag_gems

        self._context.__enter__()
        registered = set(flag_gems.all_registered_ops())
        if not {"softmax", "softmax_backward"} <= registered:
            # use_gems only warns where it registers nothing: torch's kernels would be timed.
            self._context.__exit__(None, None, None)
            raise RuntimeError(f"flag_gems.use_gems registered {sorted(registered)}, not softmax and its backward")

    def __exit__(self, *exc: Any) -> None:
        self._context.__exit__(*exc)


def autograd_paths() -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Forward functions whose backward autograd runs: torch's and ours. FlagGems' (torch's
    through ``use_gems``) run after every other path (``gems_autograd``)."""
    return {"torch": lambda t: torch.softmax(t, -1), "ours": lambda t: portable_softmax.softmax(t, -1)}


def _autograd_row(case: Case, name: str, forward: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, Any]:
    row: dict[str, Any] = {"path": "autograd", "impl": name}
    try:
        leaf = case.x.detach().requires_grad_()
        kept = forward(leaf)
        grad = lambda: torch.autograd.grad(kept, leaf, case.dy, retain_graph=True)[0]  # noqa: E731
        error, ok = case.check(poisoned(grad, case.y))
        row["err"] = error
        if not ok:
            row["wrong"] = f"relative error {error:.2e} (torch's {case.torch_error:.2e})"
            return row
        row["dev_us"] = dev_us(grad)
        row["kernel_us"], row["kernels"] = kernel_us(grad)
        row["wall_us"] = wall_us(grad)
        both = wall_us(lambda: torch.autograd.grad(forward(leaf), leaf, case.dy))
        alone = wall_us(lambda: forward(leaf))
        row["fwd_bwd_wall_us"], row["fwd_wall_us"] = both, alone
        row["bwd_of_train_us"] = both - alone
    except Exception as error:  # noqa: BLE001 (a peer failing on a case is a result)
        row["error"] = f"{type(error).__name__}: {str(error)[:160]}"
    return row


def gems_autograd(cases: list[Case], results: dict[str, Any], gems: Optional[Any] = None) -> None:
    """FlagGems through autograd: torch's softmax with FlagGems' kernels registered for aten
    (``flag_gems.use_gems``), for every case and on the host table's tensor. Run last, in one
    context: FlagGems 5.0.2 destroys its registrations on leaving only where ``torch.__version__
    >= "2.5"`` as strings ("2.11" is not), so they may outlive it, and every torch path after
    would time FlagGems. ``gems``: its softmax module, whose autotuner's choice each row names."""
    try:
        context = _Gems()
        context.__enter__()
    except Exception as error:  # noqa: BLE001
        print(f"flaggems through autograd unavailable: {type(error).__name__}: {error}")
        return
    try:
        for case, entry in zip(cases, results["cases"]):
            row = _autograd_row(case, "flaggems", lambda t: torch.softmax(t, -1))
            row["dev_frac"] = case.fraction(row.get("dev_us"))
            if gems is not None:
                row["plan"] = _gems_config(gems, case)
            entry["rows"].append(row)
        x = torch.randn(TINY, device=DEVICE).to(torch.bfloat16)
        leaf, dy = x.detach().requires_grad_(), torch.randn(TINY, device=DEVICE).to(torch.bfloat16)
        kept = torch.softmax(leaf, -1)
        results["host"]["autograd.grad flaggems"] = wall_us(
            lambda: torch.autograd.grad(kept, leaf, dy, retain_graph=True), calls=1000)
    finally:
        context.__exit__(None, None, None)


def run_case(case: Case, gems: Optional[Any]) -> list[dict[str, Any]]:
    rows = []
    paths = op_paths(gems)
    for name, op in paths.items():
        row: dict[str, Any] = {"path": "op", "impl": name}
        rows.append(row)
        try:
            error, ok = case.check(poisoned(lambda: op(case.y, case.dy), case.y))
            row["err"] = error
            if not ok:
                row["wrong"] = f"relative error {error:.2e} (torch's {case.torch_error:.2e})"
                continue
            step = lambda: op(case.y, case.dy)  # noqa: E731
            row["dev_us"] = dev_us(step)
            row["kernel_us"], row["kernels"] = kernel_us(step)
            row["wall_us"] = wall_us(step)
            if name == "ours":
                row["plan"] = _plan(case.y, case.dy)
            if name == "flaggems":
                row["plan"] = _gems_config(gems, case)
        except Exception as error:  # noqa: BLE001 (a peer failing on a case is a result)
            row["error"] = f"{type(error).__name__}: {str(error)[:160]}"
    # A second round of do_bench and of the profiler in the opposite order: the issue saw one case
    # read 0.48 and 1.18 in two runs, and FlagGems' kernel read 14.9 us as an op and 16.4 through
    # autograd (32768x256 bf16, NOTES v33); a figure that moves with the order (clocks, the
    # allocator, what L2 holds) shows here.
    for row in reversed(rows):
        if "dev_us" in row:
            op = paths[row["impl"]]
            row["dev2_us"] = dev_us(lambda: op(case.y, case.dy))
            row["kernel2_us"], _ = kernel_us(lambda: op(case.y, case.dy))
    for name, forward in autograd_paths().items():
        rows.append(_autograd_row(case, name, forward))
    return rows


def host_layers(gems: Optional[Any], dtype: torch.dtype = torch.bfloat16) -> dict[str, float]:
    """Wall microseconds per call back to back on a tiny tensor, each layer of the path."""
    x = torch.randn(TINY, device=DEVICE).to(dtype)
    y, dy = torch.softmax(x.float(), -1).to(dtype), torch.randn(TINY, device=DEVICE).to(dtype)
    leaf = x.detach().requires_grad_()
    steps: dict[str, Callable[[], Any]] = {"empty_strided": lambda: torch.empty_strided(TINY, (TINY[1], 1),
                                                                                         dtype=dtype, device=DEVICE)}
    steps.update({f"op {name}": (lambda op=op: op(y, dy)) for name, op in op_paths(gems).items()})
    op_calls._backward(y, dy, 1, dtype, False)
    record, dx = _record(y, dy), torch.empty_like(y)
    if record is not None:
        steps["our launch record alone (dx allocated)"] = lambda: record((y, dy, dx))
    steps["forward ours, no grad"] = lambda: portable_softmax.softmax(x, -1)
    steps["forward ours, grad (Function)"] = lambda: portable_softmax.softmax(leaf, -1)
    steps["forward torch, grad"] = lambda: torch.softmax(leaf, -1)
    found = {}
    for name, step in steps.items():
        found[name] = wall_us(step, calls=1000)
    for name, forward in autograd_paths().items():
        kept = forward(leaf)
        found[f"autograd.grad {name}"] = wall_us(
            lambda: torch.autograd.grad(kept, leaf, dy, retain_graph=True), calls=1000)
    return found


def sweep(cases: list[Case], names: list[str]) -> list[dict[str, Any]]:
    """Our backward op under each tuning row: the plan it takes, ``dev`` and ``kernel``."""
    record = device_record(torch.device(DEVICE))
    key = (record.backend, record.name)
    own = tuning.tuning_for(record)
    rows = []
    try:
        for name in names:
            tuning.TUNING[key] = dataclasses.replace(own, **VARIANTS[name])
            for case in cases:
                row: dict[str, Any] = {"variant": name, "case": _label(case)}
                rows.append(row)
                step = lambda: op_calls._backward(case.y, case.dy, 1, case.dtype, False)  # noqa: E731
                try:
                    error, ok = case.check(poisoned(step, case.y))
                    if not ok:
                        row["wrong"] = f"relative error {error:.2e}"
                        continue
                    row["plan"] = _plan(case.y, case.dy)
                    row["dev_us"] = dev_us(step)
                    row["kernel_us"], _ = kernel_us(step)
                except Exception as error:  # noqa: BLE001
                    row["error"] = f"{type(error).__name__}: {str(error)[:160]}"
    finally:
        tuning.TUNING.pop(key, None)
    return rows


def _label(case: Case) -> str:
    return f"{case.shape[0]}x{case.shape[1]} {str(case.dtype)[6:]}"


def _us(value: Optional[float]) -> str:
    return f"{value:7.1f}" if value is not None else "      -"


def _frac(value: Optional[float]) -> str:
    return f"{value:5.2f}" if value is not None else "    -"


def tables(results: dict[str, Any]) -> str:
    """The sweep's plans and the host table first (the log keeps them), then what the end of a
    device call's output shows: the sweep as one line a case, and the table of every path."""
    lines = []
    if results["sweep"]:
        lines += ["our backward op under tuning rows: dev us (frac) / kernel us | plan"]
        for row in results["sweep"]:
            cell = row.get("wrong") or row.get("error") or (
                f"{_us(row.get('dev_us'))} ({_frac(row.get('dev_frac'))}) / {_us(row.get('kernel_us'))} | {row['plan']}")
            lines.append(f"  {row['variant']:>12} {row['case']:>17}: {cell}")
    lines += ["", "host per call, (8, 781) bf16, back to back (us):"]
    lines += [f"  {us:7.1f}  {name}" for name, us in results["host"].items()]
    variants = list(dict.fromkeys(row["variant"] for row in results["sweep"]))
    if variants:
        lines += ["", "sweep, dev frac of our backward op: " + " ".join(f"{v:>8}" for v in variants)]
        for label in dict.fromkeys(row["case"] for row in results["sweep"]):
            cells = []
            for variant in variants:
                row = next(r for r in results["sweep"] if (r["variant"], r["case"]) == (variant, label))
                cells.append(f"{_frac(row.get('dev_frac')):>8}" if "dev_frac" in row and row["dev_frac"] else
                             f"{'x':>8}")
            lines.append(f"{label:>36} " + " ".join(cells))
    lines += ["", f"{results['device']} | torch {results['torch']} | triton {results['triton']} | copy "
              f"{results['copy_GBs']:.0f} GB/s (1 GiB clone)",
              "us per call. dev: do_bench, cache flushed (frac: of a same-size clone, 3 passes over 2, as bench), "
              "dev2: again, reversed order; kernel: the kernels alone (profiler, back to back, L2 warm), kern2: again, "
              "reversed order; wall: back to back; bwd(train): fwd+bwd - fwd",
              f"{'case':>17} {'floor':>5} {'copy':>5} | {'path':>8} {'impl':>14} | {'dev':>7} {'frac':>5} {'dev2':>7} | "
              f"{'kernel':>7} {'kern2':>7} | {'wall':>7} {'train':>7} | plan / kernels"]
    for case in results["cases"]:
        head = f"{case['case']:>17} {case['floor_us']:5.1f} {min(case['copy_us']):5.1f}"
        for row in case["rows"]:
            if "wrong" in row or "error" in row:
                lines.append(f"{head} | {row['path']:>8} {row['impl']:>14} | {row.get('wrong') or row['error']}")
            else:
                lines.append(
                    f"{head} | {row['path']:>8} {row['impl']:>14} | {_us(row.get('dev_us'))} {_frac(row.get('dev_frac'))}"
                    f" {_us(row.get('dev2_us'))} | {_us(row.get('kernel_us'))} {_us(row.get('kernel2_us'))} | "
                    f"{_us(row.get('wall_us'))} "
                    f"{_us(row.get('bwd_of_train_us'))} | {(row.get('plan') or row.get('kernels', ''))[:44]}")
            head = " " * len(head)
    lines.append(f"clocks (sm, mem, temperature, power) before: {results['clocks_before']}; after the cases: "
                 f"{results['clocks_after_cases']}")
    return "\n".join(lines)


def clocks() -> str:
    """The GPU's clocks, temperature and power now (nvidia-smi), or why not."""
    import subprocess

    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError) as error:
        return f"nvidia-smi: {error}"


def main() -> None:
    import triton

    out = sys.argv[1] if len(sys.argv) > 1 else None
    shapes = [tuple(map(int, s.split("x"))) for s in _env_list("SHORTBWD_CASES", "")] or CASES
    dtypes = [getattr(torch, name) for name in _env_list("SHORTBWD_DTYPES", "")] or DTYPES
    gems = _flaggems()
    # An idle GPU starts at a low clock: copy for a while first; the 1 GiB clone is the floor's copy.
    copy_gbs = _copy_bandwidth(1 << (30 if GPU else 20))
    results: dict[str, Any] = {"device": device_record(torch.device(DEVICE)).name, "torch": torch.__version__,
                               "triton": triton.__version__, "copy_GBs": copy_gbs, "cases": [], "host": {}, "sweep": [],
                               "clocks_before": clocks() if GPU else ""}
    cases = []
    for dtype in dtypes:
        for shape in shapes:
            case = Case(*shape, dtype)
            rows = run_case(case, gems)
            case.finish()
            for row in rows:
                row["dev_frac"] = case.fraction(row.get("dev_us"))
            results["cases"].append({"case": _label(case), "floor_us": 3 * case.bytes / (copy_gbs * 1e3),
                                     "copy_us": case.copy_us, "copy_wall_us": case.copy_wall_us,
                                     "torch_error": case.torch_error, "rows": rows})
            cases.append(case)
            # What a run cut short by its time limit still shows: each case's dev fractions.
            print(f"done {_label(case)}: " + ", ".join(
                f"{row['path']} {row['impl']} {_frac(row.get('dev_frac')).strip()}" for row in rows), flush=True)
            _dump(results, out)
    results["clocks_after_cases"] = clocks() if GPU else ""
    results["host"] = host_layers(gems)
    if gems is not None:
        gems_autograd(cases, results, gems)
    _dump(results, out)
    results["sweep"] = sweep(cases, _env_list("SHORTBWD_VARIANTS", DEFAULT_VARIANTS))
    by_label = {_label(case): case for case in cases}
    for row in results["sweep"]:
        row["dev_frac"] = by_label[row["case"]].fraction(row.get("dev_us"))
    _dump(results, out)
    print(tables(results))


def _copy_bandwidth(size: int) -> float:
    """GB/s of a clone of ``size`` bytes (read and written), the faster of two timings."""
    big = torch.empty(size, dtype=torch.uint8, device=DEVICE)
    return 2 * size / (min(dev_us(big.clone), dev_us(big.clone)) * 1e-6) / 1e9


def _dump(results: dict[str, Any], out: Optional[str]) -> None:
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "shortbwd.json"), "w") as handle:
            json.dump(results, handle, indent=1, default=str)


if __name__ == "__main__":
    main()
