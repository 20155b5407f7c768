"""``portable-softmax bench --cases head``: the LLM head and its loss, ``cross_entropy(hidden @
weight.T, target)`` with the gradients of hidden and weight, ours (``linear_cross_entropy``)
beside torch eager (the matmul, then ``F.cross_entropy`` of the logits in float32, as Hugging Face
models do), torch.compile of it, and the importable peers: Liger's fused linear cross-entropy,
Cut Cross-Entropy, QuACK's chunked one (skipped quietly where not importable).

Per shape (bfloat16, tokens x hidden -> vocabulary): forward + backward time, the peak memory
allocated beyond the inputs while it runs (the gradients of hidden and weight included, and
also given without them), and the relative error of the loss and of both gradients against torch
in float32 (computed in blocks of tokens). The target line: 1.10 x (the forward's and backward's
three matmuls timed alone, into buffers of their outputs, + the loss at copy speed: the (tokens,
vocabulary) logits read once and their gradient written once, a ``clone`` of them). Targets:
uniform over the vocabulary, every seventh ignored (-100).

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

# (tokens, hidden, vocabulary): Llama 3's head (128256) at 8K and 16K tokens, Qwen 2's (151936).
SHAPES = [(8192, 4096, 128256), (16384, 4096, 128256), (16384, 4096, 151936)]
SMALL_SHAPES = [(40, 32, 301), (70, 16, 1000)]
IGNORED_EVERY = 7
TARGET_FACTOR = 1.10
# The largest relative error of the loss accepted before timing (bfloat16 logits).
LOSS_TOLERANCE = 1e-2
REFERENCE_ROWS = 2048

Head = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _torch_head(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy((h @ w.T).float(), t)


def implementations(peers: set[str]) -> dict[str, Head]:
    """Ours and the importable peers among ``peers``, each as ``loss(hidden, weight, target)``
    ('mean', ignore_index -100)."""
    found: dict[str, Head] = {
        "ours": lambda h, w, t: portable_softmax.linear_cross_entropy(h, w, t),
        # The weight's gradient summed in its own dtype: no float32 copy of it (Liger's memory).
        "ours-bf16acc": lambda h, w, t: portable_softmax.linear_cross_entropy(h, w, t, accumulate_dtype=w.dtype)}
    if "torch" in peers:
        found["torch"] = _torch_head
    if "compile" in peers:
        from torch._dynamo import config as dynamo_config

        dynamo_config.cache_size_limit = 256
        if hasattr(dynamo_config, "recompile_limit"):
            dynamo_config.recompile_limit = 256
        found["compile"] = torch.compile(_torch_head, dynamic=False)
    if "liger" in peers:
        try:
            from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

            found["liger"] = lambda h, w, t: LigerFusedLinearCrossEntropyFunction.apply(h, w, t)[0]
        except ImportError as error:
            logger.info("liger unavailable: %s", error)
    if "cce" in peers:
        try:
            from cut_cross_entropy import linear_cross_entropy as cce

            found["cce"] = lambda h, w, t: cce(h, w, t)
        except ImportError as error:
            logger.info("cut cross-entropy unavailable: %s", error)
    if "quack" in peers:
        try:
            from quack.linear_cross_entropy import chunked_linear_cross_entropy

            found["quack"] = lambda h, w, t: chunked_linear_cross_entropy(h, w, t)
        except ImportError as error:
            logger.info("quack unavailable: %s", error)
        except Exception as error:  # noqa: BLE001 (CuTe DSL loads CUDA libraries and traces kernels on import)
            # Installed but broken here (QuACK 0.6.5 on the H100 image, 2026-11-25: a CuTe DSL
            # ContextVar with no semantic key): its row reports the error rather than vanishing.
            found["quack"] = _failed(error)
    return found


def _failed(error: Exception) -> Head:
    """A peer that could not be set up: each call raises ``error``'s text, so its row says why."""
    message = " ".join(repr(error).split())[:200]

    def head(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        raise RuntimeError(f"setup failed: {message}")
    return head


def _reference(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """torch's loss and the gradients of hidden and weight in float32 (the 'mean' over the counted
    targets), a block of tokens at a time: float32 logits of the whole would not fit beside the
    peers' runs."""
    counted = (target != -100).sum().float()
    wide = weight.float().requires_grad_()
    total = torch.zeros((), device=hidden.device)
    grad_hidden = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device)
    for start in range(0, hidden.shape[0], REFERENCE_ROWS):
        rows = hidden[start:start + REFERENCE_ROWS].float().requires_grad_()
        part = F.cross_entropy(rows @ wide.T, target[start:start + REFERENCE_ROWS], reduction="sum") / counted
        part.backward()
        total += part.detach()
        grad_hidden[start:start + REFERENCE_ROWS] = rows.grad
    return total, grad_hidden, wide.grad


def _peak_extra_mb(step: Callable[[], Any], leaves: tuple[torch.Tensor, ...], device: torch.device
                   ) -> Optional[float]:
    """The most memory allocated while ``step`` runs beyond what was allocated before it, in MiB,
    the leaves' gradients dropped first (so that they count), or None off CUDA."""
    if device.type != "cuda":
        return None
    for leaf in leaves:
        leaf.grad = None
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    step()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def _floor(hidden: torch.Tensor, weight: torch.Tensor, timer: Callable[[Callable[[], Any]], float]
           ) -> dict[str, float]:
    """The milliseconds of the three matmuls alone (into kept buffers) and of the logits' copy."""
    logits = torch.empty(hidden.shape[0], weight.shape[0], dtype=hidden.dtype, device=hidden.device).normal_()
    grad_hidden, grad_weight = torch.empty_like(hidden), torch.empty_like(weight)

    def matmuls() -> None:
        torch.mm(hidden, weight.t(), out=logits)
        torch.mm(logits, weight, out=grad_hidden)
        torch.mm(logits.t(), hidden, out=grad_weight)

    found = {"matmul_ms": timer(matmuls), "copy_ms": timer(lambda: logits.clone())}
    found["floor_ms"] = found["matmul_ms"] + found["copy_ms"]
    found["target_ms"] = TARGET_FACTOR * found["floor_ms"]
    return found


def run(peers: set[str], device: Optional[str] = None, small: bool = False,
        timer: Optional[Callable[[Callable[[], Any]], float]] = None,
        progress: Optional[Callable[[str], None]] = None) -> dict[str, Any]:
    """Check, then time, every implementation on every shape; the JSON-ready results.
    ``timer(fn)``: milliseconds per call (``bench_cases.device_timer()`` by default);
    ``progress(line)``: each shape's floor and each implementation's line as it is measured (a
    run cut short still shows what it measured)."""
    from portable_softmax import bench_cases

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    timer = timer or bench_cases.device_timer()
    found = implementations(peers)
    bench_cases.warm_up(device, timer)
    rows: list[dict[str, Any]] = []
    floors: list[dict[str, Any]] = []
    for n_rows, features, n_classes in SMALL_SHAPES if small else SHAPES:
        floor, case_rows = _case(found, n_rows, features, n_classes, device, timer, progress or (lambda line: None))
        floors.append(floor)
        rows += case_rows
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    return {"kind": "head", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "device_name": name,
            "torch": torch.__version__, "small": small, "floors": floors, "rows": rows}


def _case(found: dict[str, Head], n_rows: int, features: int, n_classes: int, device: torch.device,
          timer: Callable[[Callable[[], Any]], float], progress: Callable[[str], None]
          ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    torch.manual_seed(0)
    shape = {"N": n_rows, "H": features, "V": n_classes}
    hidden = torch.randn(n_rows, features, device=device).to(torch.bfloat16)
    weight = (torch.randn(n_classes, features, device=device) * 0.02).to(torch.bfloat16)
    target = torch.randint(0, n_classes, (n_rows,), device=device)
    target[::IGNORED_EVERY] = -100
    floor = {**shape, **_floor(hidden, weight, timer)}
    progress(floor_line(floor))
    expected, expected_hidden, expected_weight = _reference(hidden, weight, target)
    gradients_mb = (hidden.numel() + weight.numel()) * hidden.element_size() / 2**20
    rows = []
    for name, loss in found.items():
        row: dict[str, Any] = {"impl": name, **shape}
        try:
            h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
            value = loss(h, w, target)
            row["loss_relerr"] = relative_error(value, expected)
            if row["loss_relerr"] > LOSS_TOLERANCE:
                row["error"] = f"loss off by {row['loss_relerr']:.1e} (relative): not timed"
                rows.append(row)
                progress(row_line(row))
                continue
            value.backward()
            row["grad_hidden_relerr"] = relative_error(h.grad, expected_hidden)
            row["grad_weight_relerr"] = relative_error(w.grad, expected_weight)
            del value

            def step() -> None:
                h.grad = w.grad = None
                loss(h, w, target).backward()

            row["peak_extra_MB"] = _peak_extra_mb(step, (h, w), device)
            if row["peak_extra_MB"] is not None:
                row["beyond_grads_MB"] = row["peak_extra_MB"] - gradients_mb
            row["fwdbwd_ms"] = timer(step)
            row["of_target"] = floor["target_ms"] / row["fwdbwd_ms"]
            del h, w
        except Exception as error:  # a peer that fails on a shape is reported, not fatal
            row["error"] = " ".join(repr(error).split())[:300]
        rows.append(row)
        progress(row_line(row))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return floor, rows


COLUMNS = (f"{'impl':12s} {'fwd+bwd ms':>11s} {'of target':>10s} {'extra MB':>9s} {'beyond grads':>13s} "
           f"{'loss err':>9s} {'dh err':>8s} {'dW err':>8s}")


def floor_line(floor: dict[str, Any]) -> str:
    """A shape's floor and target."""
    return (f"{floor['N']} tokens x {floor['H']} -> {floor['V']}: matmuls {floor['matmul_ms']:.2f} ms + copy "
            f"{floor['copy_ms']:.2f} ms = {floor['floor_ms']:.2f} ms; target {floor['target_ms']:.2f} ms")


def row_line(row: dict[str, Any]) -> str:
    """An implementation's line under ``COLUMNS``."""
    if "error" in row:
        return f"{row['impl']:12s} {row['error']}"
    extra, beyond = row.get("peak_extra_MB"), row.get("beyond_grads_MB")
    return (f"{row['impl']:12s} {row['fwdbwd_ms']:11.2f} {row['of_target']:10.2f} "
            f"{'-' if extra is None else f'{extra:.0f}':>9s} {'-' if beyond is None else f'{beyond:.0f}':>13s} "
            f"{row['loss_relerr']:9.1e} {row['grad_hidden_relerr']:8.1e} {row['grad_weight_relerr']:8.1e}")


def table(results: dict[str, Any]) -> str:
    """Per shape: the floor and target; one line per implementation."""
    lines = [f"linear_cross_entropy on {results['device_name']} (torch {results['torch']}), bfloat16: forward + "
             f"backward; 'of target' = {TARGET_FACTOR:.2f} x (matmuls alone + the loss at copy speed) / time (>= 1 "
             f"meets it); peak memory beyond the inputs (and beyond their gradients); relative error against torch "
             f"in float32"]
    for floor in results["floors"]:
        key = (floor["N"], floor["H"], floor["V"])
        lines += ["", floor_line(floor), COLUMNS]
        lines += [row_line(row) for row in results["rows"] if (row["N"], row["H"], row["V"]) == key]
    return "\n".join(lines)


def plot(results: dict[str, Any], path) -> Optional[Any]:
    """Forward + backward milliseconds per shape and implementation, the target as a line; None
    where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    timed = [row for row in results["rows"] if "fwdbwd_ms" in row]
    if not timed:
        return None
    floors = results["floors"]
    impls = list(dict.fromkeys(row["impl"] for row in timed))
    figure, axes = plt.subplots(1, len(floors), figsize=(5 * len(floors), 4), squeeze=False)
    for axis, floor in zip(axes[0], floors):
        key = (floor["N"], floor["H"], floor["V"])
        values = {row["impl"]: row["fwdbwd_ms"] for row in timed if (row["N"], row["H"], row["V"]) == key}
        axis.bar(range(len(impls)), [values.get(impl, 0.0) for impl in impls],
                 color=[f"C{i}" for i in range(len(impls))])
        axis.axhline(floor["target_ms"], color="black", linestyle="--", linewidth=0.8, label="target")
        axis.set_xticks(range(len(impls)))
        axis.set_xticklabels(impls, fontsize=8)
        axis.set_title(f"{floor['N']} x {floor['H']} -> {floor['V']}", fontsize=9)
        axis.set_ylabel("forward + backward, ms")
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
