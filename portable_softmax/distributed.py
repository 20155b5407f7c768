"""Softmax over a dimension sharded across ranks, through ``torch.distributed`` and DTensor.

Each rank holds a slice of every row (a tensor-parallel vocabulary shard; slices may differ in
length). The result is this rank's slice of ``torch.softmax`` over the whole dimension, computed
without gathering the rows: one read of the slice writes each row's partials (maximum, sum of
exponentials, ``kernels.softmax_forward_partials``); one all-gather into one tensor of those
partials (8 bytes a row per rank); one more read of the slice combines every rank's partials and
writes the output. The backward is the same shape: the slice's sums (``sum(dy * y)`` for softmax,
``sum(dy)`` for log_softmax), one ``all_reduce``, then dx. The floor is three passes over the local
slice at copy speed plus the collectives.

DTensors reach this path through ``portable_softmax.softmax`` / ``log_softmax``: sharded on the
softmax dimension they keep their shards and placements; sharded on other dimensions or
replicated, each rank runs the local softmax on its shard.

``cross_entropy``, the loss over a vocabulary sharded across ranks, is ``distributed_loss.py``'s;
``linear_cross_entropy``, the tensor-parallel head with it, ``distributed_head.py``'s.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.distributed as dist

from portable_softmax import launch, row_layout, op_arguments, ops
from portable_softmax.distributed_head import linear_cross_entropy
from portable_softmax.distributed_loss import cross_entropy
from portable_softmax import distributed_dtensor  # noqa: F401,E402  (routes DTensor logits sharded on the classes)
from portable_softmax.launch import RowView


# One tensor gathered into one: ``all_gather_single`` where torch has it (it deprecated
# ``all_gather_into_tensor``, with a FutureWarning on every call, for it), the older name before.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _partials_dtype(out_dtype: torch.dtype) -> torch.dtype:
    """The partials are float32, float64 where the call accumulates in float64."""
    return torch.float64 if out_dtype == torch.float64 else torch.float32


def _ranks(group: Optional[dist.ProcessGroup]) -> int:
    return dist.get_world_size(group)


def _view(x: torch.Tensor, dim: int, *others: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], RowView]:
    """``x`` (made contiguous where its rows cannot be walked with two strides) and the row view
    of it with ``others``, which are allocated like it."""
    view = row_layout.row_view(tuple(x.shape), dim, x, *others)
    if view is None:
        x = x.contiguous()
        others = tuple(o.contiguous() for o in others)
        view = row_layout.row_view(tuple(x.shape), dim, x, *others)
    return x, others, view


def _rows(x: torch.Tensor, dim: int) -> int:
    """How many rows (softmax vectors) ``x`` holds: also where its slice of them is empty."""
    return math.prod(size for i, size in enumerate(x.shape) if i != dim)


def _forward(x: torch.Tensor, dim: int, out_dtype: torch.dtype, log: bool,
             group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    ranks = _ranks(group)
    if x.dtype != out_dtype:
        x = x.to(out_dtype)  # torch casts first (dtype=); the kernels then read one dtype
    acc_fp64 = out_dtype == torch.float64
    rows = _rows(x, dim)
    partials = torch.empty((rows, 2), dtype=_partials_dtype(out_dtype), device=x.device)
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    if x.numel():
        x, _, view = _view(x, dim)
        launch.run_sharded("forward_partials", (x, partials), view, log, acc_fp64, ranks)
    else:
        # An empty slice (or no rows): its partials add nothing, but the rank still takes part.
        partials[:, 0] = -float("inf")
        partials[:, 1] = 0
    # Every rank's partials, rank after rank ([ranks * rows, 2]: the form every backend gathers into).
    gathered = torch.empty((ranks * rows, 2), dtype=partials.dtype, device=x.device)
    _all_gather(gathered, partials, group=group)
    if x.numel():
        x, (y,), view = _view(x, dim, y)
        launch.run_sharded("forward_normalize", (x, gathered, y), view, log, acc_fp64, ranks)
    return y


def _backward(y: torch.Tensor, dy: torch.Tensor, dim: int, grad_dtype: torch.dtype, log: bool,
              group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    acc_fp64 = torch.float64 in (y.dtype, dy.dtype, grad_dtype)
    rows = _rows(y, dim)
    sums = torch.zeros((rows,), dtype=torch.float64 if acc_fp64 else torch.float32, device=y.device)
    dx = torch.empty(y.shape, dtype=grad_dtype, device=y.device)
    if y.numel():
        y, (dy,), view = _view(y, dim, dy)
        launch.run_sharded("backward_partials", (y, dy, sums), view, log, acc_fp64, _ranks(group))
    dist.all_reduce(sums, group=group)
    if y.numel():
        y, (dy, dx), view = _view(y, dim, dy, dx)
        # The sums are all-reduced: one part to read.
        launch.run_sharded("backward_normalize", (y, dy, sums, dx), view, log, acc_fp64, 1)
    return dx


class _ShardedSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, out_dtype: torch.dtype, log: bool,
                group: Optional[dist.ProcessGroup]) -> torch.Tensor:
        y = _forward(x, dim, out_dtype, log, group)
        ctx.save_for_backward(y)
        ctx.dim, ctx.log, ctx.group, ctx.grad_dtype = dim, log, group, x.dtype
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, dy: torch.Tensor):
        (y,) = ctx.saved_tensors
        return _backward(y, dy, ctx.dim, ctx.grad_dtype, ctx.log, ctx.group), None, None, None, None


def _apply(x: torch.Tensor, dim: int, group: Optional[dist.ProcessGroup], dtype: Optional[torch.dtype],
           log: bool) -> torch.Tensor:
    name = f"portable_softmax.distributed.{'log_softmax' if log else 'softmax'}"
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{name}: torch.distributed is not initialized (call init_process_group first)")
    dim, out_dtype = op_arguments._validate(x, dim, dtype, name.rsplit(".", 1)[1])
    if x.dim() == 0:
        raise ValueError(f"{name}: a rank-0 tensor has no dimension to shard")
    return _ShardedSoftmax.apply(x, dim, out_dtype, log, group)


def softmax(x_local: torch.Tensor, dim: int = -1, *, group: Optional[dist.ProcessGroup] = None,
            dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """This rank's slice of the softmax over ``dim``, whose slices the ranks of ``group`` hold.

    Args:
        x_local: this rank's slice of the input along ``dim`` (slices may differ in length; the
            other dimensions are the same on every rank).
        dim: the sharded dimension to normalise over.
        group: the ``torch.distributed`` process group holding the slices (default: the world).
        dtype: as in ``torch.softmax``: the input is cast to it first.

    Returns:
        This rank's slice of ``torch.softmax`` of the whole tensor, differentiable with respect to
        ``x_local`` (the backward takes one more ``all_reduce``).
    """
    return _apply(x_local, dim, group, dtype, False)


def log_softmax(x_local: torch.Tensor, dim: int = -1, *, group: Optional[dist.ProcessGroup] = None,
                dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """This rank's slice of the log-softmax over ``dim``; as :func:`softmax`."""
    return _apply(x_local, dim, group, dtype, True)


def _dtensor_softmax(x: Any, dim: int, dtype: Optional[torch.dtype], log: bool) -> Any:
    """``portable_softmax.softmax`` of a DTensor: the shards keep their placements. Sharded on
    ``dim`` (on one mesh dimension), the sharded path over that mesh dimension's group; otherwise
    each rank's softmax of its shard."""
    from torch.distributed.tensor import DTensor, Shard

    rank = max(x.dim(), 1)
    if isinstance(dim, int) and not isinstance(dim, bool) and -rank <= dim < rank:
        dim %= rank
    sharded = [i for i, p in enumerate(x.placements) if isinstance(p, Shard) and p.dim == dim]
    if len(sharded) > 1:
        raise NotImplementedError("portable_softmax: a DTensor sharded on the softmax dimension over several mesh "
                                  "dimensions; shard it over one")
    if any(p.is_partial() for p in x.placements):
        raise NotImplementedError("portable_softmax: a DTensor with partial placements; redistribute it first")
    local = x.to_local()
    if sharded:
        y = (log_softmax if log else softmax)(local, dim, group=x.device_mesh.get_group(sharded[0]), dtype=dtype)
    else:
        y = (ops.log_softmax if log else ops.softmax)(local, dim, dtype=dtype)
    return DTensor.from_local(y, x.device_mesh, x.placements, run_check=False, shape=x.shape,
                              stride=_contiguous_strides(x.shape))


def _contiguous_strides(shape: torch.Size) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


# DTensors reach ``_dtensor_softmax`` through ``ops``, which recognises them without importing
# torch.distributed.tensor (``ops._is_dtensor``).
ops.use_dtensor(_dtensor_softmax)

__all__ = ["softmax", "log_softmax", "cross_entropy", "linear_cross_entropy"]
