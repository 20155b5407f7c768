"""The row work of ``loss.cross_entropy``: validation, the reduction's values formed on the
device, and the launches of the cross-entropy kernels (``kernels/loss.py``) forward and backward.

The loss of an (N, C) or (N, C, d1, ...) input is formed per position by the kernels (float32
math, float64 for float64 input), then reduced here. Where the input needs a gradient and the
reduction is 'mean' or 'sum' (``writes_gradient``), the forward writes the gradient (rows held
whole, in tiles or split across programs: in the same pass; streamed rows: a second pass) and the
backward only rescales it by the incoming gradient (``rescale``: decided on the device, nothing
when it is 1). With 'none' ``backward`` recomputes the gradient from the saved lse and the incoming
gradient of each position: one more read of the logits.

No host synchronisation: the denominators of 'mean' are formed on the device (``_stats``) and
read by the kernels through a pointer. A target outside [0, C) that is not ``ignore_index`` raises
on CPU (checked with torch operations there) and gives NaN at its position on an accelerator.

``logsumexp`` takes the same forward kernel with every position ignored (``lse_rows``), and the
softmax kernels for its backward (``softmax_times``).
"""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Real
from typing import NamedTuple, Optional

import torch

from portable_softmax import row_layout, loss_launch, op_arguments, ops, variants

REDUCTIONS = ("none", "mean", "sum")
_NAME = "portable_softmax.cross_entropy"


class Options(NamedTuple):
    """A validated call's options (hashable: part of launch signatures). A named tuple, not a
    dataclass: every call hashes and compares it (``_launch``'s key), which a tuple does in C."""

    n_classes: int
    prob_target: bool
    reduction: str
    ignore_index: int
    smoothing: float
    z_loss: float
    softcap: Optional[float]
    weighted: bool


def _positions(shape: Sequence[int]) -> tuple[int, ...]:
    """The shape of one value per position: the input's without its class dim (dim 1; a 1-D
    input's class dim is 0, with one position)."""
    shape = tuple(shape)
    return () if len(shape) == 1 else (shape[0], *shape[2:])


def validate(input: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], ignore_index: int,
             reduction: str, label_smoothing: float, z_loss: float, softcap: Optional[float]) -> Options:
    """The options of a call, or one error naming the argument at fault."""
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"{_NAME}: input must be a tensor, got {type(input).__name__}")
    if input.dtype not in op_arguments.FLOATING:
        raise TypeError(f"{_NAME}: input must be float16, bfloat16, float32 or float64, got {input.dtype}")
    if input.dim() == 0:
        raise ValueError(f"{_NAME}: input must have a class dimension (shape (C,), (N, C) or (N, C, d1, ...)), "
                         f"got a 0-d tensor")
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"{_NAME}: target must be a tensor, got {type(target).__name__}")
    n_classes = input.shape[0 if input.dim() == 1 else 1]
    prob = target.is_floating_point()
    if prob:
        if target.shape != input.shape:
            raise ValueError(f"{_NAME}: target of class probabilities must have input's shape {tuple(input.shape)}, "
                             f"got {tuple(target.shape)}")
        if ignore_index >= 0:
            raise ValueError(f"{_NAME}: ignore_index ({ignore_index}) is not supported with class probabilities")
    elif target.dtype == torch.bool or target.is_complex():
        raise TypeError(f"{_NAME}: target must hold class indices (an integer dtype) or class probabilities "
                        f"(floating), got {target.dtype}")
    elif target.shape != _positions(input.shape):
        raise ValueError(f"{_NAME}: target of class indices must have shape {_positions(input.shape)} for input of "
                         f"shape {tuple(input.shape)}, got {tuple(target.shape)}")
    if target.device != input.device:
        raise ValueError(f"{_NAME}: target is on {target.device}, input on {input.device}; move it to input's device")
    if weight is not None:
        if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
            raise TypeError(f"{_NAME}: weight must be a floating tensor of one value per class, got "
                            f"{getattr(weight, 'dtype', type(weight).__name__)}")
        if weight.shape != (n_classes,):
            raise ValueError(f"{_NAME}: weight must have shape ({n_classes},) (one value per class), got "
                             f"{tuple(weight.shape)}")
        if weight.device != input.device:
            raise ValueError(f"{_NAME}: weight is on {weight.device}, input on {input.device}; move it to input's "
                             f"device")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"{_NAME}: ignore_index must be an int, got {type(ignore_index).__name__}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"{_NAME}: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if not _real(label_smoothing) or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{_NAME}: label_smoothing must be a number in [0, 1], got {label_smoothing!r}")
    if not _real(z_loss) or not math.isfinite(z_loss):
        raise ValueError(f"{_NAME}: z_loss must be a finite number, got {z_loss!r}")
    if softcap is not None and (not _real(softcap) or not 0.0 < softcap < math.inf):
        raise ValueError(f"{_NAME}: softcap must be a positive number or None, got {softcap!r}")
    return Options(n_classes, prob, reduction, ignore_index, float(label_smoothing), float(z_loss),
                   None if softcap is None else float(softcap), weight is not None)


def _real(value: object) -> bool:
    # A float first: the usual value, which skips the abstract class's check.
    return type(value) is float or (isinstance(value, Real) and not isinstance(value, bool))


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _facts(x: torch.Tensor, options: Options, write_grad: bool) -> variants.LossFacts:
    return variants.LossFacts(x.dtype == torch.float64, options.weighted, options.prob_target,
                              options.smoothing > 0, options.z_loss != 0, options.softcap is not None, write_grad)


@functools.lru_cache(maxsize=256)
def _constant(device: torch.device, dtype: torch.dtype, values: tuple[float, ...]) -> torch.Tensor:
    """A device tensor of ``values``, made once (its copy to the device is the first call's)."""
    return torch.tensor(values, dtype=dtype, device=device)


# Where the denominators of 'mean' sit in ``variants.LOSS_STATS``.
_DENOMINATORS = tuple(name.endswith("_denominator") for name in variants.LOSS_STATS)


@functools.lru_cache(maxsize=256)
def _counted_constants(device: torch.device, acc: torch.dtype, options: Options) -> tuple[torch.Tensor, torch.Tensor]:
    """What ``_stats`` keeps for an unweighted 'mean' of class targets: the denominators' places,
    and the values of the others (one lookup a call)."""
    values = (0.0, 0.0, float(options.n_classes), options.smoothing, options.z_loss, options.softcap or 1.0)
    return _constant(device, torch.bool, _DENOMINATORS), _constant(device, acc, values)


def _stats(x: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], options: Options) -> torch.Tensor:
    """``variants.LOSS_STATS`` on the device, in the accumulation dtype: the denominators of
    'mean' (torch's: the summed weights of the counted targets for the cross-entropy, their count
    for the z-loss; positions for probability targets), W, eps, the z-loss factor, the softcap.

    Few operations, each some microseconds of host time every call: a kept constant where no
    value depends on the tensors; for a 'mean' of class targets, weighted or not, one buffer and
    one launch (``_launched_stats``). Where that kernel cannot take the target in place (or serves
    no call yet), torch's: unweighted, the count and one ``where`` that puts it in the
    denominators' places among kept constants (three kernels); weighted, some fifteen operations."""
    acc = _acc(x.dtype)
    counted_mean = options.reduction == "mean" and not options.prob_target
    if counted_mean:
        stats = _launched_stats(target, weight, options, acc)
        if stats is not None:
            return stats
    if weight is None and counted_mean:
        places, kept = _counted_constants(x.device, acc, options)
        return torch.where(places, torch.sum(target != options.ignore_index, dtype=acc), kept)
    tail = (options.smoothing, options.z_loss, options.softcap or 1.0)
    classes = float(options.n_classes)
    if weight is None:
        positions = float(math.prod(_positions(x.shape))) if options.reduction == "mean" else 1.0
        return _constant(x.device, acc, (positions, positions, classes, *tail))
    pieces = []
    if counted_mean:
        counted = target != options.ignore_index
        # A target outside the classes reads class 0's weight here: its loss is NaN anyway. (An
        # index of int16 or int8 needs widening.)
        summed = torch.where(counted, weight.to(acc)[target.clamp(0, options.n_classes - 1).long()], 0).sum()
        pieces += [summed.reshape(1), counted.sum(dtype=acc).reshape(1)]
    else:
        positions = float(math.prod(_positions(x.shape))) if options.reduction == "mean" else 1.0
        pieces.append(_constant(x.device, acc, (positions, positions)))
    pieces += [weight.sum(dtype=acc).reshape(1), _constant(x.device, acc, tail)]
    return torch.cat(pieces)


def _launched_stats(target: torch.Tensor, weight: Optional[torch.Tensor], options: Options,
                    acc: torch.dtype) -> Optional[torch.Tensor]:
    """The stats of a 'mean' of class targets by ``cross_entropy_stats`` (one launch into one
    buffer); None where its target is not contiguous, or its weights, and on the first call of a
    layout where the kernel compiles beside it (the caller's torch operations serve that call).
    Kept per layout as ``_launch``'s records: a repeated call is one lookup."""
    key = ("stats", options, target.device, acc, target.numel(), target.dtype, target.is_contiguous(),
           target.data_ptr() % 16 == 0,
           None if weight is None else (weight.stride(), weight.dtype, weight.data_ptr() % 16 == 0))
    found = loss_launch.calls.get(key)
    if found is None:
        if len(loss_launch.calls) >= _CALLS_LIMIT:
            loss_launch.calls.clear()
        kept = _counted_constants(target.device, acc, options)[1]
        record, ahead = None, False
        if target.is_contiguous() and (weight is None or weight.is_contiguous()):
            record, ahead = loss_launch.stats_record(target, weight, kept, options.n_classes, options.ignore_index)
        found = loss_launch.calls[key] = (record, kept)
        if ahead:
            # Its compile runs beside the forward's: this call's stats by torch's operations.
            return None
    record, kept = found
    if record is None:
        return None
    stats = kept.new_empty(len(variants.LOSS_STATS))
    record((target, weight if weight is not None else kept, kept, stats))
    return stats


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
    stats = _stats(x, target, weight, options)
    # Buffers from the stats' dtype and device (the accumulation's): ``new_empty`` parses no
    # device, the cheaper call.
    lse = stats.new_empty(_positions(x.shape))
    if x.numel() == 0:
        grad = torch.zeros_like(x) if write_grad else None
        return _reduced(torch.empty_like(lse), x.dtype, options), lse, grad, stats, x
    grad = (x if inplace else torch.empty_like(x)) if write_grad else None
    # A reduced loss is the sum of whatever the launch wrote its terms into (``_launch``).
    rows = torch.empty_like(lse) if options.reduction == "none" else None
    terms = _launch(x, target, weight, stats, rows, lse, grad, options)
    if terms is None:
        x, target = x.contiguous(), target.contiguous()
        if write_grad:
            grad = x if inplace else torch.empty_like(x)
        terms = _launch(x, target, weight, stats, rows, lse, grad, options)
    return _reduced(terms, x.dtype, options), lse, grad, stats, x


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
    return _launch(x, target, weight, stats, rows, lse, grad, options) is not None


def _launch(x: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], stats: torch.Tensor,
            rows: Optional[torch.Tensor], lse: torch.Tensor, grad: Optional[torch.Tensor],
            options: Options) -> Optional[torch.Tensor]:
    """``launch_forward``'s launch; None where it launched nothing. With ``rows`` None (a reduced
    loss: only the sum of the rows' losses is wanted) they go into a buffer of its own, returned
    as it is: a split plan's shares unsummed, so that the loss is one reduction of them, not a sum
    over the chunks and another over the rows. Its buffers are fresh from torch's allocator, at
    least 16-byte aligned as the record built from another such one assumes."""
    # ``% 16``: what Triton specialises a pointer on besides its dtype (``loss_launch._signature``).
    key = (options, x.device, x.shape, x.stride(), x.dtype, target.stride(), target.dtype, lse.stride(), lse.dtype,
           stats.dtype, x.data_ptr() % 16 == 0, target.data_ptr() % 16 == 0, stats.data_ptr() % 16 == 0,
           lse.data_ptr() % 16 == 0,
           None if rows is None else (rows.stride(), rows.dtype, rows.data_ptr() % 16 == 0),
           None if weight is None else (weight.stride(), weight.dtype, weight.data_ptr() % 16 == 0),
           None if grad is None else (grad.stride(), grad.dtype, grad.data_ptr() % 16 == 0))
    found = loss_launch.calls.get(key)
    if found is None:
        if len(loss_launch.calls) >= _CALLS_LIMIT:
            loss_launch.calls.clear()
        if grad is not None:
            # The backward rescales this gradient (``rescale``, by the loss's gradient, of the
            # loss's dtype): its kernel compiles beside this forward's.
            loss_launch.grad_scale_ahead(grad, x.dtype)
        shaped = rows if rows is not None else stats.new_empty(_positions(x.shape))
        found = loss_launch.calls[key] = _Launch.build(x, target, weight, stats, shaped, lse, grad, options)
    if found.record is None:
        return None
    if not found.chunks:
        if rows is None:
            rows = stats.new_empty(_positions(x.shape))
        found.record((x, target, weight if weight is not None else x, stats, rows, lse,
                      grad if grad is not None else x))
        return rows
    shares = stats.new_empty((found.chunks, *_positions(x.shape)))
    # The plan the launch ran: under a graph capture that cannot grow the split path's scratch, the
    # loop, which writes the rows' losses into the first slab alone.
    plan = found.record((x, target, weight if weight is not None else x, stats, shares, lse,
                         grad if grad is not None else x))
    if rows is None:
        return shares if plan.regime == "split" else shares[0]
    if plan.regime == "split":
        torch.sum(shares, 0, out=rows)
    else:
        rows.copy_(shares[0])
    return rows


# Layouts kept by ``_launch`` and ``_launch_backward``; bounded as the records are.
_CALLS_LIMIT = 4096


@dataclass(frozen=True)
class _Launch:
    """One layout's forward or backward: its launch record (None where some tensor's rows cannot
    be walked in place) and, for a split plan, the chunks its loss shares come in (0 otherwise)."""

    record: Optional[loss_launch.LaunchRecord]
    chunks: int

    @staticmethod
    def build(x: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], stats: torch.Tensor,
              rows: torch.Tensor, lse: torch.Tensor, grad: Optional[torch.Tensor], options: Options) -> "_Launch":
        tensors = _rows(x, target, rows, lse, grad if grad is not None else x)
        view = row_layout.row_view(tensors[0].shape, 1, *tensors)
        if view is None:
            return _Launch(None, 0)
        x_rows, target_rows, rows_rows, lse_rows, grad_rows = tensors
        launch = (x_rows, target_rows, weight if weight is not None else x_rows, stats, rows_rows, lse_rows,
                  grad_rows)
        facts, scalars = _facts(x, options, grad is not None), (options.ignore_index,)
        record = loss_launch.record_for("forward", launch, view, facts, scalars)
        if record.plan.regime != "split":
            return _Launch(record, 0)
        # The shares are walked as a contiguous ``rows``: the record of that layout.
        shares = torch.empty((record.plan.chunks, *rows.shape), dtype=rows.dtype, device=rows.device)
        tensors = _rows(x, target, shares[0], lse, grad if grad is not None else x)
        launch = (*launch[:4], tensors[2], *launch[5:])
        return _Launch(loss_launch.record_for("forward", launch, row_layout.row_view(tensors[0].shape, 1, *tensors), facts,
                                              scalars), record.plan.chunks)


def _reduced(rows: torch.Tensor, dtype: torch.dtype, options: Options) -> torch.Tensor:
    """The loss from its rows (already divided by the denominators of 'mean'; for 'mean' and
    'sum', any tensor of terms that sum to it, as a split plan's shares); 'mean' of no position is
    NaN, as torch's."""
    if options.reduction == "none":
        return rows.to(dtype)
    if rows.numel() == 0 and options.reduction == "mean":
        return torch.full((), math.nan, dtype=dtype, device=rows.device)
    summed = _launched_sum(rows, dtype)
    return summed if summed is not None else rows.sum().to(dtype)


def _launched_sum(terms: torch.Tensor, dtype: torch.dtype) -> Optional[torch.Tensor]:
    """The sum of ``terms`` in ``dtype`` by ``cross_entropy_sum`` (one launch: torch's sum and cast
    were two kernels, 4.8 and 2.0 us on the H200 after a 140 us loss, NOTES v39); None where the
    terms are not a plain contiguous tensor (a traced call's, an empty one) or more than its one
    block (torch's sum spreads them over the chip), and on the first call of a layout where the
    kernel compiles beside it (torch's operations serve that call). Kept per layout as
    ``_launch``'s records: a repeated call is one lookup."""
    if type(terms) is not torch.Tensor or not terms.numel() or not terms.is_contiguous():
        return None
    key = ("sum", terms.device, terms.numel(), terms.dtype, dtype, terms.data_ptr() % 16 == 0)
    found = loss_launch.calls.get(key)
    if found is None:
        if len(loss_launch.calls) >= _CALLS_LIMIT:
            loss_launch.calls.clear()
        record, ahead = loss_launch.sum_record(terms, dtype)
        found = loss_launch.calls[key] = (record,)
        if ahead:
            return None
    (record,) = found
    if record is None:
        return None
    out = terms.new_empty((), dtype=dtype)
    record((terms, out))
    return out


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
        if len(loss_launch.calls) >= _CALLS_LIMIT:
            loss_launch.calls.clear()
        incoming = dloss if options.reduction == "none" else dloss.reshape(()).expand(lse.shape)
        tensors = _rows(x, target, lse, incoming, grad)
        view = row_layout.row_view(tensors[0].shape, 1, *tensors)
        if view is not None:
            x_rows, target_rows, lse_rows, dloss_rows, grad_rows = tensors
            found = loss_launch.record_for("backward", (x_rows, target_rows, weight if weight is not None else x_rows,
                                                        stats, lse_rows, dloss_rows, grad_rows),
                                           view, _facts(x, options, False), (options.ignore_index,))
        loss_launch.calls[key] = found = _Launch(None if view is None else found, 0)
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
