"""The main job: on whatever device is present, show the device record and launch plans, check
results against torch in float64 and time a small case against torch.

Accuracy is judged against torch's own: the relative error of the whole tensor versus a float64
reference may exceed torch's by at most a small factor (or a floor per dtype).
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import torch

import portable_softmax
from portable_softmax.device import as_device, device_record
from portable_softmax.planner import contiguous_align, input_bytes_per_column
from portable_softmax.targets import plan_launch

ERROR_FLOOR = {torch.float32: 2e-6, torch.float64: 1e-13, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
ERROR_FACTOR = 2.0

DEFAULT_CASES = [((1823, 781), torch.float32), ((64, 4096), torch.bfloat16), ((33, 50257), torch.float16),
                 ((4, 131072), torch.float32), ((1, 1), torch.float32)]


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """‖value − reference‖ / ‖reference‖ in float64 over the whole tensor (NaN where equal NaNs)."""
    value, reference = value.double(), reference.double()
    both_nan = value.isnan() & reference.isnan()
    value = torch.where(both_nan, 0.0, value)
    reference = torch.where(both_nan, 0.0, reference)
    norm = reference.norm().item()
    return (value - reference).norm().item() / (norm if norm else 1.0)


def tolerance(dtype: torch.dtype, torch_error: float, device: str = "cuda") -> float:
    """The largest relative error accepted for a result of ``dtype`` on ``device``.

    The same on every device: CPU tensors used to get twice the bfloat16 error, for Triton's
    interpreter truncated float32 to bfloat16; interpreted launches now round to nearest even as
    GPUs do (``interpreter.py``). ``device`` stays for the callers that pass it.
    """
    return max(ERROR_FACTOR * torch_error, ERROR_FLOOR[dtype])


@dataclass
class CaseResult:
    shape: tuple
    dtype: str
    function: str
    direction: str
    error: float
    torch_error: float
    passed: bool
    regime: str = ""


def _grad_reference(x: torch.Tensor, dy: torch.Tensor, log: bool) -> torch.Tensor:
    xd = x.double().requires_grad_()
    out = torch.log_softmax(xd, -1) if log else torch.softmax(xd, -1)
    return torch.autograd.grad(out, xd, dy.double())[0]


def check_case(shape: tuple, dtype: torch.dtype, device: torch.device, log: bool) -> list[CaseResult]:
    """Forward and backward of one case, each with torch's own error for comparison."""
    ours = portable_softmax.log_softmax if log else portable_softmax.softmax
    theirs = torch.log_softmax if log else torch.softmax
    name = "log_softmax" if log else "softmax"
    x = (torch.randn(shape, device=device) * 3).to(dtype).requires_grad_()
    reference = theirs(x.detach().double(), -1)
    y = ours(x, -1)
    torch_y = theirs(x.detach(), -1)
    results = []
    error, torch_error = relative_error(y, reference), relative_error(torch_y, reference)
    results.append(CaseResult(shape, str(dtype)[6:], name, "forward", error, torch_error,
                              error <= tolerance(dtype, torch_error, device)))
    dy = torch.randn_like(y)
    grad = torch.autograd.grad(y, x, dy)[0]
    torch_grad = torch.autograd.grad(theirs(x, -1), x, dy)[0]
    grad_reference = _grad_reference(x.detach(), dy, log)
    error, torch_error = relative_error(grad, grad_reference), relative_error(torch_grad, grad_reference)
    results.append(CaseResult(shape, str(dtype)[6:], name, "backward", error, torch_error,
                              error <= tolerance(dtype, torch_error, device)))
    return results


def median_seconds(fn: Callable[[], object], device: torch.device, repeats: int = 5) -> float:
    """Median time of ``fn``: device events through ``triton.testing.do_bench`` on a GPU, the
    host clock on the CPU (where do_bench has no events to use)."""
    if device.type != "cpu":
        from triton.testing import do_bench

        return do_bench(fn, return_mode="median") / 1e3
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if device.type != "cpu":
            getattr(torch, device.type).synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(device: Optional[str] = None, cases: Optional[list] = None, echo: Callable[[str], None] = print) -> bool:
    """The main job. Returns True if every case passed."""
    device = as_device(device)
    record = device_record(device)
    import triton

    echo(f"portable-softmax {portable_softmax.__version__} | torch {torch.__version__} | triton {triton.__version__}")
    echo(f"device {device}: " + ", ".join(f"{k}={v}" for k, v in record.to_dict().items()))
    cases = cases or DEFAULT_CASES
    echo("\nlaunch plans (forward / backward):")
    for shape, dtype in cases:
        rows, cols = shape
        dtype_name = "float64" if dtype == torch.float64 else "float32"
        for backward in (False, True):
            plan = plan_launch(record, rows, cols, dtype_name, backward=backward,
                               align=contiguous_align(rows, cols, dtype.itemsize),
                               input_bytes=input_bytes_per_column(dtype.itemsize, backward))
            echo(f"  {rows}x{cols} {'bwd' if backward else 'fwd'}: {plan.programs} programs, {plan.reason}")
    echo("\ncorrectness (relative error of the whole tensor vs torch float64; torch's own beside it):")
    echo(f"  {'shape':>12} {'dtype':>9} {'function':>11} {'pass':>8} {'ours':>9} {'torch':>9}  ok")
    all_passed = True
    for shape, dtype in cases:
        for log in (False, True):
            for result in check_case(shape, dtype, device, log):
                all_passed &= result.passed
                echo(f"  {'x'.join(map(str, shape)):>12} {result.dtype:>9} {result.function:>11} {result.direction:>8} "
                     f"{result.error:9.2e} {result.torch_error:9.2e}  {'yes' if result.passed else 'NO'}")
    x = torch.randn(256, 1024, device=device)
    ours = median_seconds(lambda: portable_softmax.softmax(x, -1), device)
    theirs = median_seconds(lambda: torch.softmax(x, -1), device)
    echo(f"\ntiming 256x1024 float32 on {record.name} (median): portable_softmax {ours * 1e3:.3f} ms, "
         f"torch.softmax {theirs * 1e3:.3f} ms")
    if record.backend == "interpreter":
        echo("  (CPU tensors run through Triton's interpreter: correct, not fast; use `portable-softmax bench` on a GPU)")
    echo(f"\n{'all checks passed' if all_passed else 'SOME CHECKS FAILED'}")
    return all_passed
