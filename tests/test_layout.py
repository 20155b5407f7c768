"""Outputs laid out as torch lays out its own: softmax, log_softmax and their gradients are
contiguous whatever the input's strides, on every device and for meta tensors, so that what
works on torch's result (``.view(-1)``) works on ours. And the common layouts are walked in place
(no copy of the input first)."""
from __future__ import annotations

import pytest
import torch

import portable_softmax as ps
from portable_softmax import ops
from portable_softmax.selfcheck import relative_error

LAYOUTS = {
    "transposed": lambda d: torch.randn(7, 40, device=d).t(),
    "channels_last": lambda d: torch.randn(2, 5, 3, 4, device=d).to(memory_format=torch.channels_last),
    "sliced": lambda d: torch.randn(6, 64, device=d)[:, :50],
    "expanded": lambda d: torch.randn(6, 1, device=d).expand(6, 9),
    "permuted": lambda d: torch.randn(3, 4, 5, device=d).permute(2, 0, 1),
    "stepped": lambda d: torch.randn(8, 30, device=d)[::2, ::3],
}
FUNCTIONS = [(ps.softmax, torch.softmax), (ps.log_softmax, torch.log_softmax)]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fns", FUNCTIONS, ids=["softmax", "log_softmax"])
def test_strides_as_torch_s(device, layout, fns):
    ours, theirs = fns
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
        meta = x.detach().to("meta")
        assert ours(meta, dim).stride() == theirs(meta, dim).stride()


def test_a_transposed_result_views_as_torch_s(device):
    x = torch.randn(30, 20, device=device).t()
    flat = ps.softmax(x, -1).view(-1)
    assert torch.allclose(flat, torch.softmax(x, -1).view(-1), atol=1e-6)


@pytest.mark.parametrize("layout, dims", [("transposed", (0, 1)), ("sliced", (0, 1)), ("permuted", (0, 1, 2)),
                                          ("channels_last", (0, 1))])
def test_common_layouts_need_no_copy(device, layout, dims):
    """Input and contiguous output walk as one row view: no copy of the input first. Channels-last
    over C (a channel softmax) and N; over H or W its rows take three strides in one of the two
    tensors, and are copied contiguous first, as torch copies them."""
    x = LAYOUTS[layout](device)
    for dim in dims:
        assert ops.row_view(tuple(x.shape), dim, x, ops._output(x, x.dtype)) is not None, (layout, dim)
