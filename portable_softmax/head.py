"""``linear_cross_entropy``: the LLM head and its loss, ``cross_entropy(hidden @ weight.T + bias,
target)``, without ever holding all the logits (the largest activation of LLM training: 16384
tokens x 128256 classes are 4.2 GB in bfloat16, and as much again for their gradient).

The work is ``head_chunks.py``'s (chunks of tokens from a memory budget; the loss kernels write
each chunk's gradient over its logits; the gradients formed in the forward); ``head_ops.py`` makes
it one operator for ``torch.compile``. This module validates, follows autocast, and ties the
gradients to autograd.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import torch

from portable_softmax import head_chunks, head_ops, loss, loss_arguments, op_arguments, ops
from portable_softmax.head_chunks import HeadCall

_NAME = "portable_softmax.linear_cross_entropy"


class _LinearCrossEntropy(torch.autograd.Function):
    """The eager path: gradients formed in the forward and rescaled in the backward (a reduced
    loss), or recomputed from the saved lse ('none')."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                bias: Optional[torch.Tensor], class_weight: Optional[torch.Tensor],
                call: HeadCall) -> tuple[torch.Tensor, torch.Tensor]:
        result, lse, stats, grads = head_chunks.forward(hidden, weight, target, bias, class_weight, call, narrow=True)
        ctx.call, ctx.held = call, grads
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        if grads is None:
            ctx.save_for_backward(hidden, weight, target, bias, class_weight, stats, lse)
        ctx.mark_non_differentiable(lse)
        return result, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, dloss: torch.Tensor, _: Optional[torch.Tensor]):
        call = ctx.call
        if call.grad_in_forward:
            grads = ctx.held
            if grads is None:
                raise RuntimeError(f"{_NAME}: its gradients were formed in the forward and have been used; a second "
                                   f"backward through the same loss is not supported (call it again)")
            # Autograd takes the buffers (weight.grad can be the rescaled buffer itself).
            ctx.held, scale = None, dloss
        else:
            grads = head_chunks.backward(*ctx.saved_tensors, dloss, call, narrow=True)
            scale = None
        hidden, weight, bias = (head_chunks.finish(g, scale, dtype) if dtype is not None else None
                                for g, dtype in zip(grads, ctx.dtypes))
        return hidden, weight, None, bias, None, None


def _autocast(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]):
    """The factors as torch's autocast gives them to ``F.linear`` (its lower-precision dtype), and
    the dtype its ``cross_entropy`` returns then (float32); unchanged, and hidden's dtype,
    outside autocast."""
    device_type = hidden.device.type
    if device_type not in ("cpu", "cuda") or not torch.is_autocast_enabled(device_type):
        return hidden, weight, bias, hidden.dtype
    dtype = torch.get_autocast_dtype(device_type)
    hidden, weight = hidden.to(dtype), weight.to(dtype)
    bias = bias.to(dtype) if bias is not None else None
    return hidden, weight, bias, loss._autocast_dtype(device_type, dtype, dtype) or dtype


def _check_tensors(hidden: Any, weight: Any, target: Any, bias: Any, class_weight: Any) -> None:
    if not isinstance(hidden, torch.Tensor) or hidden.dtype not in op_arguments.FLOATING:
        raise TypeError(f"{_NAME}: hidden must be a float16, bfloat16, float32 or float64 tensor, got "
                        f"{getattr(hidden, 'dtype', type(hidden).__name__)}")
    if hidden.dim() == 0:
        raise ValueError(f"{_NAME}: hidden must have a last dimension of features (shape (..., H)), got a 0-d tensor")
    features = hidden.shape[-1]
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[1] != features or not weight.shape[0]:
        raise ValueError(f"{_NAME}: weight must have shape (V, {features}) (V >= 1 classes x hidden's features), "
                         f"got {tuple(getattr(weight, 'shape', ()))}")
    n_classes = weight.shape[0]
    for name, t in (("bias", bias), ("class_weight", class_weight)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or tuple(t.shape) != (n_classes,):
            raise ValueError(f"{_NAME}: {name} must be a floating tensor of shape ({n_classes},) (one value per "
                             f"class), got {getattr(t, 'dtype', type(t).__name__)} of shape "
                             f"{tuple(getattr(t, 'shape', ()))}")
    for name, t in (("weight", weight), ("bias", bias), ("class_weight", class_weight)):
        if t is not None and t.device != hidden.device:
            raise ValueError(f"{_NAME}: {name} is on {t.device}, hidden on {hidden.device}; move it to hidden's device")
    if not isinstance(target, torch.Tensor) or target.is_floating_point() or target.is_complex() \
            or target.dtype == torch.bool:
        raise TypeError(f"{_NAME}: target must hold class indices (an integer tensor), got "
                        f"{getattr(target, 'dtype', type(target).__name__)}")
    if tuple(target.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(f"{_NAME}: target must have shape {tuple(hidden.shape[:-1])} (hidden's without its last "
                         f"dimension), got {tuple(target.shape)}")


def _check_factors(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
    """The matmul's factors in one dtype (after autocast, as ``F.linear`` needs them)."""
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != hidden.dtype:
            raise TypeError(f"{_NAME}: {name} must have hidden's dtype {hidden.dtype}, got {t.dtype} (cast it, or "
                            f"call under torch.autocast)")


def _accumulate(accumulate_dtype: Optional[torch.dtype], dtype: torch.dtype) -> torch.dtype:
    wide = loss_arguments._acc(dtype)
    if accumulate_dtype is None:
        return wide
    if accumulate_dtype not in (dtype, torch.float32, torch.float64):
        raise ValueError(f"{_NAME}: accumulate_dtype must be None (float32, float64 for float64 weights), "
                         f"torch.float32, torch.float64 or the weight's dtype {dtype}, got {accumulate_dtype}")
    return accumulate_dtype


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                         bias: Optional[torch.Tensor] = None, *, class_weight: Optional[torch.Tensor] = None,
                         ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                         z_loss: float = 0.0, softcap: Optional[float] = None, return_lse: bool = False,
                         chunk_bytes: Optional[int] = None, accumulate_dtype: Optional[torch.dtype] = None
                         ) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """``cross_entropy(hidden @ weight.T + bias, target, ...)`` without all the logits: chunks of
    tokens, each chunk's gradient formed in the forward (module docstring; ``head_chunks``).

    Args:
        hidden: (..., H) hidden states, float16, bfloat16, float32 or float64.
        weight: (V, H) the head's weight (``nn.Linear(H, V).weight``), hidden's dtype and device.
        target: (...) class indices, hidden's shape without its last dimension.
        bias: (V,) or None.
        class_weight: a weight per class (V,): ``cross_entropy``'s ``weight``.
        ignore_index, reduction, label_smoothing, z_loss, softcap, return_lse: as ``cross_entropy``'s
            (the logits softcapped are ``hidden @ weight.T + bias``).
        chunk_bytes: the most bytes of logits a chunk holds. Default: 1 GiB and at most 1/16 of
            the device memory free, read once per call; a fixed value fixes the chunks, and with
            them the bits of the weight's gradient (its sum runs chunk by chunk).
        accumulate_dtype: the dtype the weight's and bias's gradients are summed in over the
            chunks: float32 by default (float64 for float64), or the weight's dtype (less memory,
            rounded at every chunk).

    Returns:
        The loss (a scalar, or (...) with 'none') in hidden's dtype (float32 under autocast, as
        torch's cross_entropy), differentiable once with respect to hidden, weight and bias; with
        ``return_lse``, ``(loss, lse)``, lse (...) float32, not differentiable.

    Raises:
        TypeError, ValueError: an argument of the wrong type, shape, dtype, device or range (named).
        IndexError: on CPU, a target outside [0, V) that is not ``ignore_index`` (on an
            accelerator its position's loss is NaN instead: no host synchronisation).
    """
    _check_tensors(hidden, weight, target, bias, class_weight)
    if chunk_bytes is not None and (isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int)
                                    or chunk_bytes < 1):
        raise ValueError(f"{_NAME}: chunk_bytes must be a positive int or None, got {chunk_bytes!r}")
    leading = hidden.shape[:-1]
    n_classes = weight.shape[0]
    # The scalar options are cross_entropy's, checked as it checks them, on a stand-in for the
    # (N, V) logits that holds one element.
    flat_target = target.reshape(-1)
    stand_in = hidden.new_empty(1).expand(flat_target.shape[0], n_classes)
    options = loss_arguments.validate(stand_in, flat_target, class_weight, ignore_index, reduction, label_smoothing,
                                 z_loss, softcap)
    hidden, weight, bias, loss_dtype = _autocast(hidden, weight, bias)
    _check_factors(hidden, weight, bias)
    accumulate = _accumulate(accumulate_dtype, weight.dtype)
    rows = hidden.reshape(-1, hidden.shape[-1])
    grad = torch.is_grad_enabled()
    call = HeadCall(options, chunk_bytes, accumulate, loss_dtype, grad and hidden.requires_grad,
                    grad and weight.requires_grad, grad and bias is not None and bias.requires_grad)
    if hidden.device.type == "meta":
        result, lse = head_ops.fake(rows, weight, call)
    elif head_ops.AVAILABLE and ops._compiling():
        result, lse = head_ops.call(rows, weight, flat_target, bias, class_weight, call)
    elif call.wants_grad:
        result, lse = _LinearCrossEntropy.apply(rows, weight, flat_target, bias, class_weight, call)
    else:
        result, lse, _, _ = head_chunks.forward(rows, weight, flat_target, bias, class_weight, call)
    if reduction == "none":
        result = result.reshape(leading)
    return (result, lse.reshape(leading)) if return_lse else result


__all__ = ["linear_cross_entropy"]
