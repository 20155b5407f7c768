"""``enable()`` on one GPU (issue 34, item 5): a training step of a small and a large Transformer
with and without it, the microseconds of single calls, and where the package's kernel starts to
pay for its host cost (the crossover that ``Tuning.enable_min_bytes`` should hold).

Three settings throughout:

* ``torch``: no enable();
* ``enable``: ``enabled()`` with the device's ``enable_min_bytes`` (torch keeps smaller calls);
* ``enable, all``: ``enabled()`` with ``enable_min_bytes = 0``: every call served.

Step: forward and backward of the model (no optimizer), bf16, CUDA events around each step after
a synchronize (so that a host-bound step shows as such), median of ``--steps`` after warm-up.
Per call: wall microseconds per call, ``calls`` back to back between synchronizes (as an eager
model pays; ``host_time.per_call_us``), least of three. The sweep: forward (torch.softmax) and
backward (``torch._softmax_backward_data``) of rows of 4096, 16 KiB to 256 MiB of input.

    python3 benchmarks/enable_bench.py [--steps 10] [--out results.json]
    python3 benchmarks/enable_bench.py --device cpu --smoke    # the script itself, tiny sizes
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's package, not an installed one

import portable_softmax as ps  # noqa: E402
from portable_softmax.device import device_record  # noqa: E402
from portable_softmax.host_time import per_call_us  # noqa: E402
from portable_softmax.tuning import TUNING, replace, tuning_for  # noqa: E402

DEVICE = torch.device("cuda")


def synchronize() -> None:
    if DEVICE.type != "cpu":
        getattr(torch, DEVICE.type).synchronize()


@contextlib.contextmanager
def min_bytes(value: int | None):
    """The device's ``enable_min_bytes`` set to ``value`` for the block (None: as it is)."""
    if value is None:
        yield
        return
    record = device_record(DEVICE)
    key = (record.backend, record.name)
    before = dict.get(TUNING, key)
    TUNING[key] = replace(tuning_for(record), enable_min_bytes=value)
    try:
        yield
    finally:
        if before is None:
            del TUNING[key]
        else:
            TUNING[key] = before


SETTINGS = {"torch": None, "enable": "default", "enable, all": 0}


@contextlib.contextmanager
def setting(name: str):
    """The block under one of SETTINGS; yields the Served record (None without enable)."""
    value = SETTINGS[name]
    if value is None:
        yield None
        return
    with min_bytes(None if value == "default" else value), ps.enabled([DEVICE.type]) as served:
        yield served


# ----------------------------------------------------------------------------------------------
# The models: hand-written attention, so that its softmax is an aten call, and an LM head.
# ----------------------------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
        batch, seq, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, seq, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(d // self.heads)) + causal
        attention = torch.softmax(scores, dim=-1) @ v
        x = x + self.proj(attention.transpose(1, 2).reshape(batch, seq, d))
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    def __init__(self, layers: int, d: int, heads: int, vocab: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens[:, :-1])
        seq = x.shape[1]
        causal = torch.full((seq, seq), -math.inf, device=x.device, dtype=x.dtype).triu(1)
        for block in self.blocks:
            x = block(x, causal)
        return F.cross_entropy(self.head(self.norm(x)).flatten(0, 1), tokens[:, 1:].flatten())


MODELS = {
    "small (2 x d256, 4 heads, seq 128, batch 8)": dict(layers=2, d=256, heads=4, seq=128, batch=8, vocab=32000),
    "large (4 x d2048, 16 heads, seq 2048, batch 4)": dict(layers=4, d=2048, heads=16, seq=2048, batch=4,
                                                            vocab=32000),
}
SMOKE_MODELS = {"smoke (1 x d32, 2 heads, seq 8, batch 2)": dict(layers=1, d=32, heads=2, seq=8, batch=2, vocab=64)}


def step_ms(model: Transformer, tokens: torch.Tensor, steps: int, warmup: int = 3) -> tuple[float, float]:
    """Median milliseconds of a forward and backward step, and the last step's loss."""
    def step() -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        loss = model.loss(tokens)
        loss.backward()
        return loss

    for _ in range(warmup):
        step()
    times = []
    events = None if DEVICE.type == "cpu" else getattr(torch, DEVICE.type).Event  # torch.cuda.Event, torch.npu.Event
    for _ in range(steps):
        synchronize()
        if events is None:  # the CPU: the host clock
            started = time.perf_counter()
            loss = step()
            times.append((time.perf_counter() - started) * 1e3)
            continue
        start, end = events(enable_timing=True), events(enable_timing=True)
        start.record()
        loss = step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), loss.item()


def models(steps: int, sizes: dict[str, dict]) -> list[dict]:
    rows = []
    for name, size in sizes.items():
        torch.manual_seed(0)
        model = Transformer(size["layers"], size["d"], size["heads"], size["vocab"]).to(DEVICE, torch.bfloat16)
        tokens = torch.randint(0, size["vocab"], (size["batch"], size["seq"] + 1), device=DEVICE)
        for label in SETTINGS:
            with setting(label) as served:
                ms, loss = step_ms(model, tokens, steps)
                calls = served.calls if served is not None else 0
            # Calls served in one step: the warm-up and timed steps together, divided.
            rows.append({"model": name, "setting": label, "step_ms": ms, "loss": loss,
                         "served_per_step": calls / (steps + 3), "by_op": dict(served.by_op) if served else {}})
        del model
        if DEVICE.type == "cuda":
            torch.cuda.empty_cache()
    return rows


# ----------------------------------------------------------------------------------------------
# Single calls.
# ----------------------------------------------------------------------------------------------

def us_per_call(step, calls: int) -> float:
    """Least of three back-to-back runs (others' work on the host only ever adds); one on the CPU."""
    cpu = DEVICE.type == "cpu"
    return min(per_call_us(step, calls, synchronize, warmup=1 if cpu else 20) for _ in range(1 if cpu else 3))


CALL_SHAPES = [(64, 4096), (4096, 32000)]
SMOKE_CALL_SHAPES = [(4, 64)]


def single_calls(shapes: list[tuple[int, int]]) -> list[dict]:
    rows = []
    for shape in shapes:
        for dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(shape, device=DEVICE, dtype=dtype)
            y = torch.softmax(x, -1)
            dy = torch.randn_like(y)
            calls = 3 if DEVICE.type == "cpu" else 200 if x.numel() < 2**24 else 30
            row = {"shape": list(shape), "dtype": str(dtype)[6:]}
            for label in SETTINGS:
                with setting(label):
                    row[f"{label} fwd_us"] = us_per_call(lambda: torch.softmax(x, -1), calls)
                    row[f"{label} bwd_us"] = us_per_call(lambda: torch._softmax_backward_data(dy, y, -1, dtype), calls)
            row["ps.softmax fwd_us"] = us_per_call(lambda: ps.softmax(x, -1), calls)
            rows.append(row)
    return rows


def crossover(dtype: torch.dtype, largest: int) -> dict:
    """Per-call microseconds of torch and of every call served, forward and backward, rows of 4096
    from 16 KiB to ``largest`` bytes of input; the smallest size from which the served call is at
    least as fast at every larger size."""
    sizes, found = [], {"forward": [], "backward": []}
    size = 16 * 2**10
    while size <= largest:
        rows = max(1, size // (4096 * torch.empty(0, dtype=dtype).element_size()))
        x = torch.randn(rows, 4096, device=DEVICE, dtype=dtype)
        y = torch.softmax(x, -1)
        dy = torch.randn_like(y)
        calls = 3 if DEVICE.type == "cpu" else 200 if size <= 16 * 2**20 else 30
        steps = {"forward": lambda: torch.softmax(x, -1),
                 "backward": lambda: torch._softmax_backward_data(dy, y, -1, dtype)}
        for direction, step in steps.items():
            timing = {}
            for label in ("torch", "enable, all"):
                with setting(label):
                    timing[label] = us_per_call(step, calls)
            found[direction].append(timing)
        sizes.append(x.numel() * x.element_size())
        size *= 2
    result = {"dtype": str(dtype)[6:], "bytes": sizes, **found}
    for direction in ("forward", "backward"):
        timings = found[direction]
        start = None
        for index in range(len(sizes) - 1, -1, -1):
            if timings[index]["enable, all"] <= timings[index]["torch"]:
                start = sizes[index]
            else:
                break
        result[f"{direction}_from_bytes"] = start
    return result


# ----------------------------------------------------------------------------------------------
# Report.
# ----------------------------------------------------------------------------------------------

def report(results: dict) -> str:
    lines = [f"{results['device']} | torch {results['torch']} | enable_min_bytes {results['enable_min_bytes']}", "",
             "training step (forward + backward), bf16, median ms; softmax calls served per step",
             f"{'model':<48} {'setting':<12} {'ms':>9} {'served':>7} {'loss':>9}"]
    for row in results["models"]:
        lines.append(f"{row['model']:<48} {row['setting']:<12} {row['step_ms']:9.2f} {row['served_per_step']:7.1f} "
                     f"{row['loss']:9.4f}")
    lines += ["", "microseconds per call, back to back (torch.softmax forward; torch._softmax_backward_data)",
              f"{'shape':>12} {'dtype':>9} " + " ".join(f"{label + ' ' + d:>17}" for label in SETTINGS
                                                       for d in ("fwd", "bwd")) + f" {'ps.softmax fwd':>15}"]
    for row in results["single_calls"]:
        cells = " ".join(f"{row[f'{label} {d}_us']:17.1f}" for label in SETTINGS for d in ("fwd", "bwd"))
        shape = "x".join(map(str, row["shape"]))
        lines.append(f"{shape:>12} {row['dtype']:>9} {cells} {row['ps.softmax fwd_us']:15.1f}")
    for sweep in results["crossover"]:
        lines += ["", f"crossover, {sweep['dtype']}, rows of 4096: us per call, torch / every call served",
                  f"{'bytes':>12} {'fwd torch':>10} {'fwd ours':>10} {'bwd torch':>10} {'bwd ours':>10}"]
        for index, size in enumerate(sweep["bytes"]):
            f, b = sweep["forward"][index], sweep["backward"][index]
            lines.append(f"{size:>12} {f['torch']:10.1f} {f['enable, all']:10.1f} {b['torch']:10.1f} "
                         f"{b['enable, all']:10.1f}")
        lines.append(f"served calls at least as fast from: forward {sweep['forward_from_bytes']} bytes, "
                     f"backward {sweep['backward_from_bytes']} bytes")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per model and setting (default 10)")
    parser.add_argument("--out", default="", help="also write the results as JSON here")
    parser.add_argument("--device", default="cuda", help="cuda (default), npu, or cpu with --smoke")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script, measures nothing")
    args = parser.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    if DEVICE.type != "cpu" and not getattr(torch, DEVICE.type).is_available():
        raise SystemExit(f"enable_bench.py: no {DEVICE.type} device here; --device cpu --smoke checks the script")
    largest = 64 * 2**10 if args.smoke else 256 * 2**20
    results = {"device": device_record(DEVICE).name, "torch": torch.__version__,
               "enable_min_bytes": tuning_for(device_record(DEVICE)).enable_min_bytes,
               "models": models(args.steps, SMOKE_MODELS if args.smoke else MODELS),
               "single_calls": single_calls(SMOKE_CALL_SHAPES if args.smoke else CALL_SHAPES),
               "crossover": [crossover(torch.bfloat16, largest), crossover(torch.float32, largest)]}
    print(report(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
