"""The row work of ``loss.cross_entropy``: the launches of the cross-entropy kernels
(``kernels/loss.py``) forward and backward, between the arguments' validation
(``loss_arguments``) and the reduction's values formed on the device (``loss_reduction``).

The loss of an (N, C) or (N, C, d1, ...) input is formed per position by the kernels (float32
math, float64 for float64 input), then reduced here; a split grid that writes the gradient reduces
it itself (``kernels/grid_sum.py``). Where the input needs a gradient and the
reduction is 'mean' or 'sum' (``writes_gradient``), the forward writes the gradient (rows held
whole, in tiles or split across programs: in the same pass; streamed rows: a second pass) and the
backward only rescales it by the incoming gradient (``rescale``: decided on the device, nothing
when it is 1). With 'none' ``backward`` recomputes the gradient from the saved lse and the incoming
gradient of each position: one more read of the logits.

No host synchronisation: the denominators of 'mean' are formed on the device (``loss_reduction.stats``) and
read by the kernels through a pointer. A target outside [0, C) that is not ``ignore_index`` raises
on CPU (checked with torch operations there) and gives NaN at its position on an accelerator.

``logsumexp`` takes the same forward kernel with every position ignored (``lse_rows``), and the
softmax kernels for its backward (``softmax_times``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch

from portable_softmax import loss_launch, loss_reduction, ops, row_layout, variants
from portable_softmax.loss_arguments import _NAME, Options, _acc, _positions

def _facts(x: torch.Tensor, options: Options, write_grad: bool) -> variants.LossFacts:
    return variants.LossFacts(x.dtype == torch.float64, options.weighted, options.prob_target,
                              options.smoothing > 0, options.z_loss != 0, options.softcap is not None, write_grad)


def _check_targets(target: torch.Tensor, options: Options) -> None:
    """On CPU, where it costs no synchronisation: every class index in [0, C) or ignore_index."""
    bad = ((target < 0) | (target >= options.n_classes)) & (target != options.ignore_index)
    if bad.any():
        raise IndexError(f"{_NAME}: target {int(target[bad].flatten()[0])} is out of bounds for "
                         f"{options.n_classes} classes (expected 0 to {options.n_classes - 1}, or ignore_index "
                         f"{options.ignore_index})")


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill their span of memory, in some order of its dims."""
    expected = 1
    for size, stride in sorted(((n, abs(s)) for n, s in zip(t.shape, t.stride()) if n > 1), key=lambda p: p[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _rows(x: torch.Tensor, *per_position: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``x`` with a leading dim for a 1-D input, and the per-position tensors expanded to its shape
    (a column stride of 0), as the kernels walk them."""
    if x.dim() == 1:
        x = x.unsqueeze(0)
        per_position = tuple(t.unsqueeze(0) if t.dim() == 1 else t.reshape(1) for t in per_position)
    return (x, *(t if t.shape == x.shape else t.unsqueeze(1).expand(x.shape) for t in per_position))


def writes_gradient(x: torch.Tensor, options: Options, needs_grad: bool, inplace: bool) -> bool:
    """Whether the forward writes the gradient (module docstring): a reduced loss, and a dense
    buffer for the rescale."""
    return needs_grad and options.reduction != "none" and x.numel() > 0 and not (inplace and not _dense(x))


def forward(x: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], options: Options,
            write_grad: bool, inplace: bool) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor],
                                                      torch.Tensor, torch.Tensor]:
    """The loss, lse per position, the gradient (with ``write_grad``; into x's storage with
    ``inplace``), the stats and the logits the kernels read (x, or where its rows cannot be walked
    in place, a contiguous copy)."""
    if x.device.type == "cpu" and not options.prob_target:
        _check_targets(target, options)
    # An unweighted 'mean' that writes the gradient: where the forward's grid counts the targets
    # itself (``variants.loss_counts``), its stats hold 1 in the denominators' places and no launch
    # forms them; elsewhere ``_launch`` forms them before its launch.
    counted = write_grad and x.numel() > 0 and loss_reduction.sums_counted(weight, options)
    stats = (loss_reduction.unscaled_stats(x.device, _acc(x.dtype), options) if counted
             else loss_reduction.stats(x, target, weight, options))
    # Buffers from the stats' dtype and device (the accumulation's): ``new_empty`` parses no
    # device, the cheaper call.
    lse = stats.new_empty(_positions(x.shape))
    if x.numel() == 0:
        grad = torch.zeros_like(x) if write_grad else None
        return loss_reduction.reduced(torch.empty_like(lse), x.dtype, options), lse, grad, stats, x
    grad = (x if inplace else torch.empty_like(x)) if write_grad else None
    # A reduced loss is the sum of whatever the launch wrote its terms into, or what its grid
    # summed them into (``_launch``).
    rows = torch.empty_like(lse) if options.reduction == "none" else None
    terms, used, summed = _launch(x, target, weight, stats, rows, lse, grad, options, counted)
    if terms is None:
        x, target = x.contiguous(), target.contiguous()
        if write_grad:
            grad = x if inplace else torch.empty_like(x)
        terms, used, summed = _launch(x, target, weight, stats, rows, lse, grad, options, counted)
    return terms if summed else loss_reduction.reduced(terms, x.dtype, options), lse, grad, used, x


def forward_alone(x: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor],
                  options: Options) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss and lse of a call that needs no gradient: ``forward``'s, but an unweighted 'mean'
    of class targets (``loss_reduction.sums_counted``) takes its terms unscaled and its mean after
    them, from the terms and the targets in one launch: two launches a call, where the stats
    before the forward made three (NOTES v40)."""
    if x.numel() == 0 or not loss_reduction.sums_counted(weight, options):
        loss, lse, _, _, _ = forward(x, target, weight, options, False, False)
        return loss, lse
    if x.device.type == "cpu":
        _check_targets(target, options)
    stats = loss_reduction.unscaled_stats(x.device, _acc(x.dtype), options)
    lse = stats.new_empty(_positions(x.shape))
    terms, _, _ = _launch(x, target, None, stats, None, lse, None, options)
    if terms is None:
        x, target = x.contiguous(), target.contiguous()
        terms, _, _ = _launch(x, target, None, stats, None, lse, None, options)
    return loss_reduction.counted_mean(terms, target, x.dtype, options), lse


def launch_forward(x: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], stats: torch.Tensor,
                   rows: torch.Tensor, lse: torch.Tensor, grad: Optional[torch.Tensor], options: Options) -> bool:
    """The forward kernel over ``x`` (non-empty): the loss rows (scaled by ``stats``) into
    ``rows``, lse into ``lse`` and, where ``grad`` is given (it may be ``x``), the gradient into
    it. False, launching nothing, where some tensor's rows cannot be walked in place.

    A split plan's chunks each write their share of a row's loss (``kernels/loss_split.py``), into
    slabs of one value a position laid out as a contiguous ``rows``, a slab apart: they are summed
    into ``rows`` here (torch's sum: no float atomics, the same result every run).

    What a call needs beyond its launch (the record, the split plan's chunks) is kept per layout of
    its tensors (``_Launch``): a repeated call makes no view and looks up no record. The kernels
    take the per-position tensors as they are: their strides are the record's, and a launch reads
    only their pointers."""
    return _launch(x, target, weight, stats, rows, lse, grad, options)[0] is not None


def _launch(x: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], stats: torch.Tensor,
            rows: Optional[torch.Tensor], lse: torch.Tensor, grad: Optional[torch.Tensor], options: Options,
            counted: bool = False) -> tuple[Optional[torch.Tensor], torch.Tensor, bool]:
    """``launch_forward``'s launch, the stats it read, and whether it returns the reduced loss
    itself; None where it launched nothing. With ``rows`` None (a reduced loss: only the sum of
    the rows' losses is wanted) they go into a buffer of its own, returned as it is: a split
    plan's shares unsummed, so that the loss is one reduction of them, not a sum over the chunks
    and another over the rows; or, where the forward writes the gradient and its grid sums the
    shares itself (``variants.loss_sums``), the loss in x's dtype. Its buffers are fresh from
    torch's allocator, at least 16-byte aligned as the record built from another such one assumes.

    ``counted`` (``forward``'s unweighted 'mean' that writes the gradient, its ``stats`` holding 1
    in the denominators' places): the launch's grid counts the targets where its plan can
    (``variants.loss_counts``); where it cannot, the stats are formed here first
    (``loss_reduction.stats``), and those are returned."""
    # ``% 16``: what Triton specialises a pointer on besides its dtype (``loss_launch._signature``).
    key = (options, x.device, x.shape, x.stride(), x.dtype, target.stride(), target.dtype, lse.stride(), lse.dtype,
           stats.dtype, x.data_ptr() % 16 == 0, target.data_ptr() % 16 == 0, stats.data_ptr() % 16 == 0,
           lse.data_ptr() % 16 == 0,
           None if rows is None else (rows.stride(), rows.dtype, rows.data_ptr() % 16 == 0),
           None if weight is None else (weight.stride(), weight.dtype, weight.data_ptr() % 16 == 0),
           None if grad is None else (grad.stride(), grad.dtype, grad.data_ptr() % 16 == 0), counted)
    found = loss_launch.calls.get(key)
    if found is None:
        if grad is not None:
            # The backward rescales this gradient (``rescale``, by the loss's gradient, of the
            # loss's dtype): its kernel compiles beside this forward's.
            loss_launch.grad_scale_ahead(grad, x.dtype)
        shaped = rows if rows is not None else stats.new_empty(_positions(x.shape))
        found = loss_launch.keep(key, _Launch.build(x, target, weight, stats, shaped, lse, grad, options, counted,
                                                    rows is None and grad is not None))
    if found.record is None:
        return None, stats, False
    if counted and not found.counts:
        stats = loss_reduction.stats(x, target, weight, options)
    if found.sums:
        # The grid's sum.
        loss = x.new_empty((), dtype=x.dtype)
        found.record((x, target, weight if weight is not None else x, stats, loss, lse, grad))
        return loss, stats, True
    if not found.chunks:
        if rows is None:
            rows = stats.new_empty(_positions(x.shape))
        found.record((x, target, weight if weight is not None else x, stats, rows, lse,
                      grad if grad is not None else x))
        return rows, stats, False
    shares = stats.new_empty((found.chunks, *_positions(x.shape)))
    # The plan the launch ran: under a graph capture that cannot grow the split path's scratch, the
    # loop, which writes the rows' losses into the first slab alone.
    plan = found.record((x, target, weight if weight is not None else x, stats, shares, lse,
                         grad if grad is not None else x))
    if rows is None:
        return (shares if plan.regime == "split" else shares[0]), stats, False
    if plan.regime == "split":
        torch.sum(shares, 0, out=rows)
    else:
        rows.copy_(shares[0])
    return rows, stats, False


@dataclass(frozen=True)
class _Launch:
    """One layout's forward or backward: its launch record (None where some tensor's rows cannot
    be walked in place), for a split plan the chunks its loss shares come in (0 otherwise), and
    whether its grid counts the 'mean''s targets itself (``loss_launch.counts``) and sums the
    reduced loss itself (``loss_launch.sums``: its record takes the loss in the shares' place)."""

    record: Optional[loss_launch.LaunchRecord]
    chunks: int
    counts: bool = False
    sums: bool = False

    @staticmethod
    def build(x: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], stats: torch.Tensor,
              rows: torch.Tensor, lse: torch.Tensor, grad: Optional[torch.Tensor], options: Options,
              counted: bool, summed: bool) -> "_Launch":
        tensors = _rows(x, target, rows, lse, grad if grad is not None else x)
        view = row_layout.row_view(tensors[0].shape, 1, *tensors)
        if view is None:
            return _Launch(None, 0)
        x_rows, target_rows, rows_rows, lse_rows, grad_rows = tensors
        launch = (x_rows, target_rows, weight if weight is not None else x_rows, stats, rows_rows, lse_rows,
                  grad_rows)
        facts = dataclasses.replace(_facts(x, options, grad is not None), counted=counted, summed=summed)
        scalars = (options.ignore_index,)
        record = loss_launch.record_for("forward", launch, view, facts, scalars)
        if record.plan.regime != "split":
            return _Launch(record, 0)
        if loss_launch.sums(record):
            # Its grid sums the shares: launched with the loss (x's dtype) in their place.
            return _Launch(record, record.plan.chunks, loss_launch.counts(record), True)
        # The shares are walked as a contiguous ``rows``: the record of that layout.
        shares = torch.empty((record.plan.chunks, *rows.shape), dtype=rows.dtype, device=rows.device)
        tensors = _rows(x, target, shares[0], lse, grad if grad is not None else x)
        launch = (*launch[:4], tensors[2], *launch[5:])
        record = loss_launch.record_for("forward", launch, row_layout.row_view(tensors[0].shape, 1, *tensors), facts,
                                        scalars)
        return _Launch(record, record.plan.chunks, loss_launch.counts(record))


def backward(x: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], stats: torch.Tensor,
             lse: torch.Tensor, dloss: torch.Tensor, options: Options, inplace: bool) -> torch.Tensor:
    """The gradient with respect to the logits from the saved lse: one read, one write (into x's
    storage with ``inplace``)."""
    grad = x if inplace else torch.empty_like(x)
    if x.numel() == 0:
        return grad.zero_()
    if not _launch_backward(x, target, weight, stats, lse, dloss, grad, options):
        x, target = x.contiguous(), target.contiguous()
        if options.reduction == "none":
            dloss = dloss.contiguous()
        grad = x if inplace else torch.empty_like(x)
        _launch_backward(x, target, weight, stats, lse, dloss, grad, options)
    return grad


def _launch_backward(x: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], stats: torch.Tensor,
                     lse: torch.Tensor, dloss: torch.Tensor, grad: torch.Tensor, options: Options) -> bool:
    """The backward kernel over ``x`` (non-empty); False, launching nothing, where some tensor's
    rows cannot be walked in place. ``dloss``: one value a position ('none'), else one value, read
    by every position (a stride of 0). Its record is kept per layout, as the forward's
    (``_launch``): a repeated call makes no view."""
    key = ("backward", options, x.device, x.shape, x.stride(), x.dtype, target.stride(), target.dtype, lse.stride(),
           lse.dtype, stats.dtype, dloss.stride() if options.reduction == "none" else None, dloss.dtype, grad.stride(),
           grad.dtype,
           x.data_ptr() % 16 == 0, target.data_ptr() % 16 == 0, stats.data_ptr() % 16 == 0,
           lse.data_ptr() % 16 == 0, dloss.data_ptr() % 16 == 0, grad.data_ptr() % 16 == 0,
           None if weight is None else (weight.stride(), weight.dtype, weight.data_ptr() % 16 == 0))
    found = loss_launch.calls.get(key)
    if found is None:
        incoming = dloss if options.reduction == "none" else dloss.reshape(()).expand(lse.shape)
        tensors = _rows(x, target, lse, incoming, grad)
        view = row_layout.row_view(tensors[0].shape, 1, *tensors)
        if view is not None:
            x_rows, target_rows, lse_rows, dloss_rows, grad_rows = tensors
            found = loss_launch.record_for("backward", (x_rows, target_rows, weight if weight is not None else x_rows,
                                                        stats, lse_rows, dloss_rows, grad_rows),
                                           view, _facts(x, options, False), (options.ignore_index,))
        found = loss_launch.keep(key, _Launch(None if view is None else found, 0))
    if found.record is None:
        return False
    found.record((x, target, weight if weight is not None else x, stats, lse, dloss, grad))
    return True


def rescale(grad: torch.Tensor, dloss: torch.Tensor) -> torch.Tensor:
    """A held gradient times the incoming one, of one value (nothing to do when it is 1: decided
    on the device)."""
    if grad.numel():
        loss_launch.run_grad_scale(grad, dloss)
    return grad


def target_gradient(x: torch.Tensor, weight: Optional[torch.Tensor], stats: torch.Tensor, lse: torch.Tensor,
                    dloss: torch.Tensor, options: Options, dtype: torch.dtype) -> torch.Tensor:
    """d loss / d target for probability targets, in torch operations: -(1 - eps) w_c log p_c,
    times the reduction's factor and the incoming gradient."""
    z = x.to(_acc(x.dtype))
    if options.softcap is not None:
        z = options.softcap * torch.tanh(z / options.softcap)
    class_dim = 0 if x.dim() == 1 else 1
    log_p = z - lse.unsqueeze(class_dim)
    grad = -(1.0 - options.smoothing) * log_p / stats[0]
    if weight is not None:
        grad = grad * weight.to(grad.dtype).reshape(-1, *([1] * (x.dim() - class_dim - 1)))
    incoming = dloss.unsqueeze(class_dim) if options.reduction == "none" else dloss
    return (grad * incoming).to(dtype)


def _rows_last(x: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """``x`` with the reduced ``dims`` merged into one, moved to dim 1 (dim 0 of a 1-D result), as
    ``cross_entropy`` takes classes: the row view walks one reduced dim in place; several are
    merged (a copy only where they do not merge)."""
    if x.dim() == 0:
        return x.reshape(1)
    if len(dims) > 1:
        moved = x.movedim(dims, tuple(range(x.dim() - len(dims), x.dim())))
        x = moved.reshape(*moved.shape[:x.dim() - len(dims)], -1)
        dims = (x.dim() - 1,)
    return x.movedim(dims[0], 1 if x.dim() > 1 else 0)


def lse_rows(x: torch.Tensor, dims: tuple[int, ...], keepdim: bool) -> torch.Tensor:
    """log-sum-exp over ``dims`` (normalized) by the cross-entropy forward kernel (every target
    ignored), in x's dtype."""
    rows = _rows_last(x, dims)
    if rows.numel() == 0:
        return torch.logsumexp(x, dims if x.dim() else 0, keepdim)
    # Every position ignored: the kernel forms lse alone (the target is one value, stride 0).
    positions = _positions(rows.shape)
    ignored = torch.full((), -1, dtype=torch.int32, device=x.device).expand(positions)
    options = Options(rows.shape[0 if rows.dim() == 1 else 1], False, "none", -1, 0.0, 0.0, None, False)
    _, lse, _, _, _ = forward(rows, ignored, None, options, False, False)
    out = lse.to(x.dtype)
    if keepdim:
        out = out.reshape([1 if d in dims else size for d, size in enumerate(x.shape)])
    return out


def softmax_times(x: torch.Tensor, grad: torch.Tensor, dims: tuple[int, ...], keepdim: bool) -> torch.Tensor:
    """softmax(x) over ``dims`` times ``grad`` (the reduced result's gradient), in x's shape."""
    if not keepdim and x.dim():
        for d in dims:
            grad = grad.unsqueeze(d)
    if x.dim() == 0:
        return grad * torch.ones_like(x)
    if len(dims) == 1:
        return ops.softmax(x, dims[0]) * grad
    moved = x.movedim(dims, tuple(range(x.dim() - len(dims), x.dim())))
    p = ops.softmax(moved.reshape(*moved.shape[:x.dim() - len(dims)], -1), -1).reshape(moved.shape)
    return p.movedim(tuple(range(x.dim() - len(dims), x.dim())), dims) * grad
