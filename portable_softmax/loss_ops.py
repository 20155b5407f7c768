"""``cross_entropy`` and ``logsumexp`` as torch custom operators, so that ``torch.compile`` traces
through them with ``fullgraph=True`` (torch 2.4 and later, as ``torch_ops``)::

    portable_softmax::cross_entropy(Tensor input, Tensor target, Tensor? weight, int ignore_index,
        str reduction, float label_smoothing, float z_loss, float? softcap, bool write_grad)
        -> (Tensor loss, Tensor lse, Tensor grad, Tensor stats)
    portable_softmax::cross_entropy_backward(Tensor input, Tensor target, Tensor? weight,
        Tensor stats, Tensor lse, Tensor dloss, int ignore_index, str reduction,
        float label_smoothing, float z_loss, float? softcap) -> Tensor
    portable_softmax::cross_entropy_rescale(Tensor(a!) grad, Tensor dloss) -> ()
    portable_softmax::logsumexp(Tensor x, int[] dim, bool keepdim) -> Tensor

The forward operator returns the gradient it held (``write_grad``; empty otherwise) and the
reduction's values, which the autograd formula rescales in place or recomputes from. A compiled
call never writes into the logits (``inplace_backward`` is an eager option).

``fake`` also serves meta tensors in eager calls.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from portable_softmax import loss_arguments, loss_rows
from portable_softmax.loss_arguments import Options
from portable_softmax.torch_ops import HAS_CUSTOM_OP, NAMESPACE

AVAILABLE = False
"""Whether the operators are registered (torch >= 2.4)."""


def fake(x: torch.Tensor, options: Options) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss and lse of a call as shapes and dtypes (meta and fake tensors)."""
    positions = loss_arguments._positions(x.shape)
    loss = x.new_empty(positions if options.reduction == "none" else (), dtype=x.dtype)
    return loss, x.new_empty(positions, dtype=loss_arguments._acc(x.dtype))


def _options(input: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], ignore_index: int,
             reduction: str, label_smoothing: float, z_loss: float, softcap: Optional[float]) -> Options:
    return loss_arguments.validate(input, target, weight, ignore_index, reduction, label_smoothing, z_loss, softcap)


def _forward_impl(input: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], ignore_index: int,
                  reduction: str, label_smoothing: float, z_loss: float, softcap: Optional[float],
                  write_grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    options = _options(input, target, weight, ignore_index, reduction, label_smoothing, z_loss, softcap)
    loss, lse, grad, stats, _ = loss_rows.forward(input, target, weight, options, write_grad, False)
    # Outputs are fresh tensors: the stats may be a kept constant.
    return loss, lse, grad if grad is not None else input.new_empty(0), stats.clone()


def _forward_fake(input: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], ignore_index: int,
                  reduction: str, label_smoothing: float, z_loss: float, softcap: Optional[float],
                  write_grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    options = _options(input, target, weight, ignore_index, reduction, label_smoothing, z_loss, softcap)
    loss, lse = fake(input, options)
    grad = torch.empty_like(input) if write_grad else input.new_empty(0)
    return loss, lse, grad, input.new_empty(6, dtype=loss_arguments._acc(input.dtype))


def _backward_impl(input: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], stats: torch.Tensor,
                   lse: torch.Tensor, dloss: torch.Tensor, ignore_index: int, reduction: str,
                   label_smoothing: float, z_loss: float, softcap: Optional[float]) -> torch.Tensor:
    options = _options(input, target, weight, ignore_index, reduction, label_smoothing, z_loss, softcap)
    return loss_rows.backward(input, target, weight, stats, lse, dloss, options, False)


def _backward_fake(input: torch.Tensor, *rest: Any) -> torch.Tensor:
    return torch.empty_like(input)


def _setup(ctx: Any, inputs: tuple, output: tuple) -> None:
    input, target, weight, ignore_index, reduction, label_smoothing, z_loss, softcap, write_grad = inputs
    _, lse, grad, stats = output
    ctx.arguments = (ignore_index, reduction, label_smoothing, z_loss, softcap)
    ctx.held = write_grad
    ctx.options = Options(input.shape[0 if input.dim() == 1 else 1], target.is_floating_point(), reduction,
                          ignore_index, label_smoothing, z_loss, softcap, weight is not None)
    ctx.target_dtype = target.dtype
    if write_grad:
        ctx.save_for_backward(grad)
    else:
        ctx.save_for_backward(input, target, weight, stats, lse)


def _gradient(ctx: Any, dloss: torch.Tensor, *_: Any):
    if ctx.held:
        (grad,) = ctx.saved_tensors
        _rescale_op(grad, dloss)
        return grad, None, None, None, None, None, None, None, None
    input, target, weight, stats, lse = ctx.saved_tensors
    grad = _backward_op(input, target, weight, stats, lse, dloss, *ctx.arguments) if ctx.needs_input_grad[0] else None
    target_grad = None
    if ctx.needs_input_grad[1]:
        target_grad = loss_rows.target_gradient(input, weight, stats, lse, dloss, ctx.options, ctx.target_dtype)
    return grad, target_grad, None, None, None, None, None, None, None


def _rescale_impl(grad: torch.Tensor, dloss: torch.Tensor) -> None:
    loss_rows.rescale(grad, dloss)


def _logsumexp_impl(x: torch.Tensor, dim: list[int], keepdim: bool) -> torch.Tensor:
    return loss_rows.lse_rows(x, tuple(dim), keepdim)


def _logsumexp_fake(x: torch.Tensor, dim: list[int], keepdim: bool) -> torch.Tensor:
    shape = [1 if d in dim else size for d, size in enumerate(x.shape)] if keepdim else \
        [size for d, size in enumerate(x.shape) if d not in dim]
    return x.new_empty(shape)


def _logsumexp_setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    x, dim, keepdim = inputs
    ctx.save_for_backward(x, output)
    ctx.dims, ctx.keepdim = tuple(dim), keepdim


def _logsumexp_gradient(ctx: Any, grad: torch.Tensor):
    x, lse = ctx.saved_tensors
    if type(x) is not torch.Tensor:
        # Traced (the fake and functional tensors of AOT autograd, which has no data for a kernel to
        # read): torch's own formula for logsumexp's gradient, in operations the compiler sees.
        if not ctx.keepdim:
            for d in sorted(ctx.dims):
                grad, lse = grad.unsqueeze(d), lse.unsqueeze(d)
        return grad * torch.exp(x - lse), None, None
    return loss_rows.softmax_times(x, grad, ctx.dims, ctx.keepdim), None, None


_forward_op = _backward_op = _rescale_op = logsumexp_op = None
if HAS_CUSTOM_OP:
    _forward_definition = torch.library.custom_op(
        f"{NAMESPACE}::cross_entropy", _forward_impl, mutates_args=(),
        schema="(Tensor input, Tensor target, Tensor? weight, int ignore_index, str reduction, float label_smoothing, "
               "float z_loss, float? softcap, bool write_grad) -> (Tensor, Tensor, Tensor, Tensor)")
    _backward_definition = torch.library.custom_op(
        f"{NAMESPACE}::cross_entropy_backward", _backward_impl, mutates_args=(),
        schema="(Tensor input, Tensor target, Tensor? weight, Tensor stats, Tensor lse, Tensor dloss, "
               "int ignore_index, str reduction, float label_smoothing, float z_loss, float? softcap) -> Tensor")
    _rescale_definition = torch.library.custom_op(
        f"{NAMESPACE}::cross_entropy_rescale", _rescale_impl,
        mutates_args=("grad",), schema="(Tensor(a!) grad, Tensor dloss) -> ()")
    _logsumexp_definition = torch.library.custom_op(
        f"{NAMESPACE}::logsumexp", _logsumexp_impl, mutates_args=(),
        schema="(Tensor x, int[] dim, bool keepdim) -> Tensor")
    torch.library.register_fake(_forward_definition, _forward_fake)
    torch.library.register_fake(_backward_definition, _backward_fake)
    torch.library.register_fake(_rescale_definition, lambda grad, dloss: None)
    torch.library.register_fake(_logsumexp_definition, _logsumexp_fake)
    torch.library.register_autograd(_forward_definition, _gradient, setup_context=_setup)
    torch.library.register_autograd(_logsumexp_definition, _logsumexp_gradient, setup_context=_logsumexp_setup)
    _namespace = getattr(torch.ops, NAMESPACE)
    _forward_op = _namespace.cross_entropy.default
    _backward_op = _namespace.cross_entropy_backward.default
    _rescale_op = _namespace.cross_entropy_rescale.default
    logsumexp_op = _namespace.logsumexp.default
    AVAILABLE = True


def call(x: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], options: Options,
         write_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss and lse of a validated call, through the forward operator."""
    loss, lse, _, _ = _forward_op(x, target, weight, options.ignore_index, options.reduction, options.smoothing,
                                  options.z_loss, options.softcap, write_grad)
    # lse is not differentiable (as the eager path marks it).
    return loss, lse.detach()
