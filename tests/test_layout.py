"""Outputs laid out as torch lays out its own: softmax, log_softmax and their gradients are
contiguous whatever the input's strides (aten's shared meta functions ask for the contiguous
format on every device), forward, backward op, autograd (also with ``create_graph``), forward-mode
tangents and meta tensors, so that what works on torch's result (``.view(-1)``) works on ours. And
the common layouts are walked in place (no copy of the input first)."""
from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as forward_ad

import portable_softmax as ps
from portable_softmax import launch, row_layout, op_calls
from portable_softmax.selfcheck import relative_error

LAYOUTS = {
    "transposed": lambda d: torch.randn(7, 40, device=d).t(),
    "channels_last": lambda d: torch.randn(2, 5, 3, 4, device=d).to(memory_format=torch.channels_last),
    "sliced": lambda d: torch.randn(6, 64, device=d)[:, :50],
    "expanded": lambda d: torch.randn(6, 1, device=d).expand(6, 9),
    "expanded_3d": lambda d: torch.randn(1, 4, 5, device=d).expand(3, 4, 5),
    "permuted": lambda d: torch.randn(3, 4, 5, device=d).permute(2, 0, 1),
    "permuted_4d": lambda d: torch.randn(2, 3, 4, 5, device=d).permute(3, 1, 0, 2),
    "stepped": lambda d: torch.randn(8, 30, device=d)[::2, ::3],
}
FUNCTIONS = [(ps.softmax, torch.softmax, torch._softmax_backward_data),
             (ps.log_softmax, torch.log_softmax, torch._log_softmax_backward_data)]
FUNCTION_IDS = ["softmax", "log_softmax"]


def _like(x: torch.Tensor) -> torch.Tensor:
    """Fresh values in ``x``'s layout (an expanded layout made dense: autograd cannot write it)."""
    base = torch.randn(x.shape, device=x.device)
    if 0 in x.stride():
        return base
    return torch.empty_strided(x.shape, x.stride(), device=x.device).copy_(base)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fns", FUNCTIONS, ids=FUNCTION_IDS)
def test_strides_as_torch_s(device, layout, fns):
    ours, theirs, _ = fns
    x = LAYOUTS[layout](device)
    for dim in range(x.dim()):
        leaf = x.detach().requires_grad_()
        reference_leaf = x.detach().requires_grad_()
        y, expected = ours(leaf, dim), theirs(reference_leaf, dim)
        assert y.stride() == expected.stride(), (layout, dim)
        assert relative_error(y, theirs(x.double(), dim)) < 1e-5
        dy = torch.randn(x.shape, device=device)
        (dx,) = torch.autograd.grad(y, leaf, dy)
        (expected_dx,) = torch.autograd.grad(expected, reference_leaf, dy)
        assert dx.stride() == expected_dx.stride(), (layout, dim, "backward")
        double_leaf = x.detach().double().requires_grad_()
        (reference_dx,) = torch.autograd.grad(theirs(double_leaf, dim), double_leaf, dy.double())
        assert relative_error(dx, reference_dx) < 1e-5, (layout, dim)
        meta = x.detach().to("meta")
        assert ours(meta, dim).stride() == theirs(meta, dim).stride()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fns", FUNCTIONS, ids=FUNCTION_IDS)
def test_backward_op_strides_as_torch_s(device, layout, fns):
    """The backward op alone with y and dy in the input's layout: ``torch._softmax_backward_data``
    gives a contiguous dx, and so does ours."""
    ours, theirs, backward = fns
    x = LAYOUTS[layout](device)
    log = ours is ps.log_softmax
    for dim in range(x.dim()):
        y = _like(x).copy_(theirs(x, dim))
        dy = _like(x)
        dx = op_calls._backward(y, dy, dim, x.dtype, log)
        expected = backward(dy, y, dim, x.dtype)
        assert dx.stride() == expected.stride(), (layout, dim)
        assert relative_error(dx, backward(dy.double(), y.double(), dim, torch.float64)) < 1e-5, (layout, dim)
        # Against torch's kernels, not its meta: torch's meta for _log_softmax_backward_data is a
        # Python decomposition (torch/_decomp/decompositions.py) whose elementwise result takes a
        # strided dy's layout, where its CPU and CUDA kernels return a contiguous dx.
        assert op_calls._backward(y.to("meta"), dy.to("meta"), dim, x.dtype, log).stride() == expected.stride()


@pytest.mark.parametrize("fns", FUNCTIONS, ids=FUNCTION_IDS)
def test_strided_gradients_and_tangents_as_torch_s(device, fns):
    """A dy and a tangent in a layout of their own: the gradient (also the differentiable one,
    ``create_graph``) and the tangent take torch's strides."""
    ours, theirs, _ = fns
    for layout in ("transposed", "channels_last", "permuted_4d"):
        x = LAYOUTS[layout](device)
        for dim in range(x.dim()):
            dy = torch.randn(x.shape[::-1], device=device).permute(*reversed(range(x.dim())))
            strides = []
            for function in (ours, theirs):
                leaf = x.detach().requires_grad_()
                (dx,) = torch.autograd.grad(function(leaf, dim), leaf, dy, create_graph=True)
                with forward_ad.dual_level():
                    dual = forward_ad.make_dual(x.detach(), dy)
                    tangent = forward_ad.unpack_dual(function(dual, dim)).tangent
                strides.append((dx.stride(), tangent.stride()))
            assert strides[0] == strides[1], (layout, dim)


def test_a_transposed_result_views_as_torch_s(device):
    x = torch.randn(30, 20, device=device).t()
    flat = ps.softmax(x, -1).view(-1)
    assert torch.allclose(flat, torch.softmax(x, -1).view(-1), atol=1e-6)
    leaf = x.detach().requires_grad_()
    (dx,) = torch.autograd.grad(ps.log_softmax(leaf, 0), leaf, torch.randn(x.shape, device=device))
    dx.view(-1)


@pytest.mark.parametrize("layout, dims", [("transposed", (0, 1)), ("sliced", (0, 1)), ("permuted", (0, 1, 2)),
                                          ("channels_last", (0, 1)), ("stepped", (0, 1)), ("expanded", (0, 1)),
                                          ("expanded_3d", (0, 1, 2))])
@pytest.mark.parametrize("fns", FUNCTIONS, ids=FUNCTION_IDS)
def test_common_layouts_need_no_copy(device, monkeypatch, layout, dims, fns):
    """The kernels are launched on the input itself (its data and strides): no copy first.
    Channels-last over C (a channel softmax) and N; over H or W its rows take three strides in
    one of the two tensors, and are copied contiguous first, as torch copies them. The backward's
    y and dy are contiguous (our outputs) or, as the op alone is timed, in the input's layout."""
    ours, theirs, backward = fns
    launched: list[tuple[torch.Tensor, ...]] = []
    build_record = launch.build_record

    def recording(*args, **kwargs):
        record = build_record(*args, **kwargs)

        def run(tensors):
            launched.append(tensors)
            return record(tensors)

        return run

    monkeypatch.setattr(launch, "build_record", recording)
    # Records built before this test would launch without passing here.
    monkeypatch.setattr(op_calls, "_forward_calls", {})
    monkeypatch.setattr(op_calls, "_backward_calls", {})
    x = LAYOUTS[layout](device)
    log = ours is ps.log_softmax
    for dim in dims:
        launched.clear()
        y = ours(x, dim)
        assert relative_error(y, theirs(x.double(), dim)) < 1e-5, (layout, dim)
        ((given, out),) = launched  # one launch, of x itself
        assert (given.data_ptr(), given.stride()) == (x.data_ptr(), x.stride()) and out is y, (layout, dim)
        for y_in, dy in ((y, torch.randn(x.shape, device=device)), (_like(x).copy_(y), _like(x))):
            launched.clear()
            dx = op_calls._backward(y_in, dy, dim, x.dtype, log)
            ((given_y, given_dy, _),) = launched
            assert given_y is y_in and given_dy is dy, (layout, dim, "backward")
            assert relative_error(dx, backward(dy.double(), y_in.double(), dim, torch.float64)) < 1e-5


@pytest.mark.parametrize("layout, dim", [("channels_last", 2), ("channels_last", 3), ("permuted_4d", 0)])
def test_three_stride_rows_are_copied_once(device, layout, dim):
    """Rows whose other dimensions take three strides in x or the output (channels-last over H or
    W): no row view; the call copies x contiguous and still returns torch's values and layout."""
    x = LAYOUTS[layout](device)
    assert row_layout.row_view(tuple(x.shape), dim, x, row_layout._output(x, x.dtype)) is None
    y = ps.softmax(x, dim)
    assert y.stride() == torch.softmax(x, dim).stride()
    assert relative_error(y, torch.softmax(x.double(), dim)) < 1e-5
