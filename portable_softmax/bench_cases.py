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

The fused calls (``scale=``, ``mask=``, ``causal=``: a padding mask with a scale, causal
attention, a per-row temperature over a vocabulary) are timed against torch's composite of the
same definition (eager and under torch.compile); their forward moves x (a causal call only the
kept part, about half), y and the mask's own bytes; their backward op is ours and the composite's
(torch's backward op, the scale, the masked zeros).

``small`` runs each case's stand-in shape (tests on the CPU, through Triton's interpreter).
"""
from __future__ import annotations

import datetime
import logging
import math
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

import portable_softmax
from portable_softmax import fused, op_calls
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
    # A fused call: the name of its arguments in ``FUSIONS``.
    fusion: str = ""
    # Check the first entry of dim 0 only (a float64 reference of the whole would not fit).
    check_first: bool = False

    def make(self, device: torch.device, small: bool) -> torch.Tensor:
        base = (torch.randn(self.small if small else self.shape, device=device) * 3).to(self.dtype)
        return VIEWS[self.view](base)

    def fused_arguments(self, x: torch.Tensor) -> dict[str, Any]:
        """The keyword arguments of a fused call on ``x`` (none for plain calls)."""
        return FUSIONS[self.fusion](x) if self.fusion else {}


VIEWS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "as made": lambda t: t,
    "transposed": lambda t: t.t(),
    # A vocabulary padded to a multiple of 64, sliced back to its 50257 tokens (47 of 80 small).
    "sliced": lambda t: t[:, : t.shape[1] - 47],
}

# The fused calls' arguments for an input x: a (B, 1, 1, keys) padding mask that keeps 90% and a
# scale of 1/sqrt(128); causal; a temperature per row in [0.5, 1.5); one per pixel of NCHW.
FUSIONS: dict[str, Callable[[torch.Tensor], dict[str, Any]]] = {
    "padding mask, scale": lambda x: {"mask": torch.rand(x.shape[0], 1, 1, x.shape[-1], device=x.device) > 0.1,
                                      "scale": 128 ** -0.5},
    "causal": lambda x: {"causal": True},
    "temperature": lambda x: {"scale": 1 / (torch.rand(*x.shape[:-1], 1, device=x.device) + 0.5)},
    "pixel temperature": lambda x: {"scale": 1 / (torch.rand(x.shape[0], 1, *x.shape[2:], device=x.device) + 0.5)},
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
    RealCase("attention (4, 32, 2048, 2048), padding mask, scale", (4, 32, 2048, 2048), -1, torch.bfloat16,
             small=(2, 2, 16, 16), fusion="padding mask, scale"),
    RealCase("causal attention (4, 32, 4096, 4096)", (4, 32, 4096, 4096), -1, torch.bfloat16, small=(2, 2, 16, 16),
             fusion="causal", check_first=True),
    RealCase("temperature per row (256, 151936)", (256, 151936), -1, torch.float32, small=(4, 700),
             fusion="temperature"),
    RealCase("temperature per pixel, channels (16, 21, 512, 512) over dim 1", (16, 21, 512, 512), 1, torch.float32,
             small=(2, 21, 8, 8), fusion="pixel temperature"),
]


def composite(x: torch.Tensor, dim: int, scale: Any = None, mask: Optional[torch.Tensor] = None,
              causal: bool = False, empty_rows: bool = False) -> torch.Tensor:
    """The fused call's definition in torch operations: ``softmax(x * scale + mask)``, the masked
    positions -inf (a bool mask keeps where True), in x's dtype (a float32 scale tensor promotes a
    narrower x; the result is cast back). With ``empty_rows`` a row the bool mask leaves empty
    gives 0, as ours (the timed composite leaves it NaN: the cases have none)."""
    z = x * scale if scale is not None else x
    if mask is not None:
        z = z.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else z + mask.to(z.dtype)
    if causal:
        z = z.masked_fill(torch.ones(z.shape[-2], z.shape[-1], dtype=torch.bool, device=z.device).triu(1), -math.inf)
    y = torch.softmax(z, dim).to(x.dtype)
    if empty_rows and mask is not None and mask.dtype == torch.bool:
        y = torch.where(torch.isneginf(z).all(dim, keepdim=True), 0.0, y)
    return y


def composite_backward(y: torch.Tensor, dy: torch.Tensor, dim: int, scale: Any = None,
                       mask: Optional[torch.Tensor] = None, causal: bool = False) -> torch.Tensor:
    """The composite's backward op: torch's, times the scale, 0 where masked."""
    dx = torch._softmax_backward_data(dy, y, dim, y.dtype)
    if scale is not None:
        dx = (dx * scale).to(y.dtype)
    masked = None
    if mask is not None and mask.dtype == torch.bool:
        masked = ~mask
    if causal:
        upper = torch.ones(y.shape[-2], y.shape[-1], dtype=torch.bool, device=y.device).triu(1)
        masked = upper if masked is None else masked | upper
    return dx if masked is None else dx.masked_fill(masked, 0.0)

# (forward, backward op) of each implementation on (x, dim, the fused call's keyword arguments);
# None where it does not serve.
Implementation = Callable[[torch.Tensor, int, dict], Optional[tuple[Callable, Optional[Callable]]]]


def _rows_peer(forward: Callable, backward: Optional[Callable]) -> Implementation:
    """A peer that takes 2-D rows contiguous along the last dimension: ``x`` viewed so where it
    is contiguous and the softmax is over its last dimension, else (and for fused calls, which
    no peer takes) not served."""
    def serve(x: torch.Tensor, dim: int, fusion: dict):
        if fusion or not x.is_contiguous() or dim % x.dim() != x.dim() - 1:
            return None
        n = x.shape[-1]
        return (lambda: forward(x.view(-1, n)),
                None if backward is None else (lambda y, dy: backward(y.view(-1, n), dy.view(-1, n))))
    return serve


def implementations(wanted: set[str]) -> dict[str, Implementation]:
    found: dict[str, Implementation] = {"ours": _ours, "torch": lambda x, dim, fusion: (
        lambda: composite(x, dim, **fusion), lambda y, dy: composite_backward(y, dy, dim % x.dim(), **fusion))}
    if "compile" in wanted:
        # Every case compiles its own graphs; dynamo's default limit (8 per code object) would
        # leave the later cases to eager torch.
        from torch._dynamo import config as dynamo_config

        dynamo_config.cache_size_limit = 256
        if hasattr(dynamo_config, "recompile_limit"):
            dynamo_config.recompile_limit = 256

        def compiled(x: torch.Tensor, dim: int, fusion: dict):
            forward = torch.compile(lambda t: composite(t, dim, **fusion), dynamic=False)
            backward = torch.compile(lambda y, dy: composite_backward(y, dy, dim % x.dim(), **fusion), dynamic=False)
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


def _ours(x: torch.Tensor, dim: int, fusion: dict) -> tuple[Callable, Callable]:
    if fusion:
        return (lambda: portable_softmax.softmax(x, dim, **fusion),
                lambda y, dy: fused._fused_backward(y, dy, dim % x.dim(), y.dtype, False, fusion.get("scale"),
                                                    fusion.get("mask"), fusion.get("causal", False)))
    return (lambda: portable_softmax.softmax(x, dim),
            lambda y, dy: op_calls._backward(y, dy, dim % x.dim(), y.dtype, False))


def _first(fusion: dict[str, Any], x: torch.Tensor) -> dict[str, Any]:
    """The fused arguments for ``x[:1]``: tensors that follow x's dim 0 cut to their first entry."""
    return {k: v[:1] if isinstance(v, torch.Tensor) and v.dim() == x.dim() and v.shape[0] == x.shape[0] else v
            for k, v in fusion.items()}


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


def warm_up(device: torch.device, timer: Callable[[Callable[[], Any]], float]) -> None:
    """Copy for a while before a run's first case is timed: an idle GPU starts at a low clock (seen:
    345 MHz on the H200) and the first case timed after start-up once read 0.10 of copy where later
    runs read 1.00. (The loss bench had none: its first row's forward + backward read 0.05-0.12
    low for ours, Liger and QuACK on an idle H200, NOTES v40; whether the GPU's clock or the
    host's, the next run will show.)"""
    if device.type == "cpu":
        return
    warm = torch.empty(1 << 28, dtype=torch.uint8, device=device)
    timer(lambda: warm.clone())
    del warm


def cases(dtypes: Optional[list[torch.dtype]] = None, fused_only: bool = False) -> list[RealCase]:
    """The cases of ``dtypes`` (all by default), or of those the fused calls alone."""
    return [case for case in CASES if (dtypes is None or case.dtype in dtypes) and (case.fusion or not fused_only)]


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
        dtypes: Optional[list[torch.dtype]] = None, fused_only: bool = False) -> dict[str, Any]:
    """Check, then time, every implementation on every case; the JSON-ready results. ``timer(fn)``
    gives milliseconds per call (``device_timer()`` by default); ``small`` runs the cases' small
    stand-ins (the CPU tests); ``dtypes`` picks the cases of those dtypes, ``fused_only`` the
    fused calls."""
    from portable_softmax.device import as_device, device_record

    device = as_device(device)
    timer = timer or device_timer()
    record = device_record(device)
    served = implementations(peers)
    warm_up(device, timer)
    rows = []
    for case in cases(dtypes, fused_only):
        logger.info("case %s %s", case.name, case.dtype)
        x = case.make(device, small)
        dim = case.dim
        fusion = case.fused_arguments(x)
        moved = x.numel() * x.element_size()
        dense = torch.empty(x.shape, dtype=x.dtype, device=device).normal_()
        copy_ms = [timer(lambda: dense.clone())]
        dy = torch.randn(x.shape, device=device).to(x.dtype)
        # The float64 reference of x, or of its first entry (``check_first``; ``part`` cuts a
        # result to what it covers).
        part = (lambda t: t[:1]) if case.check_first else (lambda t: t)
        sample, sample_fusion = (x[:1], _first(fusion, x)) if case.check_first else (x, fusion)
        wide = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                for k, v in sample_fusion.items()}
        reference = composite(sample.double(), dim, **wide)
        reference_dx = composite_backward(reference, part(dy).double(), dim % x.dim(), **wide)
        y_torch = composite(x, dim, **fusion)
        # torch's own errors: what each result's tolerance is measured against.
        torch_errors = {"fwd": relative_error(part(y_torch), reference),
                        "bwd": relative_error(part(composite_backward(y_torch, dy, dim % x.dim(), **fusion)),
                                              reference_dx),
                        "autograd": relative_error(part(_autograd(lambda t, d: composite(t, d, **fusion), x, dim,
                                                                  dy)()), reference_dx)}
        checked = _Checked(timer, case.dtype, device)
        case_rows = []
        for name, serve in served.items():
            row: dict[str, Any] = {"case": case.name, "impl": name, "dtype": str(case.dtype)[6:],
                                   "shape": list(x.shape), "stride": list(x.stride()), "dim": dim}
            case_rows.append(row)
            pair = serve(x, dim, fusion)
            if pair is None:
                row["note"] = "n/a: takes 2-D rows contiguous along the last dimension, unfused"
                continue
            forward, backward = pair
            try:
                if not checked.measure(row, "fwd", part(forward().reshape(x.shape)), reference, torch_errors["fwd"],
                                       forward):
                    continue
                if backward is not None and not checked.measure(
                        row, "bwd", part(backward(y_torch, dy).reshape(x.shape)), reference_dx, torch_errors["bwd"],
                        lambda: backward(y_torch, dy)):
                    continue
                if name in ("ours", "torch"):
                    function = portable_softmax.softmax if name == "ours" else composite
                    grad = _autograd(lambda t, d: function(t, d, **fusion), x, dim, dy)
                    checked.measure(row, "autograd", part(grad()), reference_dx, torch_errors["autograd"], grad)
            except Exception as error:  # a peer failing on a case is a result
                row["error"] = f"{type(error).__name__}: {str(error)[:200]}"
        copy_ms.append(timer(lambda: dense.clone()))
        copy_gbs = 2 * moved / min(copy_ms) / 1e6
        # What the forward must move: x (a causal call reads the kept part, about half), y, the
        # mask's and the scale tensor's own bytes once.
        forward_bytes = (1.5 if fusion.get("causal") else 2) * moved + sum(
            t.numel() * t.element_size() for t in fusion.values() if isinstance(t, torch.Tensor))
        for row in case_rows:
            row.update(copy_GBs=copy_gbs, copy_ms_before_after=copy_ms, fusion=case.fusion)
            for key, moves in (("fwd", forward_bytes), ("bwd", 3 * moved), ("autograd", 3 * moved)):
                if f"{key}_ms" in row:
                    row[f"{key}_frac"] = moves / row[f"{key}_ms"] / 1e6 / copy_gbs
        rows.extend(case_rows)
        del x, dense, dy, reference, reference_dx, y_torch, fusion, sample, sample_fusion, wide
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
