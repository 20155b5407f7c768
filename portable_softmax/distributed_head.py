"""The tensor-parallel LLM head and its loss: ``linear_cross_entropy`` (as
``portable_softmax.distributed.linear_cross_entropy``), the cross-entropy of
``hidden @ weight.T + bias`` whose classes (the weight's rows) the ranks of a group hold in
slices, in rank order (``distributed_loss``'s vocabulary-parallel loss over the local logits).

The local logits by the vendor's BLAS (``torch.addmm``); the loss of the whole from them
(``distributed_loss.forward``: two all-reduces of per-row statistics); with a reduced loss and a
gradient wanted, the gradient of the logits is written over them in the forward, then the three
products: ``grad_logits @ weight`` (this slice's part of the hidden states' gradient, summed over
the ranks by one ``all_reduce``, so that every rank holds the whole), ``grad_logits.T @ hidden``
and the bias's column sums. The backward only rescales them by the incoming gradient (nothing to
do when it is 1: decided on the device). With ``reduction='none'`` the incoming gradient weighs
each row, which the forward cannot know: the backward recomputes the logits (one more matmul) and
their gradient from the saved per-row statistics, with no collective besides the hidden states'.

The reduction's factors are formed from the whole batch of targets (``distributed_loss.factors``)
and the per-row work takes any block of rows with them, so that the rows can be taken in chunks
of tokens; here they are one block: the local logits (tokens x the slice's classes) are held
once, then their gradient in their place.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import torch
import torch.distributed as dist

from portable_softmax import distributed_loss, loss_rows
from portable_softmax.loss_rows import Options

_NAME = "portable_softmax.distributed.linear_cross_entropy"


def _logits(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return torch.mm(hidden, weight.t()) if bias is None else torch.addmm(bias, hidden, weight.t())


def _products(grad_logits: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, wanted: tuple[bool, ...],
              group: Optional[dist.ProcessGroup]) -> tuple[Optional[torch.Tensor], ...]:
    """The gradients of hidden (summed over the ranks), weight and bias from the logits'."""
    grad_hidden = grad_weight = grad_bias = None
    if wanted[0]:
        grad_hidden = torch.mm(grad_logits, weight)
        dist.all_reduce(grad_hidden, group=group)
    if wanted[1]:
        grad_weight = torch.mm(grad_logits.t(), hidden)
    if wanted[2]:
        grad_bias = grad_logits.sum(0)
    return grad_hidden, grad_weight, grad_bias


class _VocabParallelHead(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                bias: Optional[torch.Tensor], class_weight: Optional[torch.Tensor], options: Options,
                group: Optional[dist.ProcessGroup], wanted: tuple[bool, bool, bool]) -> tuple[torch.Tensor, torch.Tensor]:
        result, lse, held, saved = _forward(hidden, weight, target, bias, class_weight, options, group, wanted)
        ctx.options, ctx.group, ctx.wanted, ctx.held = options, group, wanted, held
        if held is None:
            ctx.save_for_backward(hidden, weight, bias, *saved)
        ctx.mark_non_differentiable(lse)
        return result, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, dloss: torch.Tensor, _: Optional[torch.Tensor]):
        if ctx.held is not None:
            grads, ctx.held = ctx.held, None
            grads = tuple(loss_rows.rescale(g, dloss) if g is not None else None for g in grads)
        else:
            hidden, weight, bias, *saved = ctx.saved_tensors
            logits = _logits(hidden, weight, bias)
            grad_logits = distributed_loss.gradient(logits, distributed_loss.Exchanged(*saved), dloss, ctx.options,
                                                    inplace=True)
            grads = _products(grad_logits, hidden, weight, ctx.wanted, ctx.group)
        grad_hidden, grad_weight, grad_bias = grads
        return grad_hidden, grad_weight, None, grad_bias, None, None, None, None


def _forward(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
             class_weight: Optional[torch.Tensor], options: Options, group: Optional[dist.ProcessGroup],
             wanted: tuple[bool, bool, bool]
             ) -> tuple[torch.Tensor, torch.Tensor, Optional[tuple], distributed_loss.Exchanged]:
    """The loss, lse, the gradients formed in the forward (a reduced loss with some wanted; None
    otherwise) and the per-row values a backward recomputes from."""
    logits = _logits(hidden, weight, bias)
    scales = distributed_loss.factors(target, class_weight, options, loss_rows._acc(logits.dtype))
    rows, saved = distributed_loss.forward(logits, target, class_weight, options, group, scales)
    held = None
    if options.reduction != "none" and any(wanted):
        one = torch.ones((), dtype=logits.dtype, device=logits.device)
        grad_logits = distributed_loss.gradient(logits, saved, one, options, inplace=True)
        held = _products(grad_logits, hidden, weight, wanted, group)
    return loss_rows._reduced(rows, logits.dtype, options), saved.lse, held, saved


def _check(hidden: Any, weight: Any, bias: Any) -> None:
    if not isinstance(hidden, torch.Tensor) or not hidden.is_floating_point() or hidden.dim() == 0:
        raise TypeError(f"{_NAME}: hidden must be a floating tensor (..., H), got "
                        f"{getattr(hidden, 'shape', type(hidden).__name__)}")
    features = hidden.shape[-1]
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[1] != features:
        raise ValueError(f"{_NAME}: weight_local must have shape (V_l, {features}) (this rank's classes x hidden's "
                         f"features), got {tuple(getattr(weight, 'shape', ()))}")
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != (weight.shape[0],)):
        raise ValueError(f"{_NAME}: bias_local must have shape ({weight.shape[0]},), got "
                         f"{tuple(getattr(bias, 'shape', ()))}")
    for name, t in (("weight_local", weight), ("bias_local", bias)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{_NAME}: {name} must be a tensor, got {type(t).__name__}")
        if t is not None and (t.dtype != hidden.dtype or t.device != hidden.device):
            raise ValueError(f"{_NAME}: {name} is {t.dtype} on {t.device}, hidden {hidden.dtype} on {hidden.device}; "
                             f"they must match (as F.linear's)")


def linear_cross_entropy(hidden: torch.Tensor, weight_local: torch.Tensor, target: torch.Tensor,
                         bias_local: Optional[torch.Tensor] = None, *, group: Optional[dist.ProcessGroup] = None,
                         class_weight: Optional[torch.Tensor] = None, ignore_index: int = -100,
                         reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0,
                         softcap: Optional[float] = None, return_lse: bool = False
                         ) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """``cross_entropy(hidden @ weight.T + bias, target)`` of a head whose weight rows (classes)
    the ranks of ``group`` hold in slices: the tensor-parallel LLM head and its loss.

    Args:
        hidden: the hidden states (..., H), the same on every rank.
        weight_local: this rank's rows of the head's weight (V_l, H): contiguous slices of the
            classes, in rank order, of any lengths (0 too); hidden's dtype and device.
        target: class indices into all the classes, shape hidden.shape[:-1], the same on every rank.
        bias_local: this rank's slice of the bias (V_l,), or None.
        group: the process group holding the slices (default: the world).
        class_weight: a weight per class, all of them (``cross_entropy``'s ``weight``).
        ignore_index, reduction, label_smoothing, z_loss, softcap, return_lse: as
            ``portable_softmax.cross_entropy``'s.

    Returns:
        The loss of the whole on every rank (with ``return_lse``, also lse per token, float32),
        differentiable once with respect to hidden (its gradient summed over the ranks: every
        rank holds the whole), weight_local and bias_local (this slice's).

    Raises:
        RuntimeError: torch.distributed is not initialized.
        TypeError, ValueError: an argument of the wrong type, shape, dtype or device (named).
        IndexError: on CPU, a counted target outside the classes (on an accelerator its loss is NaN).
    """
    _check(hidden, weight_local, bias_local)
    positions = hidden.shape[:-1]
    rows = hidden.reshape(-1, hidden.shape[-1])
    stand_in = torch.empty((rows.shape[0], weight_local.shape[0]), dtype=hidden.dtype, device="meta")
    if not isinstance(target, torch.Tensor) or target.shape != positions:
        raise ValueError(f"{_NAME}: target must be a tensor of shape {tuple(positions)} (hidden's without its "
                         f"features), got {tuple(getattr(target, 'shape', ()))}")
    flat_target = target.reshape(-1)
    options = distributed_loss.validate(stand_in, flat_target.to("meta"), None if class_weight is None else
                                        class_weight.to("meta"), ignore_index, reduction, label_smoothing, z_loss,
                                        softcap)
    if class_weight is not None and class_weight.device != hidden.device:
        raise ValueError(f"{_NAME}: class_weight is on {class_weight.device}, hidden on {hidden.device}; move it there")
    grad = torch.is_grad_enabled()
    wanted = (grad and hidden.requires_grad, grad and weight_local.requires_grad,
              grad and bias_local is not None and bias_local.requires_grad)
    if any(wanted):
        result, lse = _VocabParallelHead.apply(rows, weight_local, flat_target, bias_local, class_weight, options,
                                               group, wanted)
    else:
        result, lse, _, _ = _forward(rows, weight_local, flat_target, bias_local, class_weight, options, group, wanted)
    if reduction == "none":
        result = result.reshape(positions)
    lse = lse.reshape(positions)
    return (result, lse) if return_lse else result
