"""The reduction's values of ``cross_entropy``, formed on the device (no host synchronisation):
before the forward, the stats its kernels read through a pointer (``variants.LOSS_STATS``: the
denominators of 'mean', W, eps, the z-loss factor, the softcap); after it, the reduced loss from
the terms it wrote. Each is a kept constant or one launch of a one-program kernel
(``cross_entropy_stats``, ``cross_entropy_sum``), kept per layout in ``loss_launch.calls``, where
torch took three to fifteen operations and their host time a call (NOTES v39). A split grid that
writes the gradient forms both itself where it can: the count of an unweighted 'mean'
(``kernels/grid_count.py``) and the reduced loss (``kernels/grid_sum.py``)."""
from __future__ import annotations

import functools
import math
from typing import Optional

import torch

from portable_softmax import loss_launch, variants
from portable_softmax.loss_arguments import Options, _acc, _positions

@functools.lru_cache(maxsize=256)
def constant(device: torch.device, dtype: torch.dtype, values: tuple[float, ...]) -> torch.Tensor:
    """A device tensor of ``values``, made once (its copy to the device is the first call's)."""
    return torch.tensor(values, dtype=dtype, device=device)


# Where the denominators of 'mean' sit in ``variants.LOSS_STATS``.
_DENOMINATORS = tuple(name.endswith("_denominator") for name in variants.LOSS_STATS)


def _unweighted(device: torch.device, acc: torch.dtype, options: Options, denominator: float) -> torch.Tensor:
    """The kept stats of an unweighted call whose denominators are ``denominator``: W is C."""
    return constant(device, acc, (denominator, denominator, float(options.n_classes), options.smoothing,
                                  options.z_loss, options.softcap or 1.0))


@functools.lru_cache(maxsize=256)
def _counted_constants(device: torch.device, acc: torch.dtype, options: Options) -> tuple[torch.Tensor, torch.Tensor]:
    """What ``stats`` keeps for an unweighted 'mean' of class targets: the denominators' places,
    and the values of the others (one lookup a call)."""
    return constant(device, torch.bool, _DENOMINATORS), _unweighted(device, acc, options, 0.0)


def stats(x: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], options: Options) -> torch.Tensor:
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
    positions = float(math.prod(_positions(x.shape))) if options.reduction == "mean" else 1.0
    if weight is None:
        return _unweighted(x.device, acc, options, positions)
    pieces = []
    if counted_mean:
        counted = target != options.ignore_index
        # A target outside the classes reads class 0's weight here: its loss is NaN anyway. (An
        # index of int16 or int8 needs widening.)
        summed = torch.where(counted, weight.to(acc)[target.clamp(0, options.n_classes - 1).long()], 0).sum()
        pieces += [summed.reshape(1), counted.sum(dtype=acc).reshape(1)]
    else:
        pieces.append(constant(x.device, acc, (positions, positions)))
    pieces += [weight.sum(dtype=acc).reshape(1),
               constant(x.device, acc, (options.smoothing, options.z_loss, options.softcap or 1.0))]
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
        kept = _counted_constants(target.device, acc, options)[1]
        record, ahead = None, False
        if target.is_contiguous() and (weight is None or weight.is_contiguous()):
            record, ahead = loss_launch.stats_record(target, weight, kept, options.n_classes, options.ignore_index)
        found = loss_launch.keep(key, (record, kept))
        if ahead:
            # Its compile runs beside the forward's: this call's stats by torch's operations.
            return None
    record, kept = found
    if record is None:
        return None
    stats = kept.new_empty(len(variants.LOSS_STATS))
    record((target, weight if weight is not None else kept, kept, stats))
    return stats


def reduced(rows: torch.Tensor, dtype: torch.dtype, options: Options) -> torch.Tensor:
    """The loss from its rows (already divided by the denominators of 'mean'; for 'mean' and
    'sum', any tensor of terms that sum to it, as a split plan's shares); 'mean' of no position is
    NaN, as torch's."""
    if options.reduction == "none":
        return rows.to(dtype)
    if rows.numel() == 0 and options.reduction == "mean":
        return torch.full((), math.nan, dtype=dtype, device=rows.device)
    summed = _launched_sum(rows, dtype)
    return summed if summed is not None else rows.sum().to(dtype)


def sums_counted(weight: Optional[torch.Tensor], options: Options) -> bool:
    """Whether the forward alone (no gradient) of this call takes unscaled terms
    (``unscaled_stats``) and forms its 'mean' after them (``counted_mean``): an unweighted 'mean'
    of class targets, whose two denominators are both the count of the counted targets."""
    return options.reduction == "mean" and not options.prob_target and weight is None


def unscaled_stats(device: torch.device, acc: torch.dtype, options: Options) -> torch.Tensor:
    """The stats of an unweighted call whose terms are left unscaled: denominators 1 (a kept
    constant: no launch)."""
    return _unweighted(device, acc, options, 1.0)


def counted_mean(terms: torch.Tensor, target: torch.Tensor, dtype: torch.dtype, options: Options) -> torch.Tensor:
    """The 'mean' in ``dtype`` of unscaled ``terms`` (``sums_counted``): their sum over the count of
    the targets that are not ignore_index (0 / 0 = NaN where none is, as torch's). One launch
    (``cross_entropy_sum`` with ``COUNTED``), where the stats before the forward took one more
    (NOTES v40); torch's operations where it cannot serve (``_launched_sum``)."""
    found = _launched_sum(terms, dtype, target, options.ignore_index)
    if found is not None:
        return found
    return (terms.sum() / (target != options.ignore_index).sum(dtype=terms.dtype)).to(dtype)


def _launched_sum(terms: torch.Tensor, dtype: torch.dtype, target: Optional[torch.Tensor] = None,
                  ignore_index: int = 0) -> Optional[torch.Tensor]:
    """The sum of ``terms`` in ``dtype`` by ``cross_entropy_sum`` (one launch: torch's sum and cast
    were two kernels, 4.8 and 2.0 us on the H200 after a 140 us loss, NOTES v39), divided by the
    count of ``target``'s entries that are not ``ignore_index`` where it is given; None where the
    terms (or the target) are not a plain contiguous tensor (a traced call's, an empty one) or
    more than its one block (torch's sum spreads them over the chip), and on the first call of a
    layout where the kernel compiles beside it (torch's operations serve that call). Kept per
    layout as ``loss_rows``' records: a repeated call is one lookup."""
    if type(terms) is not torch.Tensor or not terms.numel() or not terms.is_contiguous():
        return None
    if target is not None and (type(target) is not torch.Tensor or not target.is_contiguous()):
        return None
    key = ("sum", terms.device, terms.numel(), terms.dtype, dtype, terms.data_ptr() % 16 == 0,
           None if target is None else (target.numel(), target.dtype, target.data_ptr() % 16 == 0, ignore_index))
    found = loss_launch.calls.get(key)
    if found is None:
        record, ahead = loss_launch.sum_record(terms, dtype, target, ignore_index)
        found = loss_launch.keep(key, (record,))
        if ahead:
            return None
    (record,) = found
    if record is None:
        return None
    out = terms.new_empty((), dtype=dtype)
    record((terms, target if target is not None else terms, out))
    return out
