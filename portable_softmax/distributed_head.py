"""The tensor-parallel LLM head and its loss: ``linear_cross_entropy`` (as
``portable_softmax.distributed.linear_cross_entropy``), the cross-entropy of
``hidden @ weight.T + bias`` whose classes (the weight's rows) the ranks of a group hold in
slices, in rank order, without all the local logits at once.

Per chunk of tokens (``head_chunks``' chunks and products): the local logits by the vendor's BLAS,
the vocabulary-parallel loss of the chunk (``distributed_loss.forward``: two all-reduces of
per-row statistics) and, with a reduced loss and a gradient wanted, the chunk's logit gradient
written over its logits (``distributed_loss.gradient``), then its products: its rows of
``grad_logits @ weight`` (this slice's part of the hidden states' gradient), its terms of
``grad_logits.T @ hidden`` and of the bias's column sums, accumulated in float32. After the chunks
one ``all_reduce`` sums the hidden states' gradient over the ranks, so that every rank holds the
whole. The backward only rescales the gradients by the incoming one. With ``reduction='none'``
the incoming gradient weighs each row, which the forward cannot know: the backward recomputes
each chunk's logits and their gradient from the saved per-row statistics (no collective besides
the hidden states').

The chunks take collectives, so every rank must cut the tokens alike: their rows are sized from
the budget and the group's largest slice, asked of the group once (``_chunk_rows``), never from
the free device memory (which differs between ranks). The reduction's factors are the whole
batch's (``distributed_loss.factors``), so that the chunks' gradients add up to the whole's.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import torch
import torch.distributed as dist

from portable_softmax import distributed_loss, head, head_chunks, loss_arguments, loss_reduction
from portable_softmax.distributed_loss import Exchanged
from portable_softmax.head_chunks import Gradients, HeadCall

_NAME = "portable_softmax.distributed.linear_cross_entropy"

# The largest slice of each group, asked of the group at its first call (one all-reduce and the
# one host read of the path). Keyed by the group alone, so that every rank asks at the same call:
# a key holding this rank's slice could miss on one rank alone, which would then wait in an
# all-reduce the others never enter.
_largest_slices: dict[Any, int] = {}


def _chunk_rows(hidden: torch.Tensor, weight: torch.Tensor, chunk_bytes: Optional[int],
                group: Optional[dist.ProcessGroup]) -> int:
    """Tokens per chunk, the same on every rank: ``chunk_bytes`` (default 1 GiB) of the largest
    slice's logits."""
    key = dist.group.WORLD if group is None else group
    largest = _largest_slices.get(key)
    if largest is None:
        size = torch.tensor([weight.shape[0]], dtype=torch.int64, device=hidden.device)
        dist.all_reduce(size, op=dist.ReduceOp.MAX, group=group)
        largest = _largest_slices[key] = int(size.item())
    budget = head_chunks.CHUNK_LIMIT_BYTES if chunk_bytes is None else chunk_bytes
    return head_chunks.chunk_rows(hidden.shape[0], max(largest, 1), hidden.element_size(), budget)


def _forward(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
             class_weight: Optional[torch.Tensor], call: HeadCall, group: Optional[dist.ProcessGroup]
             ) -> tuple[torch.Tensor, torch.Tensor, Optional[Exchanged], Optional[Gradients]]:
    """The loss, lse per token, the per-row values a backward recomputes from ('none' with a
    gradient wanted) and the gradients the forward forms (``HeadCall.grad_in_forward``, for an
    incoming gradient of 1)."""
    options = call.options
    acc = loss_arguments._acc(hidden.dtype)
    scales = distributed_loss.factors(target, class_weight, options, acc)
    rows = torch.empty(hidden.shape[0], dtype=acc, device=hidden.device)
    lse = torch.empty_like(rows)
    step = _chunk_rows(hidden, weight, call.chunk_bytes, group)
    # Tokens in one chunk: the weight's gradient from one matmul in its own dtype (head_chunks).
    single = step >= hidden.shape[0]
    grads = head_chunks._new_gradients(hidden, weight, bias, call, single) if call.grad_in_forward else None
    budget_bytes = step * max(weight.shape[0], 1) * hidden.element_size()
    one = torch.ones((), dtype=acc, device=hidden.device)
    parts = []
    for start, chunk, z in head_chunks.chunks(hidden, weight, bias, step):
        stop = start + chunk.shape[0]
        rows[start:stop], saved = distributed_loss.forward(z, target[start:stop], class_weight, options, group,
                                                           scales)
        lse[start:stop] = saved.lse
        if grads is not None:
            grad_logits = distributed_loss.gradient(z, saved, one, options, inplace=True)
            head_chunks._add_chunk(grads, grad_logits, chunk, weight, start, start == 0, budget_bytes)
        elif call.wants_grad:
            parts.append(saved)
    if grads is not None and grads.hidden is not None:
        dist.all_reduce(grads.hidden, group=group)
    kept = Exchanged.joined(parts) if parts else None
    return loss_reduction.reduced(rows, call.loss_dtype, options), lse, kept, grads


def _backward(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], saved: Exchanged,
              dloss: torch.Tensor, call: HeadCall, group: Optional[dist.ProcessGroup]) -> Gradients:
    """The gradients of reduction='none' recomputed chunk by chunk from the saved per-row values,
    times ``dloss`` (one per token)."""
    step = _chunk_rows(hidden, weight, call.chunk_bytes, group)
    grads = head_chunks._new_gradients(hidden, weight, bias, call, step >= hidden.shape[0])
    budget_bytes = step * max(weight.shape[0], 1) * hidden.element_size()
    incoming = dloss.reshape(-1)
    for start, chunk, z in head_chunks.chunks(hidden, weight, bias, step):
        stop = start + chunk.shape[0]
        grad_logits = distributed_loss.gradient(z, saved.rows(start, stop), incoming[start:stop], call.options,
                                                inplace=True)
        head_chunks._add_chunk(grads, grad_logits, chunk, weight, start, start == 0, budget_bytes)
    if grads.hidden is not None:
        dist.all_reduce(grads.hidden, group=group)
    return grads


class _VocabParallelHead(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                bias: Optional[torch.Tensor], class_weight: Optional[torch.Tensor], call: HeadCall,
                group: Optional[dist.ProcessGroup]) -> tuple[torch.Tensor, torch.Tensor]:
        result, lse, saved, grads = _forward(hidden, weight, target, bias, class_weight, call, group)
        ctx.call, ctx.group, ctx.held = call, group, grads
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        if grads is None:
            ctx.save_for_backward(hidden, weight, bias, *(saved or ()))
        ctx.mark_non_differentiable(lse)
        return result, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, dloss: torch.Tensor, _: Optional[torch.Tensor]):
        if ctx.call.grad_in_forward:
            grads, ctx.held, scale = ctx.held, None, dloss
            if grads is None:
                raise RuntimeError(f"{_NAME}: its gradients were formed in the forward and have been used; a second "
                                   f"backward through the same loss is not supported (call it again)")
        else:
            hidden, weight, bias, *saved = ctx.saved_tensors
            grads = _backward(hidden, weight, bias, Exchanged(*saved), dloss, ctx.call, ctx.group) if saved else \
                head_chunks._new_gradients(hidden, weight, bias, ctx.call)
            scale = None
        hidden, weight, bias = (head_chunks.finish(g, scale, dtype) if dtype is not None else None
                                for g, dtype in zip(grads, ctx.dtypes))
        return hidden, weight, None, bias, None, None, None


def _check(hidden: Any, weight: Any, target: Any, bias: Any, class_weight: Any) -> None:
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
    if not isinstance(target, torch.Tensor) or target.shape != hidden.shape[:-1]:
        raise ValueError(f"{_NAME}: target must be a tensor of shape {tuple(hidden.shape[:-1])} (hidden's without "
                         f"its features), got {tuple(getattr(target, 'shape', ()))}")
    for name, t in (("weight_local", weight), ("bias_local", bias), ("class_weight", class_weight)):
        if t is not None and t.device != hidden.device:
            raise ValueError(f"{_NAME}: {name} is on {t.device}, hidden on {hidden.device}; move it there")


def linear_cross_entropy(hidden: torch.Tensor, weight_local: torch.Tensor, target: torch.Tensor,
                         bias_local: Optional[torch.Tensor] = None, *, group: Optional[dist.ProcessGroup] = None,
                         class_weight: Optional[torch.Tensor] = None, ignore_index: int = -100,
                         reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0,
                         softcap: Optional[float] = None, return_lse: bool = False, chunk_bytes: Optional[int] = None,
                         accumulate_dtype: Optional[torch.dtype] = None
                         ) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """``cross_entropy(hidden @ weight.T + bias, target)`` of a head whose weight rows (classes)
    the ranks of ``group`` hold in slices: the tensor-parallel LLM head and its loss, in chunks
    of tokens (module docstring).

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
        chunk_bytes: the most bytes of the group's largest slice's logits a chunk holds (default
            1 GiB), the same on every rank. The largest slice is asked once per group: a later
            head on the same group with larger slices holds more.
        accumulate_dtype: as ``portable_softmax.linear_cross_entropy``'s (float32 by default).

    Returns:
        The loss of the whole on every rank (with ``return_lse``, also lse per token, float32),
        differentiable once with respect to hidden (its gradient summed over the ranks: every
        rank holds the whole), weight_local and bias_local (this slice's).

    Raises:
        RuntimeError: torch.distributed is not initialized.
        TypeError, ValueError: an argument of the wrong type, shape, dtype or device (named).
        NotImplementedError: class probabilities as the target.
        IndexError: on CPU, a counted target outside the classes (on an accelerator its loss is NaN).
    """
    _check(hidden, weight_local, target, bias_local, class_weight)
    if chunk_bytes is not None and (isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int)
                                    or chunk_bytes < 1):
        raise ValueError(f"{_NAME}: chunk_bytes must be a positive int or None, got {chunk_bytes!r}")
    leading = hidden.shape[:-1]
    flat_target = target.reshape(-1)
    # The options are the loss's, checked on a stand-in for the (N, V_l) logits of one element.
    stand_in = hidden.new_empty(1).expand(flat_target.shape[0], weight_local.shape[0])
    options = distributed_loss.validate(stand_in, flat_target, class_weight, ignore_index, reduction,
                                        label_smoothing, z_loss, softcap)
    hidden, weight_local, bias_local, loss_dtype = head._autocast(hidden, weight_local, bias_local)
    head._check_factors(hidden, weight_local, bias_local)
    rows = hidden.reshape(-1, hidden.shape[-1])
    grad = torch.is_grad_enabled()
    call = HeadCall(options, chunk_bytes, head._accumulate(accumulate_dtype, weight_local.dtype), loss_dtype,
                    grad and hidden.requires_grad, grad and weight_local.requires_grad,
                    grad and bias_local is not None and bias_local.requires_grad)
    if call.wants_grad:
        result, lse = _VocabParallelHead.apply(rows, weight_local, flat_target, bias_local, class_weight, call, group)
    else:
        result, lse, _, _ = _forward(rows, weight_local, flat_target, bias_local, class_weight, call, group)
    if reduction == "none":
        result = result.reshape(leading)
    return (result, lse.reshape(leading)) if return_lse else result
