"""A learnable additive mask (a relative position bias: T5, Swin, ALiBi's learned variants) takes
its gradient as in torch's ``softmax(x * scale + mask)``: d mask is the gradient with respect to
the scaled and masked input, summed over the dimensions the mask broadcasts along, in the mask's
dtype. Against torch in float64 on every path a fused call takes: the fused kernels (eager), the
composite (a mask whose leading strides do not merge; ``torch.func`` transforms) and the custom
operator under ``torch.compile``."""
from __future__ import annotations

import math

import pytest
import torch

import portable_softmax as ps
from portable_softmax import fused, torch_ops
from portable_softmax.selfcheck import relative_error
from regimes import force_regime

B, H, Q, K = 2, 3, 5, 37


def _torch(x, mask, scale=None, causal=False, log=False, dim=-1):
    """torch's own: softmax(x * scale + mask), causal j > i filled with -inf. For log_softmax the
    mask's -inf entries are filled in too: ``log_softmax(x + mask)`` passes dy through to an input
    at -inf (whose output is -inf), where the package keeps masked positions constants (no
    gradient, as softmax's is there: 0)."""
    z = x if scale is None else x * scale
    z = z + mask
    if log:
        z = z.masked_fill(torch.isneginf(mask), -math.inf)
    if causal:
        z = z.masked_fill(torch.ones(z.shape[-2], z.shape[-1], dtype=torch.bool, device=z.device).triu(1),
                          -math.inf)
    return (torch.log_softmax if log else torch.softmax)(z, dim)


def _learnable_scale(device):
    return (torch.rand(B, H, Q, 1, device=device) + 0.5).requires_grad_()


def _check_gradients(function, x, mask, scale=None, **kwargs):
    """``function``'s output and the gradients of every input that requires one against torch's
    in float64 (whole-tensor relative error), and each gradient in its input's dtype and shape."""
    inputs = [t for t in (x, mask, scale) if isinstance(t, torch.Tensor) and t.requires_grad]
    wide = {id(t): t.detach().double().requires_grad_(t.requires_grad) for t in (x, mask, scale)
            if isinstance(t, torch.Tensor)}
    y = function(x, mask, scale)
    expected = _torch(wide[id(x)], wide[id(mask)], wide.get(id(scale), scale), **kwargs)
    kept = torch.isfinite(expected)
    assert relative_error(y[kept], expected[kept]) < 1e-5
    assert y.requires_grad
    dy = torch.randn(y.shape, device=y.device)
    grads = torch.autograd.grad(y, inputs, dy)
    expected_grads = torch.autograd.grad(expected, [wide[id(t)] for t in inputs], dy.double())
    for t, ours, theirs in zip(inputs, grads, expected_grads):
        assert ours.dtype == t.dtype and ours.shape == t.shape
        assert torch.isfinite(theirs).all()
        assert relative_error(ours, theirs) < 1e-5


MASK_SHAPES = {"per_query_key": (1, 1, Q, K), "per_key": (K,), "full": (B, H, Q, K), "per_batch": (B, 1, 1, K)}


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape", MASK_SHAPES.values(), ids=MASK_SHAPES.keys())
@pytest.mark.parametrize("scale", ["none", "number", "learnable"])
def test_the_fused_kernels_give_the_mask_its_gradient(device, log, shape, scale):
    """Through the fused kernels, with x learnable as well, a number scale (the mask is added
    after the scaling: dx = dz * scale, d mask = dz) or a learnable scale tensor."""
    x = torch.randn(B, H, Q, K, device=device, requires_grad=True)
    mask = torch.randn(shape, device=device, requires_grad=True)
    scale = {"none": None, "number": -0.7, "learnable": _learnable_scale(device)}[scale]
    function = ps.log_softmax if log else ps.softmax
    _check_gradients(lambda x, m, s: function(x, -1, mask=m, scale=s), x, mask, scale, log=log)


@pytest.mark.parametrize("regime", ["split", "loop"])
def test_rows_longer_than_a_tile(device, monkeypatch, regime):
    """Rows of 301 in the split and loop kernels (forced: chunks of 128), bf16 x and a float32 mask: the
    gradient with respect to the masked input is taken in the mask's wider dtype."""
    force_regime(monkeypatch, regime, device)
    x = torch.randn(1, 2, 3, 301, device=device).bfloat16().requires_grad_()
    mask = torch.randn(1, 1, 3, 301, device=device, requires_grad=True)
    y = ps.softmax(x, -1, mask=mask, scale=0.5)
    wide_x, wide_mask = x.detach().double().requires_grad_(), mask.detach().double().requires_grad_()
    expected = torch.softmax(wide_x * 0.5 + wide_mask, -1)
    dy = torch.randn(x.shape, device=device)
    dx, dmask = torch.autograd.grad(y, (x, mask), dy.bfloat16())
    expected_dx, expected_dmask = torch.autograd.grad(expected, (wide_x, wide_mask), dy.bfloat16().double())
    assert dx.dtype == torch.bfloat16 and dmask.dtype == torch.float32
    assert relative_error(y, expected) < 1e-2 and relative_error(dx, expected_dx) < 2e-2
    assert relative_error(dmask, expected_dmask) < 1e-2


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_causal_with_negative_infinities_in_the_mask(device, log):
    """A causal call, and -inf entries in the mask (not whole rows): those take the gradient
    torch's ``softmax(x + mask)`` gives them (0), as do the causally masked ones."""
    x = torch.randn(B, H, Q, K, device=device, requires_grad=True)
    bias = torch.randn(1, H, Q, K, device=device)
    bias[0, 1, 2, [0, 3, 4]] = -math.inf
    mask = bias.requires_grad_()
    function = ps.log_softmax if log else ps.softmax
    _check_gradients(lambda x, m, s: function(x, -1, mask=m, scale=s, causal=True), x, mask,
                     _learnable_scale(device), causal=True, log=log)


def test_only_the_mask_learns(device):
    """The output requires grad when only the mask does; a wider mask (float64 with float32 x)
    gets its gradient in its own dtype; a bool mask is a constant."""
    x = torch.randn(B, H, Q, K, device=device)
    mask = torch.randn(Q, K, device=device, dtype=torch.float64, requires_grad=True)
    _check_gradients(lambda x, m, s: ps.softmax(x, -1, mask=m, scale=0.5), x, mask, 0.5)
    assert not ps.softmax(x, -1, mask=torch.rand(Q, K, device=device) > 0.5).requires_grad
    with torch.no_grad():
        assert not ps.softmax(x, -1, mask=mask).requires_grad


def test_over_another_dimension(device):
    """A channel softmax (dim 1) with a learnable per-channel bias broadcast over the pixels."""
    x = torch.randn(2, 9, 3, 4, device=device, requires_grad=True)
    mask = torch.randn(1, 9, 1, 1, device=device, requires_grad=True)
    wide_x, wide_mask = x.detach().double().requires_grad_(), mask.detach().double().requires_grad_()
    y = ps.softmax(x, 1, mask=mask)
    expected = torch.softmax(wide_x + wide_mask, 1)
    dy = torch.randn(x.shape, device=device)
    dx, dmask = torch.autograd.grad(y, (x, mask), dy)
    expected_dx, expected_dmask = torch.autograd.grad(expected, (wide_x, wide_mask), dy.double())
    assert relative_error(y, expected) < 1e-5
    assert relative_error(dx, expected_dx) < 1e-5 and relative_error(dmask, expected_dmask) < 1e-5


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_the_composite_gives_the_mask_its_gradient(device, monkeypatch, log):
    """A mask whose leading strides do not merge is composed from torch operations (checked):
    the gradient reaches it there too, -inf entries included."""
    composed = []
    real = fused._composite
    monkeypatch.setattr(fused, "_composite", lambda *a: composed.append(1) or real(*a))
    x = torch.randn(2, 3, H, Q, K, device=device, requires_grad=True)
    bias = torch.randn(3, 2, H, Q, K, device=device)
    bias[1, 0, 0, 1, [2, 5]] = -math.inf
    mask = bias.transpose(0, 1).requires_grad_()  # leading dims that do not merge
    function = ps.log_softmax if log else ps.softmax
    _check_gradients(lambda x, m, s: function(x, -1, mask=m, scale=s), x, mask, 0.8, log=log)
    assert composed


def test_torch_func_grad_of_the_mask(device):
    """``torch.func.grad`` with respect to the mask (x a plain tensor): the composite, as torch."""
    x = torch.randn(B, H, Q, K, device=device)
    mask = torch.randn(1, 1, Q, K, device=device)
    weights = torch.randn(B, H, Q, K, device=device)

    def loss(function):
        return lambda m: (function(m) * weights).sum()

    ours = torch.func.grad(loss(lambda m: ps.softmax(x, -1, mask=m, scale=0.5)))(mask)
    theirs = torch.func.grad(loss(lambda m: torch.softmax(x.double() * 0.5 + m, -1)))(mask.double())
    assert ours.dtype == mask.dtype and relative_error(ours, theirs) < 1e-5


@pytest.mark.skipif(not torch_ops.AVAILABLE, reason="torch.library.custom_op needs torch >= 2.4")
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_compiled_calls_give_the_mask_its_gradient(device, log):
    """Under torch.compile (one custom operator, its backward operator): x, the learnable scale
    and a broadcast mask against torch's gradients."""
    import torch._dynamo

    torch._dynamo.reset()
    function = ps.log_softmax if log else ps.softmax
    compiled = torch.compile(lambda x, m, s: function(x, -1, mask=m, scale=s, causal=True), backend="aot_eager",
                             fullgraph=True)
    x = torch.randn(B, H, Q, K, device=device, requires_grad=True)
    mask = torch.randn(1, 1, Q, K, device=device, requires_grad=True)
    try:
        _check_gradients(compiled, x, mask, _learnable_scale(device), causal=True, log=log)
        _check_gradients(compiled, x.detach(), mask, 0.5, causal=True, log=log)  # only the mask learns
    finally:
        torch._dynamo.reset()
