"""``portable-softmax bench --cases real``: the calls models make, beside the 2-D rows of ``bench``.

Attention scores, channel softmax of NCHW tensors, a column softmax, a transposed input, rows
sliced from a padded vocabulary, router rows: each as its model lays it out. For each, the fraction
of copy bandwidth (bytes the op must move: forward 2x the tensor, backward 3x; copy: ``clone`` of a
contiguous tensor of as many elements, timed before and after, the faster kept) of ours, torch
eager and torch.compile on the same input, and of the peers that take it (Liger, FlagGems, QuACK:
2-D rows contiguous along the last dimension; a contiguous input is viewed so, never copied; any
other is marked n/a). The backward is timed as the op alone (``torch._softmax_backward_data`` and
ours) and through autograd (``torch.autograd.grad`` of a kept forward graph), which is what
training runs. Every result is checked against torch in float64 first; one outside the tolerance
``selfcheck`` uses is reported as wrong and not timed.

``small`` runs each case's stand-in shape (tests on the CPU, through Triton's interpreter).
"""
from __future__ import annotations

import datetime
import logging
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

import portable_softmax
from portable_softmax import ops
from portable_softmax.selfcheck import relative_error, tolerance

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RealCase:
    """A call as a model makes it: the tensor made (``shape``), the view of it that is the input
    (``view``: a name in ``VIEWS``), the dim and dtype. ``small`` stands in on CPU (tests)."""

    name: str
    shape: tuple[int, ...]
    dim: int
    dtype: torch.dtype
    view: str = "as made"
    small: tuple[int, ...] = ()

    def make(self, device: torch.device, small: bool) -> torch.Tensor:
        base = (torch.randn(self.small if small else self.shape, device=device) * 3).to(self.dtype)
        return VIEWS[self.view](base)


VIEWS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "as made": lambda t: t,
    "transposed": lambda t: t.t(),
    # A vocabulary padded to a multiple of 64, sliced back to its 50257 tokens (47 of 80 small).
    "sliced": lambda t: t[:, : t.shape[1] - 47],
}

CASES = [
    RealCase("attention scores (4, 32, 2048, 2048)", (4, 32, 2048, 2048), -1, torch.bfloat16, small=(2, 2, 16, 16)),
    RealCase("channels (16, 21, 512, 512) over dim 1", (16, 21, 512, 512), 1, torch.float32, small=(2, 21, 8, 8)),
    RealCase("channels (64, 1024, 32, 32) over dim 1", (64, 1024, 32, 32), 1, torch.bfloat16, small=(2, 40, 4, 4)),
    RealCase("column (32768, 1024) over dim 0", (32768, 1024), 0, torch.float32, small=(300, 8)),
    RealCase("column (32768, 1024) over dim 0", (32768, 1024), 0, torch.bfloat16, small=(300, 8)),
    RealCase("transposed (4096, 8192).t()", (4096, 8192), -1, torch.bfloat16, "transposed", small=(40, 24)),
    RealCase("sliced (4096, 50304)[:, :50257]", (4096, 50304), -1, torch.bfloat16, "sliced", small=(6, 80)),
    RealCase("router rows (65536, 64)", (65536, 64), -1, torch.float32, small=(64, 64)),
    RealCase("router rows (65536, 64)", (65536, 64), -1, torch.bfloat16, small=(64, 64)),
]

# (forward, backward op) of each implementation on (x, dim); None where it does not serve.
Implementation = Callable[[torch.Tensor, int], Optional[tuple[Callable, Optional[Callable]]]]


def _rows_peer(forward: Callable, backward: Optional[Callable]) -> Implementation:
    """A peer that takes 2-D rows contiguous along the last dimension: ``x`` viewed so where it
    is contiguous and the softmax is over its last dimension, else not served."""
    def serve(x: torch.Tensor, dim: int):
        if not x.is_contiguous() or dim % x.dim() != x.dim() - 1:
            return None
        n = x.shape[-1]
        return (lambda: forward(x.view(-1, n)),
                None if backward is None else (lambda y, dy: backward(y.view(-1, n), dy.view(-1, n))))
    return serve


def implementations(wanted: set[str]) -> dict[str, Implementation]:
    found: dict[str, Implementation] = {
        "ours": lambda x, dim: (lambda: portable_softmax.softmax(x, dim),
                                lambda y, dy: ops._backward(y, dy, dim % x.dim(), y.dtype, False)),
        "torch": lambda x, dim: (lambda: torch.softmax(x, dim),
                                 lambda y, dy: torch._softmax_backward_data(dy, y, dim % x.dim(), y.dtype)),
    }
    if "compile" in wanted:
        # Every case compiles its own graphs; dynamo's default limit (8 per code object) would
        # leave the later cases to eager torch.
        from torch._dynamo import config as dynamo_config

        dynamo_config.cache_size_limit = 256
        if hasattr(dynamo_config, "recompile_limit"):
            dynamo_config.recompile_limit = 256

        def compiled(x: torch.Tensor, dim: int):
            forward = torch.compile(lambda t: torch.softmax(t, dim), dynamic=False)
            backward = torch.compile(lambda y, dy: torch._softmax_backward_data(dy, y, dim % x.dim(), y.dtype),
                                     dynamic=False)
            return (lambda: forward(x)), backward
        found["compile"] = compiled
    if "liger" in wanted:
        try:
            from liger_kernel.ops import softmax as liger

            found["liger"] = _rows_peer(lambda x: liger._softmax_forward(x)[0], None)
        except ImportError as error:
            logger.warning("liger unavailable: %s", error)
    if "flaggems" in wanted:
        try:
            from flag_gems.ops.softmax import softmax as gems, softmax_backward as gems_backward

            found["flaggems"] = _rows_peer(lambda x: gems(x, -1, False),
                                           lambda y, dy: gems_backward(dy, y, -1, y.dtype))
        except ImportError as error:
            logger.warning("flaggems unavailable: %s", error)
    if "quack" in wanted:
        try:
            from quack.softmax import softmax_bwd as quack_backward, softmax_fwd as quack

            found["quack"] = _rows_peer(quack, lambda y, dy: quack_backward(dy, y))
        except (ImportError, OSError, RuntimeError) as error:  # CuTe DSL loads CUDA libraries on import
            logger.warning("quack unavailable: %s", error)
    return {name: serve for name, serve in found.items() if name in wanted | {"ours"}}


def _autograd(forward: Callable[[torch.Tensor, int], torch.Tensor], x: torch.Tensor, dim: int,
              dy: torch.Tensor) -> Callable[[], torch.Tensor]:
    """The backward through autograd: ``torch.autograd.grad`` of a kept forward graph."""
    leaf = x.detach().requires_grad_()
    y = forward(leaf, dim)
    return lambda: torch.autograd.grad(y, leaf, dy, retain_graph=True)[0]


def wall_clock(fn: Callable[[], Any], repeats: int = 3) -> float:
    """Milliseconds per call by the host's clock, the best of ``repeats`` after one call: the
    timer of ``small`` runs on the CPU, where ``do_bench`` has no device events."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return min(times)


def device_timer(warmup_ms: int = 25, rep_ms: int = 100) -> Callable[[Callable[[], Any]], float]:
    """``triton.testing.do_bench``'s median in milliseconds (device events, the cache flushed
    between calls)."""
    from triton.testing import do_bench

    return lambda fn: do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def cases(dtypes: Optional[list[torch.dtype]] = None) -> list[RealCase]:
    """The cases of ``dtypes`` (all by default)."""
    return [case for case in CASES if dtypes is None or case.dtype in dtypes]


class _Checked:
    """Times what is right: ``measure(row, key, result, reference, torch_error, fn)`` records the
    relative error of ``result`` as ``{key}_err``; within the tolerance it times ``fn`` into
    ``{key}_ms``, else it marks the row wrong and times nothing more for it."""

    def __init__(self, timer: Callable[[Callable[[], Any]], float], dtype: torch.dtype, device: torch.device):
        self.timer, self.dtype, self.device = timer, dtype, device

    def measure(self, row: dict[str, Any], key: str, result: torch.Tensor, reference: torch.Tensor,
                torch_error: float, fn: Callable[[], Any]) -> bool:
        error = row[f"{key}_err"] = relative_error(result, reference)
        if not error <= tolerance(self.dtype, torch_error, self.device.type):
            row["wrong"] = f"{key}: relative error {error:.2e} (torch's {torch_error:.2e})"
            return False
        row[f"{key}_ms"] = self.timer(fn)
        return True


def run(peers: set[str], device: Optional[str] = None, small: bool = False,
        timer: Optional[Callable[[Callable[[], Any]], float]] = None,
        dtypes: Optional[list[torch.dtype]] = None) -> dict[str, Any]:
    """Check, then time, every implementation on every case; the JSON-ready results. ``timer(fn)``
    gives milliseconds per call (``device_timer()`` by default); ``small`` runs the cases' small
    stand-ins (the CPU tests); ``dtypes`` picks the cases of those dtypes."""
    from portable_softmax.device import as_device, device_record

    device = as_device(device)
    timer = timer or device_timer()
    record = device_record(device)
    served = implementations(peers)
    if device.type != "cpu":
        # An idle GPU starts at a low clock: copy for a while before the first case is timed.
        warm = torch.empty(1 << 28, dtype=torch.uint8, device=device)
        timer(lambda: warm.clone())
        del warm
    rows = []
    for case in cases(dtypes):
        logger.info("case %s %s", case.name, case.dtype)
        x = case.make(device, small)
        dim = case.dim
        moved = x.numel() * x.element_size()
        dense = torch.empty(x.shape, dtype=x.dtype, device=device).normal_()
        copy_ms = [timer(lambda: dense.clone())]
        reference = torch.softmax(x.double(), dim)
        dy = torch.randn(x.shape, device=device).to(x.dtype)
        y_torch = torch.softmax(x, dim)
        reference_dx = torch._softmax_backward_data(dy.double(), reference, dim % x.dim(), torch.float64)
        # torch's own errors: what each result's tolerance is measured against.
        torch_errors = {"fwd": relative_error(y_torch, reference),
                        "bwd": relative_error(torch._softmax_backward_data(dy, y_torch, dim % x.dim(), x.dtype),
                                              reference_dx),
                        "autograd": relative_error(_autograd(torch.softmax, x, dim, dy)(), reference_dx)}
        checked = _Checked(timer, case.dtype, device)
        case_rows = []
        for name, serve in served.items():
            row: dict[str, Any] = {"case": case.name, "impl": name, "dtype": str(case.dtype)[6:],
                                   "shape": list(x.shape), "stride": list(x.stride()), "dim": dim}
            case_rows.append(row)
            pair = serve(x, dim)
            if pair is None:
                row["note"] = "n/a: takes 2-D rows contiguous along the last dimension"
                continue
            forward, backward = pair
            try:
                if not checked.measure(row, "fwd", forward().reshape(x.shape), reference, torch_errors["fwd"], forward):
                    continue
                if backward is not None and not checked.measure(
                        row, "bwd", backward(y_torch, dy).reshape(x.shape), reference_dx, torch_errors["bwd"],
                        lambda: backward(y_torch, dy)):
                    continue
                if name in ("ours", "torch"):
                    grad = _autograd(portable_softmax.softmax if name == "ours" else torch.softmax, x, dim, dy)
                    checked.measure(row, "autograd", grad(), reference_dx, torch_errors["autograd"], grad)
            except Exception as error:  # a peer failing on a case is a result
                row["error"] = f"{type(error).__name__}: {str(error)[:200]}"
        copy_ms.append(timer(lambda: dense.clone()))
        copy_gbs = 2 * moved / min(copy_ms) / 1e6
        for row in case_rows:
            row.update(copy_GBs=copy_gbs, copy_ms_before_after=copy_ms)
            for key, factor in (("fwd", 2), ("bwd", 3), ("autograd", 3)):
                if f"{key}_ms" in row:
                    row[f"{key}_frac"] = factor * moved / row[f"{key}_ms"] / 1e6 / copy_gbs
        rows.extend(case_rows)
        del x, dense, dy, reference, reference_dx, y_torch
        if device.type == "cuda":
            torch.cuda.empty_cache()
    import triton

    return {"device": record.to_dict(), "device_name": record.name, "torch": torch.__version__,
            "triton": triton.__version__, "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "small": small,
            "results": rows}


def _cell(row: Optional[dict[str, Any]]) -> str:
    if row is None or "note" in row:
        return "n/a"
    if "error" in row:
        return "fail"
    if "wrong" in row:
        return "WRONG"
    return " / ".join(f"{row[k]:.2f}" if k in row else "-" for k in ("fwd_frac", "bwd_frac", "autograd_frac"))


def table(results: dict[str, Any]) -> str:
    """Fraction of copy per case: forward / backward op / backward through autograd."""
    rows = results["results"]
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    lines = [f"{results['device_name']} | torch {results['torch']} | triton {results['triton']} | {results['date']}"
             + (" | small stand-in shapes by the host's clock: a check, not a measurement" if results.get("small") else ""),
             "fraction of copy: forward / backward op / backward through autograd (- not timed, n/a not served, "
             "WRONG outside the tolerance, fail raised)",
             "| case | dtype | " + " | ".join(impls) + " |", "|---|---|" + "---|" * len(impls)]
    for case, dtype in dict.fromkeys((r["case"], r["dtype"]) for r in rows):
        cells = [_cell(next((r for r in rows if (r["case"], r["dtype"], r["impl"]) == (case, dtype, impl)), None))
                 for impl in impls]
        lines.append(f"| {case} | {dtype} | " + " | ".join(cells) + " |")
    problems = [f"  {r['impl']} on {r['case']} {r['dtype']}: {r.get('wrong') or r['error']}"
                for r in rows if "wrong" in r or "error" in r]
    return "\n".join(lines + (["", "wrong or failed:"] + problems if problems else []))


PANELS = (("fwd_frac", "forward"), ("bwd_frac", "backward op"), ("autograd_frac", "backward through autograd"))


def plot(results: dict[str, Any], path: Path) -> Optional[Path]:
    """Fraction of copy: a column of panels per dtype (forward, backward op, backward through
    autograd), a bar group per case, one colour per implementation; "n/a" where an
    implementation does not take the case (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed: no plot")
        return None
    rows = results["results"]
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    colours = {impl: f"C{i}" for i, impl in enumerate(impls)}
    width = 0.8 / max(len(impls), 1)
    figure, axes = plt.subplots(len(PANELS), len(dtypes), figsize=(7 * len(dtypes), 4.5 * len(PANELS)),
                                squeeze=False)
    for column, dtype in enumerate(dtypes):
        cases = list(dict.fromkeys(r["case"] for r in rows if r["dtype"] == dtype))
        for line, (key, title) in enumerate(PANELS):
            axis = axes[line][column]
            for i, impl in enumerate(impls):
                for c, case in enumerate(cases):
                    row = next((r for r in rows if (r["case"], r["dtype"], r["impl"]) == (case, dtype, impl)), None)
                    if row is not None and key in row:
                        axis.bar(c + i * width, row[key], width, color=colours[impl])
                    elif row is not None and "note" in row:
                        axis.text(c + i * width, 0.02, "n/a", rotation=90, ha="center", va="bottom", fontsize=6)
            axis.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
            axis.set_xticks([c + 0.4 - width / 2 for c in range(len(cases))])
            axis.set_xticklabels(cases, rotation=25, ha="right", fontsize=7)
            axis.set_ylabel("fraction of copy")
            axis.set_title(f"{dtype}, {title}")
            axis.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=colours[i]) for i in impls], labels=impls,
                        fontsize=7)
    figure.suptitle(f"softmax as models call it, on {results['device_name']}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
