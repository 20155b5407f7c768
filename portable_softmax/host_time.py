"""``portable-softmax bench --eager``: microseconds per call back to back, as an eager model pays.

``do_bench`` times the GPU alone and flushes the cache between calls, which hides up to ~80 us of
host work per call. Here each implementation is called ``calls`` times back to back after a
synchronize, and the wall time up to the closing synchronize is divided by ``calls``: whichever of
the host and the GPU is slower sets the figure, as in a model's eager step. Three paths each:

* ``fwd``: the forward alone, no gradient;
* ``bwd_op``: the backward operation alone (dx from y and dy), no autograd;
* ``train``: forward and ``torch.autograd.grad`` through autograd, what a training step runs.

Shapes are small and decode-like by default (the host dominates there); every implementation of
a case runs on the same tensors, in one process, one after another.
"""
from __future__ import annotations

import datetime
import logging
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any, Optional

import torch

import portable_softmax
from portable_softmax import op_calls
from portable_softmax.device import as_device, device_record

logger = logging.getLogger(__name__)

SHAPES = [(1, 4096), (64, 4096), (64, 32, 1, 4096), (32, 128256), (4096, 4096)]
DTYPES = (torch.bfloat16, torch.float32)


class Paths:
    """An implementation's three paths; None where it has none."""

    def __init__(self, forward: Callable[[torch.Tensor], torch.Tensor],
                 backward_op: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]],
                 differentiable: bool = True) -> None:
        self.forward, self.backward_op, self.differentiable = forward, backward_op, differentiable


def implementations(wanted: set[str]) -> dict[str, Paths]:
    """Ours, torch eager, and whichever of torch.compile, Liger and FlagGems are wanted and installed."""
    found = {
        "ours": Paths(lambda x: portable_softmax.softmax(x, -1),
                      lambda y, dy: op_calls._backward(y, dy, y.dim() - 1, y.dtype, False)),
        "torch": Paths(lambda x: torch.softmax(x, -1),
                       lambda y, dy: torch._softmax_backward_data(dy, y, -1, y.dtype)),
    }
    if "compile" in wanted:
        from torch._dynamo import config as dynamo_config

        dynamo_config.cache_size_limit = 256
        found["compile"] = Paths(torch.compile(lambda x: torch.softmax(x, -1)), None)
    if "liger" in wanted:
        try:
            from liger_kernel.ops.softmax import LigerSoftmaxFunction

            found["liger"] = Paths(LigerSoftmaxFunction.apply, None)
        except ImportError as error:
            logger.warning("liger unavailable: %s", error)
    if "flaggems" in wanted:
        try:
            from flag_gems.ops.softmax import softmax as gems

            found["flaggems"] = Paths(lambda x: gems(x, -1, False), None, differentiable=False)
        except ImportError as error:
            logger.warning("flaggems unavailable: %s", error)
    return {name: paths for name, paths in found.items() if name in wanted | {"ours", "torch"}}


def per_call_us(step: Callable[[], Any], calls: int, synchronize: Callable[[], None], warmup: int = 20) -> float:
    """Wall microseconds per call of ``step``, ``calls`` back to back between synchronizes."""
    for _ in range(warmup):
        step()
    synchronize()
    started = time.perf_counter()
    for _ in range(calls):
        step()
    synchronize()
    return (time.perf_counter() - started) / calls * 1e6


def median_call_us(step: Callable[[], Any], calls: int, synchronize: Callable[[], None], warmup: int = 20) -> float:
    """Median wall microseconds of one call of ``step`` over ``calls`` (a synchronize every tenth,
    outside the timing, so that a GPU's launch queue never fills): the host's own time per call,
    robust to a busy machine's outliers (the host-path probes)."""
    for _ in range(warmup):
        step()
    times = []
    for call in range(calls):
        if call % 10 == 0:
            synchronize()
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    synchronize()
    return statistics.median(times) * 1e6


def run(shapes: list[tuple[int, ...]], dtypes: list[torch.dtype], peers: set[str], calls: int = 300,
        device: Optional[str] = None, repeats: int = 3) -> dict[str, Any]:
    """Microseconds per call for every implementation, path and case; the least of ``repeats``
    runs is kept (others' work on the host only ever adds)."""
    device = as_device(device)
    if device.type == "cpu":
        raise RuntimeError("bench --eager needs a GPU: CPU tensors run through Triton's interpreter")
    module = getattr(torch, device.type)
    record = device_record(device)
    found = implementations(peers)
    rows = []
    for dtype in dtypes:
        for shape in shapes:
            x = torch.randn(shape, device=device, dtype=dtype)
            dy = torch.randn_like(x)
            y = torch.softmax(x, -1)
            leaf = x.detach().requires_grad_()
            for name, paths in found.items():
                row: dict[str, Any] = {"impl": name, "dtype": str(dtype)[6:], "shape": list(shape)}
                steps = {"fwd": lambda: paths.forward(x)}
                if paths.backward_op is not None:
                    steps["bwd_op"] = lambda: paths.backward_op(y, dy)
                if paths.differentiable:
                    steps["train"] = lambda: torch.autograd.grad(paths.forward(leaf), leaf, dy)
                for path, step in steps.items():
                    try:
                        row[f"{path}_us"] = min(per_call_us(step, calls, module.synchronize) for _ in range(repeats))
                    except Exception as error:  # a peer failing on a shape is a result
                        row[f"{path}_error"] = f"{type(error).__name__}: {str(error)[:160]}"
                rows.append(row)
    import triton

    return {"device": record.to_dict(), "device_name": record.name, "torch": torch.__version__,
            "triton": triton.__version__, "python": platform.python_version(), "calls": calls,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "results": rows}


def table(results: dict[str, Any]) -> str:
    """One line per case and path, one column per implementation (microseconds per call)."""
    rows = results["results"]
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    lines = [f"{results['device_name']} | torch {results['torch']} | triton {results['triton']} | {results['date']}",
             f"microseconds per call, {results['calls']} calls back to back (wall time / calls; least of repeats)",
             f"{'dtype':>8} {'shape':>18} {'path':>7} " + " ".join(f"{i:>9}" for i in impls)]
    for dtype, shape in dict.fromkeys((r["dtype"], tuple(r["shape"])) for r in rows):
        for path in ("fwd", "bwd_op", "train"):
            cells = []
            for impl in impls:
                r = next(r for r in rows if (r["dtype"], tuple(r["shape"]), r["impl"]) == (dtype, shape, impl))
                value = r.get(f"{path}_us")
                cells.append(f"{value:9.1f}" if value is not None else f"{'fail' if f'{path}_error' in r else '-':>9}")
            lines.append(f"{dtype:>8} {'x'.join(map(str, shape)):>18} {path:>7} " + " ".join(cells))
    return "\n".join(lines)
