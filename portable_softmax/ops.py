"""The public operations: drop-in ``softmax`` and ``log_softmax`` with their backward.

This module validates arguments the way a user can act on, maps any dim of any strided tensor
onto the kernels' row view without copying where it can, and wires the kernels into autograd.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from portable_softmax import torch_ops
from portable_softmax.device import device_record
from portable_softmax.launch import RowView, run_backward, run_forward

FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Column offsets are computed in 32 bits inside the kernels.
_MAX_COLUMN_SPAN = 2**31


class DimensionError(IndexError, ValueError):
    """``dim`` is out of range (an IndexError, as torch raises, and a ValueError)."""


def _check_dtype(what: str, dtype: torch.dtype, name: str) -> None:
    if dtype not in FLOATING:
        raise TypeError(f"portable_softmax.{name}: {what} must be float16, bfloat16, float32 or float64, got {dtype}")


def _validate(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype], name: str) -> tuple[int, torch.dtype]:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"portable_softmax.{name}: expected a torch.Tensor, got {type(x).__name__}")
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"portable_softmax.{name}: dim must be an int, got {type(dim).__name__}")
    rank = max(x.dim(), 1)
    if not -rank <= dim < rank:
        raise DimensionError(f"portable_softmax.{name}: dim {dim} is out of range for a tensor of {x.dim()} "
                             f"dimension(s) (expected {-rank} to {rank - 1})")
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"portable_softmax.{name}: dtype must be a torch.dtype or None, got {type(dtype).__name__}")
    _check_dtype("the input's dtype", x.dtype, name)
    out_dtype = x.dtype if dtype is None else dtype
    _check_dtype("dtype", out_dtype, name)
    record = device_record(x.device)
    for needed in {x.dtype, out_dtype}:
        if needed == torch.float64 and not record.supports_fp64:
            raise TypeError(f"portable_softmax.{name}: float64 is not supported on {record.name} "
                            f"(backend {record.backend!r}); convert to float32 first")
        if needed == torch.bfloat16 and not record.supports_bf16:
            raise TypeError(f"portable_softmax.{name}: bfloat16 is not supported on {record.name} ({record.arch})")
    return dim % rank, out_dtype


def row_view(shape: tuple[int, ...], dim: int, *tensors: torch.Tensor) -> Optional[RowView]:
    """The row view of ``tensors`` (all of ``shape``) for a softmax over ``dim``, or None when the
    rows of some tensor cannot be walked with two strides."""
    return _row_view(tuple(shape), dim, tuple(t.stride() for t in tensors))


@functools.lru_cache(maxsize=4096)
def _row_view(shape: tuple[int, ...], dim: int, strides: tuple[tuple[int, ...], ...]) -> Optional[RowView]:
    n_cols = shape[dim]
    col_strides = [s[dim] for s in strides]
    if (n_cols - 1) * max(col_strides, default=0) >= _MAX_COLUMN_SPAN:
        return None
    others = [d for d in range(len(shape)) if d != dim and shape[d] != 1]
    # Walk the row dimensions in the first tensor's memory order, merging neighbours that are
    # contiguous with each other in every tensor.
    others.sort(key=lambda d: -strides[0][d])
    groups: list[tuple[int, list[int]]] = []
    for d in others:
        dim_strides = [s[d] for s in strides]
        if groups:
            size, last = groups[-1]
            if all(prev == s * shape[d] for prev, s in zip(last, dim_strides)):
                groups[-1] = (size * shape[d], dim_strides)
                continue
        groups.append((shape[d], dim_strides))
    if len(groups) > 2:
        return None
    while len(groups) < 2:
        groups.insert(0, (1, [0] * len(strides)))
    (n_outer, outer_strides), (rows, row_strides) = groups
    triples = tuple((o, r, c) for o, r, c in zip(outer_strides, row_strides, col_strides))
    return RowView(n_outer, rows, n_cols, triples)


def _empty_like(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_like(t, dtype=dtype, memory_format=torch.preserve_format)


def _forward(x: torch.Tensor, dim: int, out_dtype: torch.dtype, log: bool) -> torch.Tensor:
    if x.dim() == 0:
        return _forward(x.reshape(1), 0, out_dtype, log).reshape(())
    y = _empty_like(x, out_dtype)
    if x.numel() == 0:
        return y
    view = row_view(tuple(x.shape), dim, x, y)
    if view is None:
        moved = x.movedim(dim, -1).contiguous()
        out = _forward(moved, moved.dim() - 1, out_dtype, log)
        return out.movedim(-1, dim)
    run_forward(x, y, view, log)
    return y


def _backward(y: torch.Tensor, dy: torch.Tensor, dim: int, grad_dtype: torch.dtype, log: bool) -> torch.Tensor:
    if y.dim() == 0:
        return _backward(y.reshape(1), dy.reshape(1), 0, grad_dtype, log).reshape(())
    dx = _empty_like(y, grad_dtype)
    if y.numel() == 0:
        return dx
    view = row_view(tuple(y.shape), dim, y, dy, dx)
    if view is None:
        y_moved = y.movedim(dim, -1).contiguous()
        dy_moved = dy.movedim(dim, -1).contiguous()
        out = _backward(y_moved, dy_moved, y_moved.dim() - 1, grad_dtype, log)
        return out.movedim(-1, dim)
    run_backward(y, dy, dx, view, log)
    return dx


def _reference_backward(y: torch.Tensor, dy: torch.Tensor, dim: int, grad_dtype: torch.dtype, log: bool) -> torch.Tensor:
    """Backward in torch operations: differentiable again, for double backward."""
    if log:
        dx = dy - torch.exp(y) * dy.sum(dim, keepdim=True)
    else:
        dx = y * (dy - (dy * y).sum(dim, keepdim=True))
    return dx.to(grad_dtype)


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int, out_dtype: torch.dtype, log: bool) -> torch.Tensor:
        y = _forward(x, dim, out_dtype, log)
        ctx.save_for_backward(y)
        ctx.dim, ctx.log, ctx.grad_dtype = dim, log, x.dtype
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        (y,) = ctx.saved_tensors
        if torch.is_grad_enabled():
            dx = _reference_backward(y, dy, ctx.dim, ctx.grad_dtype, ctx.log)
        else:
            dx = _backward(y, dy, ctx.dim, ctx.grad_dtype, ctx.log)
        return dx, None, None, None


def _apply(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype], log: bool, name: str) -> torch.Tensor:
    dim, out_dtype = _validate(x, dim, dtype, name)
    if torch_ops.AVAILABLE and torch_ops.compiling():
        # Under torch.compile: the registered custom operator, which dynamo puts in the graph as
        # one node (with its fake and autograd registrations) instead of breaking the graph.
        return torch_ops.call(x, dim, out_dtype, log)
    if torch.is_grad_enabled() and x.requires_grad:
        return _Softmax.apply(x, dim, out_dtype, log)
    return _forward(x, dim, out_dtype, log)


def softmax(x: torch.Tensor, dim: int = -1, *, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Softmax of ``x`` along ``dim``, as ``torch.softmax`` computes it.

    Args:
        x: a float16, bfloat16, float32 or float64 tensor of any rank and strides, on any device a
            backend serves (CPU tensors run through Triton's interpreter).
        dim: the dimension to normalise over; negative counts from the end.
        dtype: if given, ``x`` is cast to it first and the result has this dtype (as in torch).

    Returns:
        A tensor of ``x``'s shape; differentiable with respect to ``x``.

    Raises:
        TypeError: ``x`` is not a floating tensor, or its dtype is unsupported on its device.
        IndexError: ``dim`` is out of range (a :class:`DimensionError`, also a ValueError).
        RuntimeError: no backend serves ``x``'s device.
    """
    return _apply(x, dim, dtype, False, "softmax")


def log_softmax(x: torch.Tensor, dim: int = -1, *, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Log-softmax of ``x`` along ``dim``, as ``torch.log_softmax`` computes it.

    Args, Returns and Raises as :func:`softmax`.
    """
    return _apply(x, dim, dtype, True, "log_softmax")


__all__ = ["softmax", "log_softmax", "DimensionError"]
