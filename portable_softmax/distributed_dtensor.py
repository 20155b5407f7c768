"""DTensor logits sharded on the class dimension in ``portable_softmax.cross_entropy`` (torch's
``loss_parallel``): ``distributed_loss.cross_entropy`` over the sharding mesh dimension's group,
the result placed as torch's. Registered with ``loss`` on import (``distributed`` imports it)."""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F

from portable_softmax import loss
from portable_softmax.distributed_loss import cross_entropy


def _dtensor_cross_entropy(input: Any, target: Any, weight: Any, *, ignore_index: int, reduction: str,
                           label_smoothing: float, z_loss: float, softcap: Optional[float], return_lse: bool,
                           inplace_backward: bool) -> Any:
    """``portable_softmax.cross_entropy`` of DTensor logits. Sharded on the class dimension (over
    one mesh dimension): ``cross_entropy`` over that mesh dimension's group, with torch's
    ``loss_parallel`` placements (target: the input's, the class dimension's shard replicated
    and later dimensions' shards shifted down; 'none' and lse placed as it, 'sum' replicated over
    the class shards and partial over the others, 'mean' on a one-dimensional mesh only). Not
    sharded on it: torch's own cross-entropy of the DTensor (which propagates its placements)."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    class_dim = 0 if input.dim() == 1 else 1
    placements = tuple(input.placements)
    sharded = [i for i, p in enumerate(placements) if p.is_shard(class_dim)]
    if not sharded:
        if z_loss or softcap is not None or return_lse or inplace_backward:
            raise NotImplementedError("portable_softmax.cross_entropy: z_loss, softcap, return_lse and "
                                      "inplace_backward of a DTensor need it sharded on the class dimension")
        return F.cross_entropy(input, target, weight, ignore_index=ignore_index, reduction=reduction,
                               label_smoothing=label_smoothing)
    if len(sharded) > 1 or any(not (p.is_shard() or p.is_replicate()) for p in placements):
        raise NotImplementedError(f"portable_softmax.cross_entropy: a DTensor sharded on the class dimension over one "
                                  f"mesh dimension, the others sharded or replicated, got {placements}")
    if inplace_backward:
        raise NotImplementedError("portable_softmax.cross_entropy: inplace_backward of a DTensor is not supported")
    mesh, tp = input.device_mesh, sharded[0]
    if reduction == "mean" and mesh.ndim > 1:
        raise NotImplementedError("portable_softmax.cross_entropy: reduction='mean' of a DTensor on a mesh of "
                                  f"{mesh.ndim} dimensions (as torch's loss_parallel); use 'sum' or 'none'")
    positions = tuple(Replicate() if i == tp or not p.is_shard() else Shard(p.dim - (p.dim > class_dim))
                      for i, p in enumerate(placements))
    if isinstance(target, DTensor):
        if tuple(target.placements) != positions:
            raise ValueError(f"portable_softmax.cross_entropy: target placements {tuple(target.placements)}, "
                             f"expected {positions} for input placements {placements}")
        target = target.to_local()
    elif any(p.is_shard() for p in positions):
        raise ValueError(f"portable_softmax.cross_entropy: target must be a DTensor placed {positions} (a plain "
                         f"tensor would be ambiguous: the whole or this rank's shard)")
    if isinstance(weight, DTensor):
        weight = weight.full_tensor()
    result, lse = cross_entropy(_local_logits(input), target, weight, group=mesh.get_group(tp), ignore_index=ignore_index,
                                reduction=reduction, label_smoothing=label_smoothing, z_loss=z_loss, softcap=softcap,
                                return_lse=True)
    shape = input.shape[:class_dim] + input.shape[class_dim + 1:]

    def placed(t: torch.Tensor, where: tuple, size: tuple) -> Any:
        stride = torch.empty(size, device="meta").stride()
        return DTensor.from_local(t, mesh, where, run_check=False, shape=torch.Size(size), stride=stride)

    if reduction == "none":
        result = placed(result, positions, shape)
    else:
        result = placed(result, tuple(Partial() if p.is_shard() else Replicate() for p in positions), ())
    return (result, placed(lse, positions, shape)) if return_lse else result


class _LocalLogits(torch.autograd.Function):
    """A DTensor's local tensor, whose gradient returns as a DTensor of the input's placements,
    shape and strides. ``DTensor.to_local``'s backward derives the global strides from the local
    gradient's (torch 2.11: (24, 1) for a (6, 23) input in two shards of 12 and 11, not its
    (23, 1)); autograd's gradient layout contract then fails, and the accumulation into the leaf's
    ``.grad`` went through a replicated copy: on two H200s (2026-11-28,
    ``benchmarks/probes/dtensor_grad_placement.py``) every rank held the whole gradient, where
    ``loss_parallel``'s stays sharded."""

    @staticmethod
    def forward(ctx: Any, input: Any) -> torch.Tensor:
        ctx.mesh, ctx.placements = input.device_mesh, tuple(input.placements)
        ctx.shape, ctx.stride = input.shape, input.stride()
        local = input.to_local()
        # A fresh tensor object: autograd's metadata goes on it, not on the DTensor's own.
        return local.view_as(local)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(grad, ctx.mesh, ctx.placements, run_check=False, shape=ctx.shape, stride=ctx.stride)


def _local_logits(input: Any) -> torch.Tensor:
    return _LocalLogits.apply(input)


# DTensor logits reach ``_dtensor_cross_entropy`` through ``loss.cross_entropy``.
loss.use_dtensor(_dtensor_cross_entropy)
