"""softmax and log_softmax for autograd, forward-mode AD and ``torch.func``: the kernels forward
and backward (``op_calls``), torch operations for double backward and for the tangent.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.autograd.forward_ad as forward_ad

from portable_softmax.op_arguments import DimensionError
from portable_softmax.op_calls import _Call, _backward, _forward, _forward_lookup


def _reference_backward(y: torch.Tensor, dy: torch.Tensor, dim: int, grad_dtype: torch.dtype, log: bool) -> torch.Tensor:
    """Backward in torch operations: differentiable again, for double backward."""
    if log:
        dx = dy - torch.exp(y) * dy.sum(dim, keepdim=True)
    else:
        dx = y * (dy - (dy * y).sum(dim, keepdim=True))
    # Contiguous as torch's (``_output``): the elementwise result takes a strided dy's layout.
    return dx.to(grad_dtype).contiguous()


class _Softmax(torch.autograd.Function):
    """softmax / log_softmax for autograd and forward-mode AD: the kernels forward and backward,
    torch operations for double backward and for the tangent (``jvp``).

    Written with ``forward(ctx, ...)``: a Function that defines ``setup_context`` has its
    arguments bound through ``inspect.signature`` on every call (tens of microseconds), so the
    ``torch.func`` form (``_TransformableSoftmax``) is used only where a transform needs it."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int, dtype: Optional[torch.dtype], log: bool) -> torch.Tensor:
        call = _forward_lookup(x, dim, dtype, log, x.requires_grad)
        y = call(x)
        _Softmax._save(ctx, x, dim, log, y, forward_ad._current_level >= 0, getattr(call, "__self__", None))
        return y

    @staticmethod
    def _save(ctx, x: torch.Tensor, dim: int, log: bool, y: torch.Tensor, tangents: bool,
              call: Optional[_Call] = None) -> None:
        """What the backward needs: y, the normalized dim, the function, the input's dtype, and
        the forward call whose output y is (None where y came another way), which keeps the
        backward call of y's usual gradient (``_Call.gradient``)."""
        ctx.save_for_backward(y)
        if tangents:
            ctx.save_for_forward(y)
        ctx.dim, ctx.log, ctx.grad_dtype, ctx.call = dim % max(x.dim(), 1), log, x.dtype, call

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        (y,) = ctx.saved_tensors
        if torch.is_grad_enabled():
            dx = _reference_backward(y, dy, ctx.dim, ctx.grad_dtype, ctx.log)
        elif ctx.call is not None:
            dx = ctx.call.gradient(y, dy, ctx.dim, ctx.grad_dtype, ctx.log)
        else:
            dx = _backward(y, dy, ctx.dim, ctx.grad_dtype, ctx.log)
        return dx, None, None, None

    @staticmethod
    def jvp(ctx, tangent: torch.Tensor, *_):
        """The tangent of the output: y * (t - sum(t * y)) for softmax, t - sum(softmax(x) * t)
        for log_softmax (t cast to the output's dtype first, as the input is)."""
        (y,) = ctx.saved_tensors
        t = tangent.to(y.dtype)
        if ctx.log:
            return t - (torch.exp(y) * t).sum(ctx.dim, keepdim=True)
        return y * (t - (t * y).sum(ctx.dim, keepdim=True))


class _TransformableSoftmax(torch.autograd.Function):
    """``_Softmax`` in the form ``torch.func`` transforms take (``setup_context``), with ``vmap``."""

    @staticmethod
    def forward(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype], log: bool) -> torch.Tensor:
        return _forward(x, dim, dtype, log)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, dim, _, log = inputs
        _Softmax._save(ctx, x, dim, log, output, True)

    backward = _Softmax.backward
    jvp = _Softmax.jvp

    @staticmethod
    def vmap(info, in_dims, x: torch.Tensor, dim: int, dtype: Optional[torch.dtype], log: bool):
        """Over a batch dimension: the same softmax over one more leading dimension."""
        batch = in_dims[0]
        if batch is None:
            return _TransformableSoftmax.apply(x, dim, dtype, log), None
        rank = max(x.dim() - 1, 1)
        if isinstance(dim, int) and not isinstance(dim, bool) and not -rank <= dim < rank:
            raise DimensionError(f"portable_softmax.{'log_softmax' if log else 'softmax'}: dim {dim} is out of "
                                 f"range for a tensor of {x.dim() - 1} dimension(s) (expected {-rank} to {rank - 1})")
        x = x.movedim(batch, 0)
        return _TransformableSoftmax.apply(x, dim if dim < 0 else dim + 1, dtype, log), 0

