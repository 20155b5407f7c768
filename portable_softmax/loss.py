"""``cross_entropy`` and ``logsumexp``: ``torch.nn.functional.cross_entropy`` and
``torch.logsumexp`` from the package's kernels, with autograd, ``torch.compile`` (custom
operators, ``loss_ops.py``), meta tensors and autocast as torch's.

``cross_entropy`` adds what LLM training asks of a loss: a z-loss, logit softcapping, lse per
position returned, and the gradient written into the logits' own storage. The row work (kernels,
the reduction's values on the device) is ``loss_rows.py``'s.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Optional, Union

import torch
import torch.nn.functional as F

from portable_softmax import loss_arguments, loss_ops, loss_rows, op_arguments, ops
from portable_softmax.loss_arguments import Options

_NAME = "portable_softmax.cross_entropy"


@functools.lru_cache(maxsize=None)
def _autocast_dtype(device_type: str, dtype: torch.dtype, autocast: torch.dtype) -> Optional[torch.dtype]:
    """The dtype torch's own cross_entropy computes ``dtype`` logits in under autocast on
    ``device_type`` (float32 on CUDA and CPU in torch 2.x), asked of torch once per state."""
    if device_type == "meta":
        return None
    with torch.autocast(device_type, dtype=autocast):
        found = F.cross_entropy(torch.zeros(1, 2, dtype=dtype, device=device_type),
                                torch.zeros(1, dtype=torch.long, device=device_type)).dtype
    return None if found == dtype else found


# Whether torch has autocast for a device type, asked once per type, outside any trace: torch
# 2.11's dynamo cannot trace ``torch._C._is_autocast_available`` (fullgraph fails on CUDA), a
# dictionary lookup it can.
_AUTOCAST_AVAILABLE = {name: torch.amp.is_autocast_available(name) for name in ("cpu", "cuda")}


def _after_autocast(x: torch.Tensor) -> torch.Tensor:
    if not x.is_floating_point():
        return x
    available = _AUTOCAST_AVAILABLE.get(x.device.type)
    if available is None:
        available = _AUTOCAST_AVAILABLE[x.device.type] = torch.amp.is_autocast_available(x.device.type)
    if not available or not torch.is_autocast_enabled(x.device.type):
        return x
    dtype = _autocast_dtype(x.device.type, x.dtype, torch.get_autocast_dtype(x.device.type))
    return x if dtype is None else x.to(dtype)


# The call that takes DTensor logits (``distributed_loss`` registers it): sharded on the class
# dimension, the loss of the whole from the shards. ``ops._is_dtensor`` recognises DTensors without
# importing torch.distributed.tensor.
_dtensor_call: Optional[Callable[..., Any]] = None


def use_dtensor(call: Callable[..., Any]) -> None:
    """Route calls on DTensor logits to ``call(input, target, weight, **options)``."""
    global _dtensor_call
    _dtensor_call = call


def _gradient(ctx: Any, dloss: torch.Tensor) -> tuple[Optional[torch.Tensor], ...]:
    """``_CrossEntropy``'s backward: the held gradient rescaled, or the gradients recomputed."""
    if ctx.was_held:
        grad = ctx.held
        if grad is None:
            raise RuntimeError(f"{_NAME}: its gradient was written in the forward and has been used; a second "
                               f"backward through the same loss is not supported (call the loss again)")
        # Let autograd take the buffer (x.grad can be it, not a copy).
        ctx.held = None
        return _own(loss_rows.rescale(grad, dloss), ctx.inplace), None, None, None
    x, target, weight, stats, lse = ctx.saved_tensors
    options = ctx.options
    target_grad = None
    if ctx.needs_input_grad[1]:
        target_grad = loss_rows.target_gradient(x, weight, stats, lse, dloss, options, target.dtype)
    grad = None
    if ctx.needs_input_grad[0]:
        grad = loss_rows.backward(x, target, weight, stats, lse, dloss, options, ctx.inplace)
        if ctx.inplace:
            torch.autograd.graph.increment_version(x)
        grad = _own(grad, ctx.inplace)
    return grad, target_grad, None, None


def _own(grad: torch.Tensor, inplace: bool) -> torch.Tensor:
    """The gradient as a tensor no one else holds, so that autograd's accumulation into a leaf
    takes it as the leaf's ``.grad``. Written over the logits (``inplace``), it is the logits
    tensor itself: returned as is, a leaf's accumulation would copy it (H200: twice the time and
    the whole gradient's memory again, NOTES v31); an alias of the same storage is taken."""
    return grad.detach() if inplace else grad


_gradient_once = torch.autograd.function.once_differentiable(_gradient)


class _CrossEntropy(torch.autograd.Function):
    """The eager path: the forward's gradient (``loss_rows.writes_gradient``) rescaled in the
    backward, or the gradient recomputed from the saved lse. ``call``: the options, write_grad
    and inplace, one argument (``apply`` walks each)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor],
                call: tuple[Options, bool, bool]) -> tuple[torch.Tensor, torch.Tensor]:
        options, write_grad, inplace = call
        loss, lse, grad, stats, read = loss_rows.forward(x, target, weight, options, write_grad, inplace)
        # The held gradient is kept out of save_for_backward: written into x's storage, it would
        # fail the saved-version check by design. Nothing else is saved with it.
        ctx.held, ctx.was_held, ctx.options, ctx.inplace = grad, grad is not None, options, inplace
        if grad is None:
            ctx.save_for_backward(read, target, weight, stats, lse)
        elif inplace:
            # x now holds its gradient: a later use of it in autograd must raise, not read that.
            torch.autograd.graph.increment_version(x)
        ctx.mark_non_differentiable(lse)
        # lse takes no gradient (non-differentiable): no zeros made for it in the backward. dloss
        # is always given: the loss is the only output a backward can come through.
        ctx.set_materialize_grads(False)
        return loss, lse

    @staticmethod
    def backward(ctx: Any, dloss: torch.Tensor, _: Optional[torch.Tensor]):
        # Differentiable once: where a graph of the backward is built (create_graph), through
        # once_differentiable, whose later use raises; elsewhere its work (a no_grad block, the
        # checks) would change nothing.
        if torch.is_grad_enabled():
            return _gradient_once(ctx, dloss)
        return _gradient(ctx, dloss)


def cross_entropy(input: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor] = None, *,
                  ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                  z_loss: float = 0.0, softcap: Optional[float] = None, return_lse: bool = False,
                  inplace_backward: bool = False) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """The cross-entropy of ``input`` logits against ``target``, as
    ``torch.nn.functional.cross_entropy`` (same arguments, order and defaults), with extras.

    Args:
        input: logits (C,), (N, C) or (N, C, d1, ...) (classes on dim 1), any floating dtype and
            strides; math in float32 (float64 for float64 input). A DTensor sharded on the class
            dimension: the loss of the whole from its shards (``distributed.cross_entropy``).
        target: class indices of any integer dtype, shape (), (N) or (N, d1, ...); or class
            probabilities, floating, of input's shape.
        weight: a weight per class (C,), as torch's (with smoothing too).
        ignore_index: a class index whose positions count for nothing (class indices only).
        reduction: 'mean' (divided by the summed weights of the counted targets; probability
            targets: by the positions), 'sum' or 'none'. A 'mean' over no counted target is NaN.
        label_smoothing: eps in [0, 1], as torch's: (1 - eps) of the loss against the target, eps
            against the uniform distribution (probability targets: q (1 - eps) + eps / C).
        z_loss: adds ``z_loss * lse**2`` per counted position (PaLM's auxiliary loss), not
            weighted by the class weights; 'mean' divides it by the number of counted positions,
            'sum' sums it, 'none' gives it per position.
        softcap: logits become ``softcap * tanh(logits / softcap)`` before everything else
            (Gemma 2), differentiated through.
        return_lse: also return lse (log-sum-exp of the logits, after the softcap) per position,
            shape of the positions, float32 (float64 for float64 input), not differentiable.
        inplace_backward: write the gradient into ``input``'s storage (its memory saved); the
            logits are then gone: a later autograd use of ``input`` raises (its version counter
            is bumped). Where they cannot be written in place (rows not walkable in place; under
            ``torch.compile``) a new buffer is used.

    Returns:
        The loss in input's dtype (a scalar, or per position with 'none'), differentiable once
        with respect to ``input`` and probability targets; with ``return_lse``, ``(loss, lse)``.

    Raises:
        TypeError, ValueError: an argument of the wrong type, shape, device or range (named).
        IndexError: on CPU, a target outside [0, C) that is not ``ignore_index`` (on an
            accelerator its position's loss is NaN instead: no host synchronisation).
    """
    if _dtensor_call is not None and type(input) is not torch.Tensor and ops._is_dtensor(input):
        return _dtensor_call(input, target, weight, ignore_index=ignore_index, reduction=reduction,
                             label_smoothing=label_smoothing, z_loss=z_loss, softcap=softcap, return_lse=return_lse,
                             inplace_backward=inplace_backward)
    options = loss_arguments.validate(input, target, weight, ignore_index, reduction, label_smoothing, z_loss, softcap)
    x = _after_autocast(input)
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or target.requires_grad)
    if x.device.type == "meta":
        loss, lse = loss_ops.fake(x, options)
    elif loss_ops.AVAILABLE and ops._compiling():
        write_grad = loss_rows.writes_gradient(x, options, needs_grad and not target.requires_grad, False)
        loss, lse = loss_ops.call(x, target, weight, options, write_grad)
    else:
        # A gradient for probability targets needs the logits kept: the gradient is then recomputed.
        write_grad = loss_rows.writes_gradient(x, options, needs_grad and not target.requires_grad,
                                              inplace_backward)
        if needs_grad:
            loss, lse = _CrossEntropy.apply(x, target, weight, (options, write_grad, inplace_backward))
        else:
            loss, lse = loss_rows.forward_alone(x, target, weight, options)
    return (loss, lse) if return_lse else loss


def _dims(x: torch.Tensor, dim: Union[int, Sequence[int]]) -> tuple[int, ...]:
    rank = max(x.dim(), 1)
    found = (dim,) if isinstance(dim, int) and not isinstance(dim, bool) else tuple(dim)
    for d in found:
        if isinstance(d, bool) or not isinstance(d, int):
            raise TypeError(f"portable_softmax.logsumexp: dim must be an int or a sequence of ints, got {dim!r}")
        if not -rank <= d < rank:
            raise op_arguments.DimensionError(f"portable_softmax.logsumexp: dim {d} is out of range for a tensor of "
                                     f"{x.dim()} dimension(s) (expected {-rank} to {rank - 1})")
    normalized = tuple(sorted({d % rank for d in found}))
    if not normalized:
        raise ValueError("portable_softmax.logsumexp: dim must name at least one dimension")
    return normalized


class _LogSumExp(torch.autograd.Function):
    """backward: softmax over the reduced dims times the incoming gradient (the softmax kernels)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dims: tuple[int, ...], keepdim: bool) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.dims, ctx.keepdim = dims, keepdim
        return loss_rows.lse_rows(x, dims, keepdim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        (x,) = ctx.saved_tensors
        return loss_rows.softmax_times(x, grad, ctx.dims, ctx.keepdim), None, None


def logsumexp(x: torch.Tensor, dim: Union[int, Sequence[int]], keepdim: bool = False) -> torch.Tensor:
    """log(sum(exp(x))) over ``dim``, as ``torch.logsumexp``: any dim or dims, any strides,
    differentiable (the backward is the softmax kernels' times the incoming gradient).

    Args:
        x: a tensor (integer inputs are cast to the default floating dtype, as torch does).
        dim: a dimension or a sequence of them.
        keepdim: keep the reduced dimensions with size 1.

    Returns:
        The result in x's (floating) dtype.

    Raises:
        IndexError: a dim out of range (a :class:`DimensionError`, also a ValueError).
        TypeError: dim is not an int or a sequence of ints.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"portable_softmax.logsumexp: expected a tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        x = x.to(torch.get_default_dtype())
    dims = _dims(x, dim)
    if x.device.type == "meta":
        return torch.logsumexp(x, dims, keepdim)
    if loss_ops.AVAILABLE and ops._compiling():
        return loss_ops.logsumexp_op(x, list(dims), keepdim)
    if x.requires_grad and torch.is_grad_enabled():
        return _LogSumExp.apply(x, dims, keepdim)
    return loss_rows.lse_rows(x, dims, keepdim)


__all__ = ["cross_entropy", "logsumexp"]
