"""``linear_cross_entropy`` as torch custom operators, so that ``torch.compile`` traces through it
with ``fullgraph=True`` (as ``loss_ops`` does for ``cross_entropy``)::

    portable_softmax::linear_cross_entropy(Tensor hidden, Tensor weight, Tensor target, Tensor? bias,
        Tensor? class_weight, int ignore_index, str reduction, float label_smoothing, float z_loss,
        float? softcap, int? chunk_bytes, ScalarType accumulate_dtype, ScalarType loss_dtype,
        bool grad_hidden, bool grad_weight, bool grad_bias)
        -> (Tensor loss, Tensor lse, Tensor stats, Tensor grad_hidden, Tensor grad_weight, Tensor grad_bias)
    portable_softmax::linear_cross_entropy_backward(Tensor hidden, Tensor weight, Tensor target,
        Tensor? bias, Tensor? class_weight, Tensor stats, Tensor lse, Tensor dloss, <the same
        values>) -> (Tensor grad_hidden, Tensor grad_weight, Tensor grad_bias)

The forward operator returns the gradients it formed (a reduced loss; empty tensors otherwise),
which the autograd formula rescales (``loss_ops``'s rescale operator, in place) and casts to the
weight's dtype; with reduction='none' the formula calls the backward operator, which recomputes.

``fake`` also serves meta tensors in eager calls.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from portable_softmax import head_chunks, loss_arguments, loss_ops
from portable_softmax.head_chunks import HeadCall
from portable_softmax.loss_arguments import Options
from portable_softmax.torch_ops import HAS_CUSTOM_OP, NAMESPACE

AVAILABLE = False
"""Whether the operators are registered (torch >= 2.4)."""


def fake(hidden: torch.Tensor, weight: torch.Tensor, call: HeadCall) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss and lse of a call on (N, H) hidden states as shapes and dtypes."""
    n_rows = hidden.shape[0]
    loss = hidden.new_empty((n_rows,) if call.options.reduction == "none" else (), dtype=call.loss_dtype)
    return loss, hidden.new_empty(n_rows, dtype=loss_arguments._acc(hidden.dtype))


def _call(weight: torch.Tensor, class_weight: Optional[torch.Tensor], ignore_index: int,
          reduction: str, label_smoothing: float, z_loss: float, softcap: Optional[float], chunk_bytes: Optional[int],
          accumulate_dtype: torch.dtype, loss_dtype: torch.dtype, grad_hidden: bool, grad_weight: bool,
          grad_bias: bool) -> HeadCall:
    options = Options(weight.shape[0], False, reduction, ignore_index, label_smoothing, z_loss, softcap,
                      class_weight is not None)
    return HeadCall(options, chunk_bytes, accumulate_dtype, loss_dtype, grad_hidden, grad_weight, grad_bias)


def _or_empty(t: Optional[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    return t if t is not None else like.new_empty(0)


def _forward_impl(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
                  class_weight: Optional[torch.Tensor], *values: Any) -> tuple[torch.Tensor, ...]:
    call = _call(weight, class_weight, *values)
    loss, lse, stats, grads = head_chunks.forward(hidden, weight, target, bias, class_weight, call)
    grads = grads or head_chunks.Gradients(None, None, None)
    # Outputs are fresh tensors: the stats may be a kept constant.
    return (loss, lse, stats.clone(), _or_empty(grads.hidden, hidden), _or_empty(grads.weight, weight),
            _or_empty(grads.bias, weight))


def _forward_fake(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
                  class_weight: Optional[torch.Tensor], *values: Any) -> tuple[torch.Tensor, ...]:
    call = _call(weight, class_weight, *values)
    loss, lse = fake(hidden, weight, call)
    held = call.grad_in_forward
    wide = call.accumulate_dtype
    return (loss, lse, hidden.new_empty(6, dtype=loss_arguments._acc(hidden.dtype)),
            torch.empty_like(hidden) if held and call.grad_hidden else hidden.new_empty(0),
            weight.new_empty(weight.shape, dtype=wide) if held and call.grad_weight else weight.new_empty(0),
            weight.new_empty(weight.shape[0], dtype=wide) if held and call.grad_bias and bias is not None
            else weight.new_empty(0))


def _backward_impl(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
                   class_weight: Optional[torch.Tensor], stats: torch.Tensor, lse: torch.Tensor, dloss: torch.Tensor,
                   *values: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    call = _call(weight, class_weight, *values)
    grads = head_chunks.backward(hidden, weight, target, bias, class_weight, stats, lse, dloss, call)
    return _or_empty(grads.hidden, hidden), _or_empty(grads.weight, weight), _or_empty(grads.bias, weight)


def _backward_fake(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
                   class_weight: Optional[torch.Tensor], stats: torch.Tensor, lse: torch.Tensor, dloss: torch.Tensor,
                   *values: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    call = _call(weight, class_weight, *values)
    wide = call.accumulate_dtype
    return (torch.empty_like(hidden) if call.grad_hidden else hidden.new_empty(0),
            weight.new_empty(weight.shape, dtype=wide) if call.grad_weight else weight.new_empty(0),
            weight.new_empty(weight.shape[0], dtype=wide) if call.grad_bias and bias is not None
            else weight.new_empty(0))


def _setup(ctx: Any, inputs: tuple, output: tuple) -> None:
    hidden, weight, target, bias, class_weight, *values = inputs
    _, lse, stats, grad_hidden, grad_weight, grad_bias = output
    call = _call(weight, class_weight, *values)
    ctx.values, ctx.call = tuple(values), call
    ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
    if call.grad_in_forward:
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
    else:
        ctx.save_for_backward(hidden, weight, target, bias, class_weight, stats, lse)


def _finish(grad: torch.Tensor, dloss: Optional[torch.Tensor], dtype: Optional[torch.dtype],
            wanted: bool) -> Optional[torch.Tensor]:
    """``head_chunks.finish`` in operations the compiler sees: the in-place rescale as an
    operator that declares its mutation, the scaled cast as torch's."""
    if not wanted or dtype is None:
        return None
    if grad.dtype == dtype:
        if dloss is not None:
            loss_ops._rescale_op(grad, dloss)
        return grad
    return (grad if dloss is None else grad * dloss.reshape(())).to(dtype)


def _gradient(ctx: Any, dloss: torch.Tensor, *_: Any):
    call = ctx.call
    if call.grad_in_forward:
        grads, scale = ctx.saved_tensors, dloss
    else:
        grads, scale = _backward_op(*ctx.saved_tensors, dloss, *ctx.values), None
    wanted = (call.grad_hidden, call.grad_weight, call.grad_bias)
    hidden, weight, bias = (_finish(g, scale, dtype, w) for g, dtype, w in zip(grads, ctx.dtypes, wanted))
    return (hidden, weight, None, bias) + (None,) * (1 + len(ctx.values))


_forward_op = _backward_op = None
if HAS_CUSTOM_OP:
    _VALUES = ("int ignore_index, str reduction, float label_smoothing, float z_loss, float? softcap, "
               "int? chunk_bytes, ScalarType accumulate_dtype, ScalarType loss_dtype, bool grad_hidden, bool grad_weight, bool grad_bias")
    _forward_definition = torch.library.custom_op(
        f"{NAMESPACE}::linear_cross_entropy", _forward_impl, mutates_args=(),
        schema=f"(Tensor hidden, Tensor weight, Tensor target, Tensor? bias, Tensor? class_weight, {_VALUES}) "
               f"-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")
    _backward_definition = torch.library.custom_op(
        f"{NAMESPACE}::linear_cross_entropy_backward", _backward_impl, mutates_args=(),
        schema=f"(Tensor hidden, Tensor weight, Tensor target, Tensor? bias, Tensor? class_weight, Tensor stats, "
               f"Tensor lse, Tensor dloss, {_VALUES}) -> (Tensor, Tensor, Tensor)")
    torch.library.register_fake(_forward_definition, _forward_fake)
    torch.library.register_fake(_backward_definition, _backward_fake)
    torch.library.register_autograd(_forward_definition, _gradient, setup_context=_setup)
    _namespace = getattr(torch.ops, NAMESPACE)
    _forward_op = _namespace.linear_cross_entropy.default
    _backward_op = _namespace.linear_cross_entropy_backward.default
    AVAILABLE = True


def call(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
         class_weight: Optional[torch.Tensor], settings: HeadCall) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss and lse of a validated call on (N, H) hidden states, through the forward operator."""
    o = settings.options
    loss, lse, *_ = _forward_op(hidden, weight, target, bias, class_weight, o.ignore_index, o.reduction, o.smoothing,
                                o.z_loss, o.softcap, settings.chunk_bytes, settings.accumulate_dtype,
                                settings.loss_dtype, settings.grad_hidden, settings.grad_weight, settings.grad_bias)
    # lse is not differentiable (as the eager path marks it).
    return loss, lse.detach()
