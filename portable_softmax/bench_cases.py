"""``portable-softmax bench --cases real``: the calls models make, beside the 2-D rows of ``bench``.

Attention scores, channel softmax of NCHW tensors, a column softmax, a transposed input, rows
sliced from a padded vocabulary, router rows: each as its model lays it out. For each, the fraction
of copy bandwidth (bytes the op must move: forward 2x the tensor, backward 3x; copy: ``clone`` of a
contiguous tensor of as many elements, timed before and after, the faster kept) of ours, torch
eager and torch.compile on the same input, and of the peers that take it (Liger, FlagGems: 2-D
rows contiguous along the last dimension; a contiguous input is viewed so, never copied). The
backward is timed as the op alone (``torch._softmax_backward_data`` and ours) and through autograd
(``torch.autograd.grad`` of a kept forward graph), which is what training runs.
"""
from __future__ import annotations

import datetime
import logging
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

import portable_softmax
from portable_softmax import ops
from portable_softmax.selfcheck import relative_error

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
    return {name: serve for name, serve in found.items() if name in wanted | {"ours"}}


def _autograd(forward: Callable[[torch.Tensor, int], torch.Tensor], x: torch.Tensor, dim: int,
              dy: torch.Tensor) -> Callable[[], Any]:
    """The backward through autograd: ``torch.autograd.grad`` of a kept forward graph."""
    leaf = x.detach().requires_grad_()
    y = forward(leaf, dim)
    return lambda: torch.autograd.grad(y, leaf, dy, retain_graph=True)


def run(peers: set[str], device: Optional[str] = None, small: bool = False,
        timer: Optional[Callable[[Callable[[], Any]], float]] = None) -> dict[str, Any]:
    """Check and time every implementation on every case; the JSON-ready results. ``timer(fn)``
    gives milliseconds per call (``triton.testing.do_bench``'s median by default); ``small`` runs
    the cases' small stand-ins (the CPU tests)."""
    from portable_softmax.device import as_device, device_record

    device = as_device(device)
    if timer is None:
        from triton.testing import do_bench

        def timer(fn: Callable[[], Any]) -> float:
            return do_bench(fn, warmup=25, rep=100, return_mode="median")
    record = device_record(device)
    served = implementations(peers)
    rows = []
    for case in CASES:
        x = case.make(device, small)
        dim = case.dim
        moved = x.numel() * x.element_size()
        dense = torch.empty(x.shape, dtype=x.dtype, device=device).normal_()
        copy_ms = [timer(lambda: dense.clone())]
        reference = torch.softmax(x.double(), dim)
        dy = torch.randn(x.shape, device=device).to(x.dtype)
        y_torch = torch.softmax(x, dim)
        reference_dx = torch._softmax_backward_data(dy.double(), reference, dim % x.dim(), torch.float64)
        case_rows = []
        for name, serve in served.items():
            row: dict[str, Any] = {"case": case.name, "impl": name, "dtype": str(case.dtype)[6:],
                                   "shape": list(x.shape), "stride": list(x.stride()), "dim": dim}
            pair = serve(x, dim)
            if pair is None:
                row["note"] = "n/a: takes 2-D rows contiguous along the last dimension"
                case_rows.append(row)
                continue
            forward, backward = pair
            try:
                row["fwd_err"] = relative_error(forward().reshape(x.shape), reference)
                row["fwd_ms"] = timer(forward)
                if backward is not None:
                    row["bwd_err"] = relative_error(backward(y_torch, dy).reshape(x.shape), reference_dx)
                    row["bwd_ms"] = timer(lambda: backward(y_torch, dy))
                if name in ("ours", "torch"):
                    function = portable_softmax.softmax if name == "ours" else torch.softmax
                    row["autograd_ms"] = timer(_autograd(function, x, dim, dy))
            except Exception as error:  # a peer failing on a case is a result
                row["error"] = f"{type(error).__name__}: {str(error)[:200]}"
            case_rows.append(row)
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

    return {"device_name": record.name, "torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "results": rows}


def table(results: dict[str, Any]) -> str:
    """Fraction of copy per case: forward / backward op / backward through autograd."""
    rows = results["results"]
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    lines = [f"{results['device_name']} | torch {results['torch']} | triton {results['triton']} | {results['date']}",
             "fraction of copy: forward / backward op / backward through autograd (- not timed, n/a not served)",
             "| case | dtype | " + " | ".join(impls) + " |", "|---|---|" + "---|" * len(impls)]
    for case, dtype in dict.fromkeys((r["case"], r["dtype"]) for r in rows):
        cells = []
        for impl in impls:
            r = next((r for r in rows if (r["case"], r["dtype"], r["impl"]) == (case, dtype, impl)), None)
            if r is None or "note" in r:
                cells.append("n/a")
            elif "error" in r:
                cells.append("fail")
            else:
                cells.append(" / ".join(f"{r[k]:.2f}" if k in r else "-" for k in ("fwd_frac", "bwd_frac",
                                                                                    "autograd_frac")))
        lines.append(f"| {case} | {dtype} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> Optional[Path]:
    """Fraction of copy, one panel per dtype and direction, a bar group per case, one colour per
    implementation (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed: no plot")
        return None
    rows = [r for r in results["results"] if "fwd_frac" in r]
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    colours = {impl: f"C{i}" for i, impl in enumerate(impls)}
    figure, axes = plt.subplots(2, len(dtypes), figsize=(7 * len(dtypes), 9), squeeze=False)
    for column, dtype in enumerate(dtypes):
        cases = list(dict.fromkeys(r["case"] for r in rows if r["dtype"] == dtype))
        for line, (key, title) in enumerate((("fwd_frac", "forward"), ("bwd_frac", "backward op"))):
            axis = axes[line][column]
            width = 0.8 / max(len(impls), 1)
            for i, impl in enumerate(impls):
                values = [next((r.get(key, 0.0) for r in rows if (r["case"], r["dtype"], r["impl"]) ==
                                (case, dtype, impl)), 0.0) for case in cases]
                axis.bar([c + i * width for c in range(len(cases))], values, width, color=colours[impl], label=impl)
            axis.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
            axis.set_xticks([c + 0.4 - width / 2 for c in range(len(cases))])
            axis.set_xticklabels(cases, rotation=25, ha="right", fontsize=7)
            axis.set_ylabel("fraction of copy")
            axis.set_title(f"{dtype}, {title}")
            axis.legend(fontsize=7)
    figure.suptitle(f"softmax as models call it, on {results['device_name']}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
