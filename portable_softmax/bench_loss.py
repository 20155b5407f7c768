"""``portable-softmax bench --cases loss``: the LLM loss, ``cross_entropy`` of (tokens, vocabulary)
logits, ours beside torch eager, torch.compile of ``F.cross_entropy``, and the peers that are
importable (Liger, FlagGems, QuACK; skipped quietly otherwise).

Per shape, dtype and implementation: the forward with ``loss.backward()`` (x a leaf, so the
gradient is written and kept), and the forward alone (no grad). The floor is copy bandwidth
(``x.clone()`` timed before and after the case, the faster kept): reading the logits once and
writing their gradient once, 2·N·V·b bytes, forward + backward; N·V·b forward. Reported: the
milliseconds, their fraction of the floor, and the peak memory beyond the inputs allocated while
forward + backward runs (the gradient included). Every implementation's loss is checked against
torch's in float64 first (and ours's gradient on the first rows); a wrong one is reported and
not timed. Targets: uniform over the vocabulary, every seventh ignored (-100).

``small`` runs stand-in shapes timed by the host's clock (a CPU runs them through Triton's
interpreter: a check that the benchmark runs, not a measurement). Nothing here needs a GPU to
import.
"""
from __future__ import annotations

import datetime
import logging
import platform
from collections.abc import Callable
from typing import Any, Optional

import torch
import torch.nn.functional as F

import portable_softmax
from portable_softmax.selfcheck import relative_error

logger = logging.getLogger(__name__)

# (tokens, vocabulary) of the issue: Llama 2, GPT-2, Llama 3, Qwen 2, Gemma-sized vocabularies.
SHAPES = [(8192, 32000), (4096, 50257), (8192, 128256), (4096, 151936), (4096, 256000), (16384, 128256)]
SMALL_SHAPES = [(8, 781), (4, 3001)]
# The largest relative error of the loss accepted (the loss is rounded to the input's dtype).
LOSS_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
CHECK_ROWS = 64
IGNORED_EVERY = 7

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def implementations(peers: set[str]) -> dict[str, Loss]:
    """Ours and the importable peers among ``peers``, each as ``loss(x, target)`` ('mean')."""
    found: dict[str, Loss] = {"ours": lambda x, t: portable_softmax.cross_entropy(x, t)}
    if "inplace" in peers:
        # The gradient written over the logits (as Liger writes it): no memory for it beyond them.
        found["ours-inplace"] = lambda x, t: portable_softmax.cross_entropy(x, t, inplace_backward=True)
    if "torch" in peers:
        found["torch"] = lambda x, t: F.cross_entropy(x, t)
    if "compile" in peers:
        from torch._dynamo import config as dynamo_config

        # A graph per shape and dtype: dynamo's default limit would leave the later ones eager.
        dynamo_config.cache_size_limit = 256
        if hasattr(dynamo_config, "recompile_limit"):
            dynamo_config.recompile_limit = 256
        found["compile"] = torch.compile(lambda x, t: F.cross_entropy(x, t), dynamic=False)
    if "liger" in peers:
        try:
            from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction

            found["liger"] = lambda x, t: LigerCrossEntropyFunction.apply(x, t, None)[0]
        except ImportError as error:
            logger.info("liger unavailable: %s", error)
    if "flaggems" in peers:
        try:
            import flag_gems

            found["flaggems"] = lambda x, t: flag_gems.cross_entropy_loss(x, t)
        except ImportError as error:
            logger.info("flaggems unavailable: %s", error)
    if "quack" in peers:
        try:
            from quack.cross_entropy import cross_entropy as quack

            found["quack"] = lambda x, t: quack(x, t, reduction="mean")
        except (ImportError, OSError, RuntimeError) as error:  # CuTe DSL loads CUDA libraries on import
            logger.info("quack unavailable: %s", error)
    return found


def _reference(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """torch's 'mean' loss in float64, a block of rows at a time (a float64 copy of the whole
    would not fit beside the largest logits)."""
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    for start in range(0, x.shape[0], 1024):
        total += F.cross_entropy(x[start:start + 1024].double(), target[start:start + 1024], reduction="sum")
    return total / (target != -100).sum()


def _gradient_error(x: torch.Tensor, target: torch.Tensor, loss: Loss) -> float:
    """The relative error of ``loss``'s gradient on the first rows, against torch's in float64."""
    leaf = x.detach().clone().requires_grad_()
    loss(leaf, target).backward()
    head = x[:CHECK_ROWS].detach().double().requires_grad_()
    (F.cross_entropy(head, target[:CHECK_ROWS], reduction="sum") / (target != -100).sum()).backward()
    return relative_error(leaf.grad[:CHECK_ROWS], head.grad)


def _peak_extra_mb(step: Callable[[], Any], leaf: torch.Tensor, device: torch.device) -> Optional[float]:
    """The most memory allocated while ``step`` runs beyond what was allocated before it, in MiB:
    ``leaf``'s gradient is dropped first, so that the gradient the step writes (and anything the
    implementation keeps for its backward) counts, whichever implementation allocates it."""
    if device.type != "cuda":
        return None
    leaf.grad = None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    step()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def run(peers: set[str], device: Optional[str] = None, small: bool = False,
        timer: Optional[Callable[[Callable[[], Any]], float]] = None,
        dtypes: Optional[list[torch.dtype]] = None,
        shapes: Optional[list[tuple[int, int]]] = None) -> dict[str, Any]:
    """Check, then time, every implementation on every shape and dtype; the JSON-ready results.
    ``timer(fn)``: milliseconds per call (``bench_cases.device_timer()`` by default); ``shapes``:
    (tokens, vocabulary) pairs instead of ``SHAPES`` (or ``SMALL_SHAPES`` with ``small``)."""
    from portable_softmax import bench_cases

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    timer = timer or bench_cases.device_timer()
    found = implementations(peers)
    bench_cases.warm_up(device, timer)
    rows: list[dict[str, Any]] = []
    for dtype in dtypes or [torch.bfloat16, torch.float32]:
        for n_rows, n_cols in shapes or (SMALL_SHAPES if small else SHAPES):
            rows += _case(found, n_rows, n_cols, dtype, device, timer)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    return {"kind": "loss", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "device_name": name,
            "torch": torch.__version__, "small": small, "rows": rows}


def _case(found: dict[str, Loss], n_rows: int, n_cols: int, dtype: torch.dtype, device: torch.device,
          timer: Callable[[Callable[[], Any]], float]) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    x0 = (torch.randn(n_rows, n_cols, device=device) * 2).to(dtype)
    target = torch.randint(0, n_cols, (n_rows,), device=device)
    target[::IGNORED_EVERY] = -100
    expected = _reference(x0, target)
    copy_ms = [timer(lambda: x0.clone())]
    rows = []
    for name, loss in found.items():
        row: dict[str, Any] = {"impl": name, "dtype": str(dtype).removeprefix("torch."), "N": n_rows, "V": n_cols}
        try:
            with torch.no_grad():
                row["loss_relerr"] = relative_error(loss(x0, target), expected)
            if name == "ours":
                row["grad_relerr"] = _gradient_error(x0, target, loss)
            if row["loss_relerr"] > LOSS_TOLERANCE[dtype]:
                row["error"] = f"loss off by {row['loss_relerr']:.1e} (relative): not timed"
                rows.append(row)
                continue
            x = x0.clone().requires_grad_()

            def step() -> None:
                x.grad = None
                loss(x, target).backward()

            step()
            row["peak_extra_MB"] = _peak_extra_mb(step, x, device)
            row["fwdbwd_ms"] = timer(step)
            with torch.no_grad():
                row["fwd_ms"] = timer(lambda: loss(x0, target))
            del x
        except Exception as error:  # a peer that fails on a shape is reported, not fatal
            row["error"] = " ".join(repr(error).split())[:300]
        rows.append(row)
    copy_ms.append(timer(lambda: x0.clone()))
    for row in rows:
        row["copy_ms"] = min(copy_ms)
        if "fwdbwd_ms" in row:
            # clone reads and writes N·V·b: forward + backward's floor; the forward's is half.
            row["of_floor"] = row["copy_ms"] / row["fwdbwd_ms"]
            row["fwd_of_floor"] = row["copy_ms"] / 2 / row["fwd_ms"]
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def table(results: dict[str, Any]) -> str:
    """One line per shape, dtype and implementation."""
    lines = [f"cross_entropy on {results['device_name']} (torch {results['torch']}): forward + backward and forward "
             f"alone, fraction of the copy floor; peak memory beyond the inputs",
             f"{'impl':12s} {'dtype':9s} {'N x V':>15s} {'fwd+bwd ms':>11s} {'of floor':>9s} {'fwd ms':>8s} "
             f"{'of floor':>9s} {'extra MB':>9s} {'loss err':>9s}"]
    for row in results["rows"]:
        if "error" in row:
            lines.append(f"{row['impl']:12s} {row['dtype']:9s} {row['N']:>7d}x{row['V']:<7d} {row['error']}")
            continue
        extra = row.get("peak_extra_MB")
        lines.append(f"{row['impl']:12s} {row['dtype']:9s} {row['N']:>7d}x{row['V']:<7d} {row['fwdbwd_ms']:11.3f} "
                     f"{row['of_floor']:9.2f} {row['fwd_ms']:8.3f} {row['fwd_of_floor']:9.2f} "
                     f"{'' if extra is None else f'{extra:9.0f}':>9s} {row['loss_relerr']:9.1e}")
    return "\n".join(lines)


def plot(results: dict[str, Any], path) -> Optional[Any]:
    """Fraction of the floor per shape: a row of panels per dtype, forward + backward and forward
    alone; None where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    timed = [row for row in results["rows"] if "fwdbwd_ms" in row]
    dtypes = sorted({row["dtype"] for row in timed})
    impls = list(dict.fromkeys(row["impl"] for row in timed))
    if not timed:
        return None
    figure, axes = plt.subplots(len(dtypes), 2, figsize=(14, 3.5 * len(dtypes)), squeeze=False)
    for i, dtype in enumerate(dtypes):
        shapes = list(dict.fromkeys((row["N"], row["V"]) for row in timed if row["dtype"] == dtype))
        for j, (key, title) in enumerate((("of_floor", "forward + backward"), ("fwd_of_floor", "forward"))):
            axis = axes[i][j]
            width = 0.8 / max(len(impls), 1)
            for k, impl in enumerate(impls):
                values = {(row["N"], row["V"]): row[key] for row in timed
                          if row["dtype"] == dtype and row["impl"] == impl}
                axis.bar([s + k * width for s in range(len(shapes))], [values.get(shape, 0.0) for shape in shapes],
                         width, label=impl)
            axis.set_xticks([s + 0.4 - width / 2 for s in range(len(shapes))])
            axis.set_xticklabels([f"{n}x{v}" for n, v in shapes], fontsize=8)
            axis.set_ylim(0, 1.05)
            axis.set_title(f"{dtype}, {title}")
            axis.set_ylabel("fraction of copy floor")
    axes[0][0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return path
