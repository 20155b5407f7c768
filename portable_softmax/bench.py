"""``portable-softmax bench``: achieved bandwidth against the copy limit, with the peers side by side.

Softmax is memory-bound: forward reads x and writes y (2·M·N·bytes), backward reads y and dy and
writes dx (3·M·N·bytes). Each figure is that byte count over the median time from
``triton.testing.do_bench``, divided by the bandwidth of ``x.clone()`` measured in the same run on
the same device (timed before and after the case's implementations, the faster kept): the
fraction of copy. Results go to a table, a JSON file and a PNG plot.
"""
from __future__ import annotations

import datetime
import json
import logging
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import torch

import portable_softmax
from portable_softmax import op_calls
from portable_softmax.device import as_device, device_record
from portable_softmax.selfcheck import relative_error

logger = logging.getLogger(__name__)

SHAPES = [(32768, 128), (32768, 256), (32768, 1024), (32768, 4096), (16384, 16384), (16384, 32768), (16384, 65536),
          (8192, 131072), (4096, 262144), (4096, 50257), (4096, 151936), (32, 128256), (1, 128256)]
Timed = tuple[Callable[[torch.Tensor], torch.Tensor], Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]]


def _peers(wanted: set[str]) -> dict[str, Timed]:
    peers: dict[str, Timed] = {
        "ours": (lambda x: portable_softmax.softmax(x, -1),
                 lambda y, dy: op_calls._backward(y, dy, y.dim() - 1, y.dtype, False)),
        "torch": (lambda x: torch.softmax(x, -1), lambda y, dy: torch._softmax_backward_data(dy, y, -1, y.dtype)),
    }
    if "compile" in wanted:
        # Imported by name: `import torch._dynamo` here would make `torch` local to this function.
        from torch._dynamo import config as dynamo_config

        dynamo_config.cache_size_limit = 256
        if hasattr(dynamo_config, "recompile_limit"):
            dynamo_config.recompile_limit = 256
        peers["compile"] = (torch.compile(lambda x: torch.softmax(x, -1), dynamic=False),
                            torch.compile(lambda y, dy: torch._softmax_backward_data(dy, y, -1, y.dtype), dynamic=False))
    if "liger" in wanted:
        try:
            from liger_kernel.ops import softmax as liger

            peers["liger"] = (lambda x: liger._softmax_forward(x)[0], None)
        except ImportError as error:
            logger.warning("liger unavailable: %s", error)
    if "flaggems" in wanted:
        try:
            from flag_gems.ops.softmax import softmax as gems, softmax_backward as gems_backward

            peers["flaggems"] = (lambda x: gems(x, -1, False), lambda y, dy: gems_backward(dy, y, -1, y.dtype))
        except ImportError as error:
            logger.warning("flaggems unavailable: %s", error)
    return {name: timed for name, timed in peers.items() if name in wanted}


def _progress(items: list, enabled: bool):
    if not enabled:
        return items
    try:
        from tqdm import tqdm

        return tqdm(items, file=sys.stderr, leave=False)
    except ImportError:
        logger.info("tqdm is not installed (portable-softmax[bench]): no progress bar")
        return items


def run(shapes: list[tuple[int, int]], dtypes: list[torch.dtype], peers: set[str], backward: bool,
        warmup_ms: int, rep_ms: int, device: Optional[str] = None, progress: bool = True) -> dict[str, Any]:
    """Time every implementation on every case. Returns the JSON-ready results."""
    from triton.testing import do_bench

    from portable_softmax import bench_cases

    device = as_device(device)
    if device.type == "cpu":
        raise RuntimeError("bench needs a GPU: CPU tensors run through Triton's interpreter (use `portable-softmax`)")
    import triton

    record = device_record(device)
    implementations = _peers(peers | {"ours"})
    bench_cases.warm_up(device, lambda fn: do_bench(fn, warmup=warmup_ms, rep=max(rep_ms, 200)))
    rows = []
    cases = [(shape, dtype) for dtype in dtypes for shape in shapes]
    for (m, n), dtype in _progress(cases, progress):
        x = torch.randn(m, n, device=device, dtype=dtype) * 3
        size = x.element_size()
        # The copy is timed before and after the implementations and the faster one kept: the first
        # copy into memory freshly taken from the driver can run ~10% slow (seen at 2 GB on the H200),
        # and every fraction of the case divides by it.
        copy_ms = [do_bench(lambda: x.clone(), warmup=warmup_ms, rep=rep_ms, return_mode="median")]
        reference = torch.softmax(x.double(), -1)
        dy = torch.randn_like(x)
        case_rows = []
        for name, (forward, backward_fn) in implementations.items():
            row: dict[str, Any] = {"impl": name, "dtype": str(dtype)[6:], "M": m, "N": n}
            try:
                y = forward(x)
                row["relerr"] = relative_error(y, reference)
                ms = do_bench(lambda: forward(x), warmup=warmup_ms, rep=rep_ms, return_mode="median")
                row.update(fwd_ms=ms, fwd_GBs=2 * m * n * size / ms / 1e6)
                if backward and backward_fn is not None:
                    ms = do_bench(lambda: backward_fn(y, dy), warmup=warmup_ms, rep=rep_ms, return_mode="median")
                    row.update(bwd_ms=ms, bwd_GBs=3 * m * n * size / ms / 1e6)
            except Exception as error:  # a peer failing (OutOfResources, size limits) is a result
                row["error"] = f"{type(error).__name__}: {str(error)[:200]}"
            case_rows.append(row)
        copy_ms.append(do_bench(lambda: x.clone(), warmup=warmup_ms, rep=rep_ms, return_mode="median"))
        copy_gbs = 2 * m * n * size / min(copy_ms) / 1e6
        for row in case_rows:
            row.update(copy_GBs=copy_gbs, copy_ms_before_after=copy_ms)
            for direction in ("fwd", "bwd"):
                if f"{direction}_GBs" in row:
                    row[f"{direction}_frac"] = row[f"{direction}_GBs"] / copy_gbs
        rows.extend(case_rows)
        del x, dy, reference
        torch.cuda.empty_cache()
    return {"device": record.to_dict(), "device_name": record.name, "torch": torch.__version__,
            "triton": triton.__version__, "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "results": rows}


def table(results: dict[str, Any]) -> str:
    """Fraction of copy bandwidth per case, forward/backward, one column per implementation."""
    rows = results["results"]
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    lines = [f"{results['device_name']} | torch {results['torch']} | triton {results['triton']} | {results['date']}",
             "fraction of x.clone() bandwidth, forward/backward (backward counts 3·M·N·bytes)",
             f"{'dtype':>8} {'M x N':>14} {'copy GB/s':>9} " + " ".join(f"{i:>13}" for i in impls)]
    cases = list(dict.fromkeys((r["dtype"], r["M"], r["N"]) for r in rows))
    for dtype, m, n in cases:
        cells = []
        copy = ""
        for impl in impls:
            r = next((r for r in rows if (r["dtype"], r["M"], r["N"], r["impl"]) == (dtype, m, n, impl)), None)
            if r is None or "error" in r:
                cells.append(f"{'fail':>13}")
                continue
            copy = f"{r['copy_GBs']:9.0f}"
            bwd = f"{r['bwd_frac']:.2f}" if "bwd_frac" in r else "  - "
            cells.append(f"{r['fwd_frac']:>8.2f}/{bwd}")
        lines.append(f"{dtype:>8} {f'{m}x{n}':>14} {copy:>9} " + " ".join(cells))
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> Optional[Path]:
    """Bandwidth against N, one line per implementation and dtype (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed: no plot")
        return None
    rows = [r for r in results["results"] if "fwd_GBs" in r]
    figure, axis = plt.subplots(figsize=(9, 5))
    for impl in dict.fromkeys(r["impl"] for r in rows):
        for dtype in dict.fromkeys(r["dtype"] for r in rows):
            points = sorted((r["N"], r["fwd_GBs"]) for r in rows if r["impl"] == impl and r["dtype"] == dtype
                            and r["M"] > 64)
            if points:
                axis.plot(*zip(*points), marker="o", label=f"{impl} {dtype}")
    copies = sorted({(r["N"], r["copy_GBs"]) for r in rows if r["M"] > 64})
    axis.plot(*zip(*copies), linestyle="--", color="black", label="x.clone()")
    axis.set_xscale("log", base=2)
    axis.set_xlabel("N (row length)")
    axis.set_ylabel("forward GB/s (2·M·N·bytes / time)")
    axis.set_title(f"softmax forward on {results['device_name']}")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return path


def _write(results: dict[str, Any], out: Path, stem: str, plotter: Callable[[dict[str, Any], Path], Any],
           text: str) -> None:
    (out / f"{stem}.json").write_text(json.dumps(results, indent=1))
    plotted = plotter(results, out / f"{stem}.png")
    print(text)
    written = f"{(out / stem).resolve()}.json"
    print(f"\nwrote {written}" + (" and .png" if plotted else " (no plot: matplotlib is not installed)"))


def _stem(kind: str, results: dict[str, Any]) -> str:
    return f"{kind}-{results['date'][:10]}-{results['device_name'].replace(' ', '_')}"


def _real_cases(args: Any, dtypes: list[torch.dtype], out: Path) -> None:
    """``--cases real`` (or ``fused``, those calls alone): the calls models make (``bench_cases``);
    ``--small`` runs their stand-in
    shapes timed by the host's clock, which a CPU can run through Triton's interpreter."""
    from portable_softmax import bench_cases

    if as_device(args.device).type == "cpu" and not args.small:
        raise RuntimeError("bench needs a GPU: CPU tensors run through Triton's interpreter (use `portable-softmax`, "
                           "or --cases real --small)")
    timer = bench_cases.wall_clock if args.small else bench_cases.device_timer(args.warmup, args.rep)
    results = bench_cases.run(set(args.peers), args.device, small=args.small, timer=timer, dtypes=dtypes,
                              fused_only=args.cases == "fused")
    _write(results, out, _stem(args.cases if args.cases == "fused" else "real", results), bench_cases.plot,
           bench_cases.table(results))


def _loss_cases(args: Any, dtypes: list[torch.dtype], out: Path, shapes: Optional[list[tuple[int, int]]]) -> None:
    """``--cases loss``: cross_entropy of (tokens, vocabulary) logits (``bench_loss``); ``--small``
    as for the real cases; ``shapes``: ``--M`` and ``--N``'s one (tokens, vocabulary) shape instead of the six."""
    from portable_softmax import bench_cases, bench_loss

    if as_device(args.device).type == "cpu" and not args.small:
        raise RuntimeError("bench needs a GPU: CPU tensors run through Triton's interpreter (use --cases loss "
                           "--small)")
    timer = bench_cases.wall_clock if args.small else bench_cases.device_timer(args.warmup, args.rep)
    results = bench_loss.run(set(args.peers), args.device, small=args.small, timer=timer, dtypes=dtypes,
                             shapes=shapes)
    _write(results, out, _stem("loss", results), bench_loss.plot, bench_loss.table(results))


def _head_cases(args: Any, out: Path) -> None:
    """``--cases head``: linear_cross_entropy, the LLM head and its loss (``bench_head``);
    ``--small`` as for the real cases."""
    from portable_softmax import bench_cases, bench_head

    if as_device(args.device).type == "cpu" and not args.small:
        raise RuntimeError("bench needs a GPU: CPU tensors run through Triton's interpreter (use --cases head "
                           "--small)")
    timer = bench_cases.wall_clock if args.small else bench_cases.device_timer(args.warmup, args.rep)
    print(bench_head.COLUMNS, flush=True)
    results = bench_head.run(set(args.peers), args.device, small=args.small, timer=timer,
                             progress=lambda line: print(line, flush=True))
    print()
    _write(results, out, _stem("head", results), bench_head.plot, bench_head.table(results))


def main(args: Any) -> int:
    # One shape (--M, --N) in place of each case's own.
    picked = [(args.M, args.N)] if args.M and args.N else None
    shapes = picked or SHAPES
    dtypes = [getattr(torch, d) for d in args.dtype]
    if args.profile_only:
        x = torch.randn(shapes[0], device=as_device(args.device), dtype=dtypes[0])
        portable_softmax.softmax(x, -1)
        torch.cuda.synchronize()
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.cases in ("real", "fused"):
        _real_cases(args, dtypes, out)
        return 0
    if args.cases == "loss":
        _loss_cases(args, dtypes, out, picked)
        return 0
    if args.cases == "head":
        _head_cases(args, out)
        return 0
    if args.eager:
        from portable_softmax import host_time

        results = host_time.run(picked or host_time.SHAPES, dtypes,
                                set(args.peers), args.calls, args.device)
        stem = _stem("eager", results)
        (out / f"{stem}.json").write_text(json.dumps(results, indent=1))
        print(host_time.table(results))
        print(f"\nwrote {(out / stem).resolve()}.json")
        return 0
    results = run(shapes, dtypes, set(args.peers), args.backward, args.warmup, args.rep, args.device,
                  progress=not args.no_progress)
    _write(results, out, _stem("bench", results), plot, table(results))
    if args.cases == "all":
        print()
        _real_cases(args, dtypes, out)
    return 0
