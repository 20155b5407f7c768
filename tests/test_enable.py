"""``enable()`` / ``enabled()``: torch's own softmax calls, in whole models, served by the kernels.

What each test compares: results with torch's own (float64 references, relative error of the
whole tensor), and the calls served with the calls torch's profiler records in a run without
``enable`` (an independent count that sees nested calls too: ``_safe_softmax`` inside SDPA's math
path calls ``_softmax``, which a dispatch mode would not see). CPU tests name ``devices=["cpu"]``
(kernels through Triton's interpreter: tiny shapes); accelerator tests skip where none is present.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import math
import sys
import threading
import types
from collections import Counter

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import portable_softmax as ps
from portable_softmax import op_calls
from portable_softmax.device import device_record
from portable_softmax.selfcheck import relative_error
from portable_softmax.tuning import TUNING, replace, tuning_for

from conftest import DEVICES

# portable_softmax.enable is the function; the module is reached through sys.modules.
enable_module = importlib.import_module("portable_softmax.enable")

SOFTMAX_OPS = ("_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data")
ACCELERATORS = [param for param in DEVICES if param.values[0] != "cpu"]
HAS_LOSS = importlib.util.find_spec("portable_softmax.loss") is not None


@pytest.fixture(autouse=True)
def _disabled():
    """Every test starts and ends with torch's own kernels."""
    ps.disable()
    yield
    ps.disable()


def torch_calls(run) -> Counter:
    """The calls of the four operators that ``run()`` makes, as torch's profiler records them."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        run()
    return Counter(name for event in profile.events()
                   if (name := event.name.removeprefix("aten::")) in SOFTMAX_OPS)


def registered_here() -> bool:
    """Whether a kernel of ``enable.py`` is registered for aten::_softmax (the dispatcher's own
    listing names the file each registration came from)."""
    return "enable.py" in torch._C._dispatch_dump("aten::_softmax")


@contextlib.contextmanager
def min_bytes(device: str, value: int):
    """``Tuning.enable_min_bytes`` of ``device``'s chip set to ``value`` for the block."""
    record = device_record(device)
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


# ----------------------------------------------------------------------------------------------
# A small Transformer with every way a model meets softmax.
# ----------------------------------------------------------------------------------------------

class Block(nn.Module):
    """Hand-written attention (torch.softmax over an additive causal mask), SDPA's math path
    (``_safe_softmax``), nn.MultiheadAttention with its weights, an nn.Softmax gate, and
    nn.TransformerEncoderLayer (whose fused attention computes no aten softmax: counted as such)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(2 * d, d)
        self.mha = nn.MultiheadAttention(d, heads, batch_first=True)
        self.gate = nn.Sequential(nn.Linear(d, 3), nn.Softmax(dim=-1))
        self.encoder = nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.0, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        causal = torch.full((seq, seq), -math.inf, device=x.device, dtype=x.dtype).triu(1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads) + causal
        hand = torch.softmax(scores, dim=-1) @ v
        with sdpa_kernel(SDPBackend.MATH):
            fused = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        both = torch.cat([hand, fused], -1).transpose(1, 2).reshape(batch, seq, 2 * d)
        x = x + self.out(both)
        attended, weights = self.mha(x, x, x, need_weights=True)
        x = x + attended + weights.sum(-1, keepdim=True)
        x = x * self.gate(x)[..., :1]
        return self.encoder(x)


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 11, d: int = 16, heads: int = 2, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens[:, :-1])
        for block in self.blocks:
            x = block(x)
        log_probs = F.log_softmax(self.head(x), dim=-1)
        return F.nll_loss(log_probs.flatten(0, 1), tokens[:, 1:].flatten())


def _step(model: TinyTransformer, tokens: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    loss = model.loss(tokens)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def _check_model(device: str) -> None:
    torch.manual_seed(0)
    model = TinyTransformer().to(device)
    tokens = torch.randint(0, 11, (2, 6), device=device)
    expected = torch_calls(lambda: _step(model, tokens))
    # Four softmax calls a block and the head's log_softmax, forward and backward; the encoder
    # layer's fused attention makes none.
    assert sum(expected.values()) >= 18, expected
    torch_loss, torch_grads = _step(model, tokens)
    with ps.enabled([device]) as served:
        loss, grads = _step(model, tokens)
    assert dict(served.by_op) == dict(expected)  # every softmax served, each once
    reference = model.double()
    reference_loss, reference_grads = _step(reference, tokens)
    # As close to the float64 model as torch's float32 run is.
    assert relative_error(loss, reference_loss) < max(4 * relative_error(torch_loss, reference_loss), 1e-6)
    for ours, theirs, exact in zip(grads, torch_grads, reference_grads):
        assert relative_error(ours, exact) < max(4 * relative_error(theirs, exact), 1e-5)


def test_a_model_s_loss_gradients_and_every_softmax_on_cpu():
    _check_model("cpu")


@pytest.mark.parametrize("device", ACCELERATORS)
def test_a_model_s_loss_gradients_and_every_softmax_on_accelerators(device):
    with min_bytes(device, 0):  # small calls served too, so that every one counts
        _check_model(device)


# ----------------------------------------------------------------------------------------------
# Front ends, half_to_float, cross-entropy.
# ----------------------------------------------------------------------------------------------

FRONT_ENDS = {
    "torch.softmax": lambda x: torch.softmax(x, 1),
    "torch.log_softmax": lambda x: torch.log_softmax(x, -1),
    "F.softmax": lambda x: F.softmax(x, dim=0),
    "F.log_softmax(dtype=float64)": lambda x: F.log_softmax(x, 1, dtype=torch.float64),
    "Tensor.softmax": lambda x: x.softmax(-1),
    "Tensor.log_softmax": lambda x: x.log_softmax(0),
    "nn.Softmax": lambda x: nn.Softmax(dim=1)(x),
    "nn.LogSoftmax": lambda x: nn.LogSoftmax(dim=-1)(x),
    "F.softmin": lambda x: F.softmin(x, dim=1),
    "transposed": lambda x: torch.softmax(x.t(), 0),
}


@pytest.mark.parametrize("front_end", FRONT_ENDS.values(), ids=FRONT_ENDS.keys())
def test_every_front_end_reaches_the_kernels_forward_and_backward(front_end):
    x = torch.randn(5, 781, requires_grad=True)
    cotangent = torch.randn(5, 781) if front_end is not FRONT_ENDS["transposed"] else torch.randn(781, 5)
    with ps.enabled(["cpu"]) as served:
        y = front_end(x)
        (dx,) = torch.autograd.grad(y, x, cotangent.to(y.dtype))
    assert served.calls == 2 and len(served.by_op) == 2  # one forward, one backward
    exact = x.detach().double().requires_grad_()
    reference = front_end(exact)
    (dx_exact,) = torch.autograd.grad(reference, exact, cotangent.double())
    assert y.dtype == front_end(x.detach()).dtype
    assert relative_error(y, reference) < 1e-5
    assert relative_error(dx, dx_exact) < 1e-5


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_half_to_float_gives_float32_from_float16_and_a_float16_gradient(log):
    op = torch.ops.aten._log_softmax if log else torch.ops.aten._softmax
    x = torch.randn(3, 50, dtype=torch.float16, requires_grad=True)
    with ps.enabled(["cpu"]) as served:
        y = op(x, -1, True)
        (dx,) = torch.autograd.grad(y, x, torch.ones_like(y) * torch.arange(50.0))
    assert (y.dtype, dx.dtype) == (torch.float32, torch.float16)
    assert served.calls == 2
    exact = x.detach().double().requires_grad_()
    reference = (torch.log_softmax if log else torch.softmax)(exact, -1)
    (dx_exact,) = torch.autograd.grad(reference, exact, torch.ones_like(reference) * torch.arange(50.0))
    assert relative_error(y, reference) < 1e-6
    assert relative_error(dx, dx_exact) < 2e-3  # float16 gradient
    with pytest.raises(RuntimeError, match="half to float"):  # torch's CPU kernel refuses it again
        op(x.detach(), -1, True)


def test_half_to_float_on_a_non_half_input_keeps_torch_s_error():
    with ps.enabled(["cpu"]) as served, pytest.raises(RuntimeError):
        torch.ops.aten._softmax(torch.randn(2, 3, dtype=torch.bfloat16), -1, True)
    assert served.calls == 0


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_double_backward_and_vmap_keep_torch_s_formulas(log):
    """torch's formulas stay in charge: the double backward (derivatives.yaml's, which calls the
    backward operator again) and vmap's batching rule reach the kernels, with torch's results."""
    call = torch.log_softmax if log else torch.softmax
    x = torch.randn(3, 7, dtype=torch.float64)
    v, w = torch.randn(3, 7, dtype=torch.float64), torch.randn(3, 7, dtype=torch.float64)

    def second(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x.clone().requires_grad_()
        (g,) = torch.autograd.grad(call(x, -1), x, v, create_graph=True)
        (gg,) = torch.autograd.grad((g * w).sum(), x)
        return gg, torch.func.vmap(lambda row: call(row, 0), in_dims=1)(x.detach())

    expected = second(x)
    with ps.enabled(["cpu"]) as served:
        found = second(x)
    assert served.calls == 4  # forward, backward, the backward again in the double backward, vmap
    for ours, theirs in zip(found, expected):
        assert relative_error(ours, theirs) < 1e-10


def test_f_cross_entropy_is_served():
    logits = torch.randn(6, 37, requires_grad=True)
    target = torch.randint(0, 37, (6,))
    target[2] = -100
    weight = torch.rand(37)
    call = lambda z: F.cross_entropy(z, target, weight=weight, label_smoothing=0.1)  # noqa: E731
    with ps.enabled(["cpu"]) as served:
        loss = call(logits)
        (dx,) = torch.autograd.grad(loss, logits)
    if HAS_LOSS:
        assert dict(served.by_op) == {"cross_entropy_loss": 1}
    else:  # through its log_softmax
        assert dict(served.by_op) == {"_log_softmax": 1, "_log_softmax_backward_data": 1}
    exact = logits.detach().double().requires_grad_()
    reference = F.cross_entropy(exact, target, weight=weight.double(), label_smoothing=0.1)
    (dx_exact,) = torch.autograd.grad(reference, exact)
    assert relative_error(loss, reference) < 1e-5
    assert relative_error(dx, dx_exact) < 1e-5


@pytest.mark.skipif(HAS_LOSS, reason="portable_softmax.loss exists: test_f_cross_entropy_is_served uses it")
def test_the_loss_registration_point_hands_f_cross_entropy_to_the_loss(monkeypatch):
    """The registration point for portable_softmax.loss, with a stand-in for the loss: every
    argument of F.cross_entropy reaches it, and torch's autograd reaches its result."""
    seen = []

    def cross_entropy(input, target, *, weight, reduction, ignore_index, label_smoothing):
        seen.append((reduction, ignore_index, label_smoothing))
        return F.cross_entropy(input, target, weight=weight, reduction=reduction, ignore_index=ignore_index,
                               label_smoothing=label_smoothing)

    loss = types.ModuleType("portable_softmax.loss")
    loss.__spec__ = importlib.machinery.ModuleSpec("portable_softmax.loss", None)
    loss.cross_entropy = cross_entropy
    monkeypatch.setitem(sys.modules, "portable_softmax.loss", loss)
    monkeypatch.setattr(ps, "loss", loss, raising=False)
    logits = torch.randn(4, 9, requires_grad=True)
    target = torch.tensor([1, 3, 5, 7])
    with ps.enabled(["cpu"]) as served:
        value = F.cross_entropy(logits, target, reduction="sum", ignore_index=3, label_smoothing=0.2)
        (dx,) = torch.autograd.grad(value, logits)
        F.cross_entropy(logits, torch.rand(4, 9))  # probabilities, with the defaults
    assert seen == [("sum", 3, 0.2), ("mean", -100, 0.0)]
    assert served.by_op["cross_entropy_loss"] == 2
    # torch.compile's fake tensors reach the Autograd key too: they keep torch's composite, and
    # so does the compiled code (its log_softmax served, as without the loss).
    compiled = torch.compile(lambda z: F.cross_entropy(z, target), backend="aot_eager")
    with ps.enabled(["cpu"]) as served:
        compiled(logits)
    assert len(seen) == 2 and dict(served.by_op) == {"_log_softmax": 1}
    exact = logits.detach().double().requires_grad_()
    reference = F.cross_entropy(exact, target, reduction="sum", ignore_index=3, label_smoothing=0.2)
    assert relative_error(value, reference) < 1e-6
    assert relative_error(dx, torch.autograd.grad(reference, exact)[0]) < 1e-6


# ----------------------------------------------------------------------------------------------
# Switching: disable, idempotence, nesting, threads, errors.
# ----------------------------------------------------------------------------------------------

def test_disable_removes_the_registrations():
    x = torch.randn(4, 9)
    served = ps.enable(devices=["cpu"])
    assert registered_here()
    torch.softmax(x, -1)
    assert served.calls == 1
    ps.disable()
    assert not registered_here()
    torch.softmax(x, -1)
    torch.log_softmax(x, 0)
    assert served.calls == 1
    with pytest.raises(RuntimeError, match="half to float"):  # torch's own CPU kernel again
        torch.ops.aten._softmax(x.half(), -1, True)


def test_enable_twice_is_one_registration_and_one_count():
    first = ps.enable(devices="cpu")
    dump = torch._C._dispatch_dump("aten::_softmax")
    second = ps.enable(devices=["cpu"])
    assert second is first and torch._C._dispatch_dump("aten::_softmax") == dump
    torch.softmax(torch.randn(3, 5), -1)
    assert first.calls == 1


def test_blocks_nest_and_leave_what_is_still_open():
    x = torch.randn(3, 5)
    with ps.enabled(["cpu"]) as outer:
        with ps.enabled(["cpu"]) as inner:
            torch.softmax(x, -1)
        torch.softmax(x, -1)
    torch.softmax(x, -1)
    assert (outer.calls, inner.calls) == (2, 1)
    assert not registered_here()

    served = ps.enable(["cpu"])
    with ps.enabled(["cpu"]) as block:
        torch.softmax(x, -1)
    torch.softmax(x, -1)  # enable() still serves after the block
    assert (served.calls, block.calls) == (2, 1)

    with ps.enabled(["cpu"]) as block:
        ps.disable()  # ends the block too
        torch.softmax(x, -1)
    torch.softmax(x, -1)
    assert block.calls == 0 and not registered_here()


def test_a_call_made_while_one_is_served_goes_to_torch(monkeypatch):
    """A fallback inside the package that calls torch.softmax reaches torch's kernel, not the
    registration again (which would recurse forever)."""
    forward = op_calls._forward

    def calls_torch(x, dim, dtype, log):
        torch.softmax(x, dim)  # reaches the registration from inside a served call
        return forward(x, dim, dtype, log)

    monkeypatch.setattr(op_calls, "_forward", calls_torch)
    x = torch.randn(3, 7)
    with ps.enabled(["cpu"]) as served:
        y = torch.softmax(x, -1)
    assert served.calls == 1
    assert relative_error(y, torch.softmax(x.double(), -1)) < 1e-6


def test_calls_below_enable_min_bytes_keep_torch_s_kernel():
    small, large = torch.randn(4, 8), torch.randn(4, 64)  # 128 and 1024 bytes
    with min_bytes("cpu", 1024), ps.enabled(["cpu"]) as served:
        y_small, y_large = torch.softmax(small, -1), torch.softmax(large, -1)
        torch.softmax(small.requires_grad_(), -1).sum().backward()
    assert dict(served.by_op) == {"_softmax": 1}
    assert relative_error(y_small, torch.softmax(small.double(), -1)) < 1e-6
    assert relative_error(y_large, torch.softmax(large.double(), -1)) < 1e-6


def test_torch_without_get_kernel_keeps_calls_through_the_out_overload(monkeypatch):
    """torch 2.6 to 2.8 (no torch.library.get_kernel): torch's kernel is reached through the
    operators' ``.out`` overloads, forward and backward, half_to_float too."""
    monkeypatch.setattr(enable_module, "_get_kernel", None)
    x = torch.randn(3, 10, requires_grad=True)
    with min_bytes("cpu", 2**30), ps.enabled(["cpu"]) as served:
        y = torch.softmax(x, -1)
        z = torch.log_softmax(x, 0)
        dx, = torch.autograd.grad((y * torch.arange(10.0)).sum() + z[0].sum(), x)
        with pytest.raises(RuntimeError, match="half to float"):
            torch.ops.aten._softmax(x.detach().half(), -1, True)
    assert served.calls == 0
    exact = x.detach().double().requires_grad_()
    reference = (torch.softmax(exact, -1) * torch.arange(10.0)).sum() + torch.log_softmax(exact, 0)[0].sum()
    assert relative_error(dx, torch.autograd.grad(reference, exact)[0]) < 1e-6
    with ps.enabled(["cpu"]) as served:  # served as ever above the threshold
        torch.softmax(x, -1).sum().backward()
    assert served.calls == 2


def test_the_registration_serves_every_thread_and_counts_each_call():
    x = torch.randn(3, 5)
    reference = torch.softmax(x.double(), -1)
    errors = []

    def work():
        try:
            for _ in range(3):
                assert relative_error(torch.softmax(x, -1), reference) < 1e-6
        except Exception as error:  # noqa: BLE001  (reported by the main thread)
            errors.append(error)

    with ps.enabled(["cpu"]) as served:
        threads = [threading.Thread(target=work) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert not errors and served.calls == 6


def test_the_cpu_is_served_only_where_named():
    served = ps.enable()
    assert "cpu" not in served.devices
    with ps.enabled() as block:
        torch.softmax(torch.randn(2, 3), -1)
    assert block.calls == 0


@pytest.mark.parametrize("devices, error", [(["xpu"], ValueError), (["cuda", 0], TypeError), ("tpu:0", ValueError)])
def test_devices_no_backend_serves_are_refused(devices, error):
    with pytest.raises(error, match="devices"):
        ps.enable(devices)
    assert not registered_here()


def test_aot_eager_compiled_code_is_served():
    target = torch.randint(0, 6, (3,))
    model = lambda x: torch.softmax(x * 2, -1) + torch.log_softmax(x, 0) + F.cross_entropy(x, target)  # noqa: E731
    compiled = torch.compile(model, backend="aot_eager")
    x = torch.randn(3, 6)
    with ps.enabled(["cpu"]) as served:
        y = compiled(x)
    # Traced on fake tensors, which never reach the kernels; run on real ones, which do (the
    # cross-entropy through its log_softmax, also where portable_softmax.loss exists).
    assert dict(served.by_op) == {"_softmax": 1, "_log_softmax": 2}
    assert relative_error(y, model(x.double())) < 1e-6


# ----------------------------------------------------------------------------------------------
# Accelerators: torch keeps small calls by default.
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", ACCELERATORS)
def test_small_calls_keep_torch_s_kernel_and_large_ones_are_served(device):
    threshold = tuning_for(device_record(device)).enable_min_bytes
    small = torch.randn(8, 128, device=device)
    rows = max(1, threshold // (4 * 4096) + 1)
    large = torch.randn(rows, 4096, device=device)
    with ps.enabled() as served:
        y_small, y_large = torch.softmax(small, -1), torch.softmax(large, -1)
    assert dict(served.by_op) == ({"_softmax": 1} if small.numel() * 4 < threshold else {"_softmax": 2})
    assert relative_error(y_small, torch.softmax(small.double(), -1)) < 1e-5
    assert relative_error(y_large, torch.softmax(large.double(), -1)) < 1e-5


@pytest.mark.parametrize("device", ACCELERATORS)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_half_to_float_on_accelerators(device, log):
    x = torch.randn(64, 1000, device=device, dtype=torch.float16, requires_grad=True)
    call = torch.log_softmax if log else torch.softmax
    with min_bytes(device, 0), ps.enabled() as served:
        y = call(x, -1, dtype=torch.float32)  # half_to_float on CUDA
        (dx,) = torch.autograd.grad(y, x, torch.randn_like(y))
    assert served.calls == 2 and (y.dtype, dx.dtype) == (torch.float32, torch.float16)
    assert relative_error(y, call(x.detach().double(), -1)) < 1e-5
