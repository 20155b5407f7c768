"""Torch-native behaviour: torch.func transforms, forward-mode AD, meta tensors, autocast, dtype=
from integer and bool inputs, and rows of 2**31 elements, each compared with torch's own."""
from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as forward_ad
from torch.func import grad, jacfwd, jacrev, jvp, vjp, vmap

import portable_softmax as ps
from portable_softmax.selfcheck import relative_error

PAIRS = [(ps.softmax, torch.softmax), (ps.log_softmax, torch.log_softmax)]
IDS = ["softmax", "log_softmax"]


def _close(ours: torch.Tensor, theirs: torch.Tensor, tolerance: float = 1e-5) -> None:
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    assert relative_error(ours, theirs.double()) < tolerance


@pytest.mark.parametrize("fns", PAIRS, ids=IDS)
def test_vmap_over_any_batch_dimension(device, fns):
    ours, theirs = fns
    x = torch.randn(5, 7, 9, device=device)
    for in_dims, dim in ((0, -1), (1, 0), (2, 1), (0, 1)):
        _close(vmap(lambda r: ours(r, dim), in_dims=in_dims)(x), vmap(lambda r: theirs(r, dim), in_dims=in_dims)(x))
    with pytest.raises(IndexError):
        vmap(lambda r: ours(r, 2))(x)  # rank 2 per sample: dim 2 is out of range, as in torch


@pytest.mark.parametrize("fns", PAIRS, ids=IDS)
def test_grad_vjp_jacrev_jacfwd_and_jvp(device, fns):
    ours, theirs = fns
    x = torch.randn(4, 6, device=device, dtype=torch.float64)
    weights = torch.randn(4, 6, device=device, dtype=torch.float64)
    loss = lambda f: (lambda r: (f(r, -1) * weights).sum())  # noqa: E731
    _close(grad(loss(ours))(x), grad(loss(theirs))(x))
    cotangent = torch.randn_like(x)
    _close(vjp(lambda r: ours(r, 0), x)[1](cotangent)[0], vjp(lambda r: theirs(r, 0), x)[1](cotangent)[0])
    _close(jacrev(lambda r: ours(r, -1))(x[0]), jacrev(lambda r: theirs(r, -1))(x[0]))
    _close(jacfwd(lambda r: ours(r, -1))(x[0]), jacfwd(lambda r: theirs(r, -1))(x[0]))
    tangent = torch.randn_like(x)
    _close(jvp(lambda r: ours(r, 1), (x,), (tangent,))[1], jvp(lambda r: theirs(r, 1), (x,), (tangent,))[1])


@pytest.mark.parametrize("fns", PAIRS, ids=IDS)
def test_a_tensor_from_outside_a_transform_differentiated_inside_it(device, fns):
    """A tensor that requires grad, captured by a function a transform runs (raised before: the
    autograd Function without ``setup_context`` refused transforms)."""
    ours, theirs = fns
    x = torch.randn(3, 5, device=device, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(2, 3, 5, device=device, dtype=torch.float64)
    for f in (ours, theirs):
        _close(grad(lambda w: (f(x, -1) * w).sum())(weights[0]), theirs(x, -1).detach())
    outputs = [vmap(lambda w: (f(x, -1) * w).sum())(weights) for f in (ours, theirs)]
    _close(outputs[0], outputs[1])
    _close(torch.autograd.grad(outputs[0].sum(), x)[0], torch.autograd.grad(outputs[1].sum(), x)[0])


@pytest.mark.parametrize("fns", PAIRS, ids=IDS)
def test_forward_mode_ad_carries_the_tangent(device, fns):
    ours, theirs = fns
    x, tangent = torch.randn(3, 11, device=device), torch.randn(3, 11, device=device)
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(x, tangent)
        mine, reference = forward_ad.unpack_dual(ours(dual, -1)), forward_ad.unpack_dual(theirs(dual, -1))
    assert mine.tangent is not None
    _close(mine.primal, reference.primal)
    _close(mine.tangent, reference.tangent)


@pytest.mark.parametrize("fns", PAIRS, ids=IDS)
def test_meta_tensors_get_torch_s_shape_dtype_and_layout(fns):
    ours, theirs = fns
    for x, dim, dtype in ((torch.empty(3, 5, device="meta"), 0, None),
                          (torch.empty(4, 6, device="meta").t(), -1, torch.float64),
                          (torch.empty(2, 3, 4, 5, device="meta").to(memory_format=torch.channels_last), 1, None)):
        mine, reference = ours(x, dim, dtype=dtype), theirs(x, dim, dtype=dtype)
        assert (mine.device.type, mine.shape, mine.dtype) == (reference.device.type, reference.shape, reference.dtype)


@pytest.mark.parametrize("fns", PAIRS, ids=IDS)
@pytest.mark.parametrize("autocast_dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_autocast_follows_torch_s_policy(device, fns, autocast_dtype, dtype):
    ours, theirs = fns
    if device == "cpu" and autocast_dtype == torch.float16 and not torch.amp.is_autocast_available("cpu"):
        pytest.skip("no CPU autocast")
    x = torch.randn(8, 33, device=device).to(dtype)
    with torch.autocast(torch.device(device).type, dtype=autocast_dtype):
        mine, reference = ours(x, -1), theirs(x, -1)
    assert mine.dtype == reference.dtype
    assert relative_error(mine, theirs(x.double(), -1)) < (1e-5 if mine.dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("fns", PAIRS, ids=IDS)
@pytest.mark.parametrize("source", [torch.int64, torch.int32, torch.uint8, torch.bool], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_integer_and_bool_inputs_cast_with_dtype(device, fns, source, dtype):
    ours, theirs = fns
    x = torch.randint(0, 2 if source == torch.bool else 50, (6, 17), device=device).to(source)
    mine, reference = ours(x, -1, dtype=dtype), theirs(x, -1, dtype=dtype)
    assert mine.dtype == reference.dtype == dtype
    assert relative_error(mine, theirs(x.double(), -1)) < (1e-2 if dtype == torch.bfloat16 else 1e-6)
    with pytest.raises((TypeError, NotImplementedError, RuntimeError)):
        theirs(x, -1)
    with pytest.raises(TypeError, match="input's dtype"):
        ours(x, -1)  # without dtype=, as torch refuses (it raises NotImplementedError)


def test_a_row_of_2_31_elements_or_more(device):
    """A row longer than int32 offsets reach streams through the loop regime with 64-bit offsets
    (it once recursed until CUDA ran out of memory)."""
    if device == "cpu":
        pytest.skip("2**31 elements through the interpreter take hours")
    n = 2**31 + 64
    x = torch.randn(n, device=device, dtype=torch.bfloat16)
    x[-3:] = 12.0  # the row's maximum sits past element 2**31
    y = ps.softmax(x, 0)
    # torch's CUDA softmax asserts on a row this long (torch 2.11: "potential_reg_cnt > 0"): the
    # reference is written out in float32.
    wide = x.float()
    reference = torch.exp(wide - wide.max())
    reference /= reference.sum()
    assert _chunked_error(y, reference) < 1e-2 and torch.equal(y[-3:], reference[-3:].to(y.dtype))
    dy = torch.randn_like(x)
    (dx,) = torch.autograd.grad(ps.softmax(x.requires_grad_(), 0), x, dy)
    expected = reference * (dy.float() - (dy.float() * reference).sum())
    assert _chunked_error(dx, expected) < 1e-2


def _chunked_error(value: torch.Tensor, reference: torch.Tensor, chunk: int = 2**28) -> float:
    """``relative_error`` a chunk at a time: its float64 copies of 2**31 elements (16 GiB each) did
    not fit an H100 beside the test's tensors."""
    difference = sum(relative_error(v, r) ** 2 * r.double().norm().item() ** 2
                     for v, r in zip(value.split(chunk), reference.split(chunk)))
    return (difference / sum(r.double().norm().item() ** 2 for r in reference.split(chunk))) ** 0.5
