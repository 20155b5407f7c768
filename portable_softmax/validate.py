"""``portable-softmax validate``: the report a vendor attaches when bringing up a chip or a Triton
backend. On whatever device is present it records the device, the launch plan per shape, the
conformance cases (pass/fail with error figures against torch in float64), the fused variants
(scale, masks, causal; against torch's composite in float64) and, on a GPU, a short
benchmark against the copy limit. Writes ``report.json``, ``report.md`` and, with a benchmark,
``bandwidth.png`` into the output folder.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Optional

import torch

import portable_softmax
from portable_softmax import bench, bench_cases, selfcheck
from portable_softmax.device import as_device, device_record
from portable_softmax.planner import contiguous_align
from portable_softmax.targets import plan_launch

CONFORMANCE = [((1823, 781), torch.float32), ((1823, 781), torch.bfloat16), ((64, 4096), torch.float16),
               ((7, 50257), torch.bfloat16), ((3, 131072), torch.float32), ((5, 1), torch.float32), ((1, 1), torch.float16)]
# The fused variants: (shape, dim, dtype, arguments on a device): a per-row scale tensor with a bool
# mask and causal, a number scale with an additive mask; rows in tiles and rows longer than a tile;
# a channel softmax (a temperature per pixel, a mask per image and channel).
FUSED = [
    ((2, 4, 33, 781), -1, torch.float32, lambda d: {"scale": torch.rand(2, 4, 33, 1, device=d) + 0.5,
                                                    "mask": torch.rand(2, 1, 33, 781, device=d) > 0.3,
                                                    "causal": True}),
    ((2, 4, 33, 781), -1, torch.bfloat16, lambda d: {"scale": 0.125, "mask": torch.randn(1, 1, 33, 781, device=d)}),
    ((2, 3, 5, 131072), -1, torch.float32, lambda d: {"scale": torch.rand(2, 3, 5, 1, device=d) + 0.5,
                                                      "mask": torch.rand(2, 1, 1, 131072, device=d) > 0.3,
                                                      "causal": True}),
    ((2, 3, 50257), -1, torch.bfloat16, lambda d: {"scale": 1 / (torch.rand(2, 3, 1, device=d) + 0.5)}),
    ((4, 37, 16, 16), 1, torch.bfloat16, lambda d: {"scale": torch.rand(4, 1, 16, 16, device=d) + 0.5,
                                                    "mask": torch.rand(4, 37, 1, 1, device=d) > 0.2}),
]
BENCH_SHAPES = [(32768, 1024), (16384, 16384), (4096, 50257), (4096, 262144), (32, 128256)]


def _special_values(device: torch.device) -> dict[str, Any]:
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[1.0, inf, 2.0], [-inf, -inf, -inf], [nan, 1.0, 2.0], [1e4, 1e4 - 1, -1e4]], device=device)
    ours, theirs = portable_softmax.softmax(x, -1).cpu(), torch.softmax(x, -1).cpu()
    same = torch.equal(ours.isnan(), theirs.isnan()) and torch.allclose(ours.nan_to_num(), theirs.nan_to_num(), atol=1e-6)
    return {"case": "special values (+inf, all -inf, NaN, 1e4)", "passed": bool(same)}


def _dims(device: torch.device) -> list[dict[str, Any]]:
    x = torch.randn(6, 35, 9, device=device)
    results = []
    for dim in (0, 1, 2):
        error = selfcheck.relative_error(portable_softmax.softmax(x, dim), torch.softmax(x.double(), dim))
        results.append({"case": f"dim={dim} of 6x35x9", "error": error, "passed": error < 1e-6})
    xt = torch.randn(300, 200, device=device).t()
    error = selfcheck.relative_error(portable_softmax.softmax(xt, -1), torch.softmax(xt.double(), -1))
    results.append({"case": "transposed 200x300", "error": error, "passed": error < 1e-6})
    return results


def _fused(device: torch.device) -> list[dict[str, Any]]:
    """Each fused case forward and backward against the composite in float64, within the bound
    set by the composite's own error in that dtype (``selfcheck.tolerance``)."""
    results = []
    for shape, dim, dtype, arguments in FUSED:
        x = (torch.randn(shape, device=device) * 3).to(dtype)
        fusion = arguments(device)
        wide = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                for k, v in fusion.items()}
        dim %= x.dim()
        reference = bench_cases.composite(x.double(), dim, **wide, empty_rows=True)
        dy = torch.randn(shape, device=device).to(dtype)
        reference_dx = bench_cases.composite_backward(reference, dy.double(), dim, **wide)
        leaf = x.detach().requires_grad_()
        y = portable_softmax.softmax(leaf, dim, **fusion)
        (dx,) = torch.autograd.grad(y, leaf, dy)
        theirs = bench_cases.composite(x, dim, **fusion, empty_rows=True)
        kept = reference.isfinite()
        over = "" if dim == x.dim() - 1 else f" over dim {dim}"
        name = f"{'x'.join(map(str, shape))}{over} {str(dtype)[6:]} {', '.join(sorted(fusion))}"
        for direction, ours, expected, torch_result in (
                ("forward", y, reference, theirs),
                ("backward", dx, reference_dx, bench_cases.composite_backward(theirs, dy, dim, **fusion))):
            error = selfcheck.relative_error(ours[kept], expected[kept])
            torch_error = selfcheck.relative_error(torch_result[kept], expected[kept])
            passed = error <= selfcheck.tolerance(dtype, torch_error, device.type)
            if direction == "forward":
                passed = passed and torch.equal(ours.isfinite(), kept)
            results.append({"case": f"fused {name} {direction}", "error": error, "torch_error": torch_error,
                            "passed": bool(passed)})
    return results


def run(device: Optional[str], out: Path, benchmark: bool = True) -> bool:
    """Write the report; True if every conformance case passed."""
    device = as_device(device)
    record = device_record(device)
    import triton

    # First: a folder that cannot be written fails before minutes of checks, not after them.
    out.mkdir(parents=True, exist_ok=True)
    cases = [dataclasses.asdict(r) for shape, dtype in CONFORMANCE for log in (False, True)
             for r in selfcheck.check_case(shape, dtype, device, log)]
    extra = [_special_values(device), *_dims(device), *_fused(device)]
    plans = {f"{m}x{n} {'bwd' if backward else 'fwd'}":
             plan_launch(record, m, n, "float32", backward=backward, align=contiguous_align(m, n, 4)).to_dict()
             for m, n in bench.SHAPES for backward in (False, True)}
    report: dict[str, Any] = {
        "portable_softmax": portable_softmax.__version__, "torch": torch.__version__, "triton": triton.__version__,
        "device": record.to_dict(), "plans": plans, "conformance": cases, "checks": extra,
        "passed": all(c["passed"] for c in cases) and all(c["passed"] for c in extra),
    }
    if benchmark and device.type != "cpu":
        results = bench.run(BENCH_SHAPES, [torch.bfloat16, torch.float32], {"torch"}, True, 25, 100, str(device),
                            progress=False)
        report["benchmark"] = results
        bench.plot(results, out / "bandwidth.png")
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "report.md").write_text(_markdown(report))
    return report["passed"]


def _markdown(report: dict[str, Any]) -> str:
    device = report["device"]
    lines = [f"# portable_softmax validation: {device['name']} ({device['backend']}, {device['arch']})", "",
             f"portable_softmax {report['portable_softmax']}, torch {report['torch']}, triton {report['triton']}. "
             f"Overall: **{'PASS' if report['passed'] else 'FAIL'}**", "", "## Device record", "",
             "| field | value |", "|---|---|", *[f"| {k} | {v} |" for k, v in device.items()], "",
             "## Conformance (relative error vs torch float64; torch's own beside it)", "",
             "| shape | dtype | function | pass | ours | torch | ok |", "|---|---|---|---|---|---|---|"]
    for c in report["conformance"]:
        lines.append(f"| {'x'.join(map(str, c['shape']))} | {c['dtype']} | {c['function']} | {c['direction']} | "
                     f"{c['error']:.2e} | {c['torch_error']:.2e} | {'yes' if c['passed'] else 'NO'} |")
    lines += ["", "| check | ours | torch | ok |", "|---|---|---|---|",
              *[f"| {c['case']} | {_figure(c.get('error'))} | {_figure(c.get('torch_error'))} | "
                f"{'yes' if c['passed'] else 'NO'} |" for c in report["checks"]], "", "## Launch plans", "",
              "| problem | regime | programs | block | warps | reason |", "|---|---|---|---|---|---|"]
    for name, p in report["plans"].items():
        lines.append(f"| {name} | {p['regime']} | {p['programs']} | {p['block_m']}x{p['block_n']}"
                     f"{' x' + str(p['chunks']) if p['chunks'] > 1 else ''} | {p['num_warps']} | {p['reason']} |")
    if "benchmark" in report:
        lines += ["", "## Bandwidth (fraction of x.clone())", "", "```", bench.table(report["benchmark"]), "```",
                  "", "![bandwidth](bandwidth.png)"]
    return "\n".join(lines) + "\n"


def _figure(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.2e}"
