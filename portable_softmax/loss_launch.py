"""The cross-entropy kernels' launches (``kernels/loss.py``, ``kernels/loss_split.py``): planned once
per call signature by the pure planner (``loss_planner.plan_loss``), from the kernel's known
resources checked against its compiled binary (``launch_plan.plan_cross_entropy``), and kept as
``launch.LaunchRecord``s, so that a repeated call is one dictionary lookup and its launches. A
split plan's record holds its exchange (the scratch, one launch or two) as the softmax's does,
and register caps as ``launch_plan`` fits them.

The kernel arguments come from the variant table (``variants.LOSS_TENSORS`` and its neighbours),
which the compile report and the Ascend lowering read too.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any, Optional

import torch

from portable_softmax import variants
from portable_softmax.backend import on_registry_change
from portable_softmax.device import backend_for, device_record
from portable_softmax.launch import LaunchRecord, RowView, _compiled_resources, _kernel_module, _known
from portable_softmax.launch_compile import compile_ahead
from portable_softmax.launch_plan import LossCall, Variant, plan_cross_entropy
from portable_softmax.loss_planner import plan_elementwise, plan_stats, plan_sum
from portable_softmax.plan_grid import LaunchPlan
from portable_softmax.planner import call_windows, window_align
from portable_softmax.record import KernelResources
from portable_softmax.targets import target_for
from portable_softmax.tuning import TUNING

logger = logging.getLogger(__name__)

# Records by call signature; bounded; emptied when what they were planned from changes.
_records: dict[tuple, LaunchRecord] = {}
_RECORDS_LIMIT = 4096
# What ``loss_rows``' forward and backward keep per layout of their tensors (the record each
# launches, the split plan's chunks): a repeated call is one lookup here, with no views made or
# records looked up. Emptied with the records.
calls: dict[tuple, Any] = {}
# ``calls``' bound, as the records': a full dictionary is emptied.
_CALLS_LIMIT = 4096


def keep(key: tuple, value: Any) -> Any:
    """``value`` kept in ``calls`` under ``key`` (emptied first where full); returns it."""
    if len(calls) >= _CALLS_LIMIT:
        calls.clear()
    calls[key] = value
    return value


def _forget() -> None:
    _records.clear()
    calls.clear()


TUNING.on_change(_forget)
on_registry_change(_forget)


def _signature(tensors: Sequence[torch.Tensor]) -> tuple:
    # What Triton specialises a pointer on: its dtype and 16-byte alignment.
    return tuple((t.dtype, t.data_ptr() % 16 == 0) for t in tensors)


def _windows(direction: str, tensors: tuple[torch.Tensor, ...], view: RowView) -> tuple[int, bool]:
    """``ALIGN`` and the split kernel's ``SHIFTED`` for a call's tensors: windows over the two
    tensors walked along their classes, the logits and the gradient. The forward's split kernel
    writes the gradient at the logits' windows where only they share them
    (``planner.call_windows``); the backward takes windows only where both share them."""
    names = variants.loss_row_tensors(direction)
    walked = (names.index("x"), names.index("grad"))
    x, grad = tensors[0], tensors[variants.LOSS_TENSORS[direction].index("grad")]
    window = (view.n_outer, view.rows_per_outer, view.n_cols, [view.strides[i] for i in walked],
              [x.element_size(), grad.element_size()], x.data_ptr() % 16 == 0 and grad.data_ptr() % 16 == 0)
    if direction == "backward":
        return window_align(*window), False
    return call_windows(*window)


def _record(direction: str, tensors: tuple[torch.Tensor, ...], view: RowView, facts: variants.LossFacts,
            scalars: tuple) -> LaunchRecord:
    device = tensors[0].device
    backend = backend_for(device)
    record = device_record(device)
    target = target_for(record)
    module = _kernel_module(backend)
    names = variants.LOSS_TENSORS[direction]
    # The bytes a column reads: the logits, and probability targets (input-shaped).
    input_bytes = tensors[0].element_size() + (tensors[names.index("target")].element_size()
                                               if facts.prob_target else 0)
    # Windows for class targets: the forward's split kernel, its loop that writes no gradient, and
    # the backward (probability targets' loads take none).
    splittable = direction == "forward" and not facts.prob_target
    align, shifted = (1, False) if facts.prob_target else _windows(direction, tensors, view)
    # The forward launched to overlap the kernel before it where the device offers it
    # (``kernels/dependency.py``).
    facts = dataclasses.replace(facts, wait_atomic=target.tuning.split_wait_atomic, shifted=shifted,
                                dependent=variants.loss_dependent(direction, record.dependent_launch))

    call = LossCall(direction, view, facts, scalars, input_bytes, splittable, align, record.cooperative_launch)

    def compile(chosen: Variant) -> KernelResources:
        # Triton's warmup takes dtypes for pointer arguments: the scratch need not exist yet, nor
        # the loss of a grid that sums it, of the input's dtype (``loss_rows._launch``), where the
        # call's tensors hold the rows' buffer.
        scratch = (torch.int64, torch.int32) if chosen.config.regime == "split" else ()
        given: tuple[Any, ...] = tensors
        if chosen.constexpr_values.get("SUMMED"):
            at = names.index("loss")
            given = (*tensors[:at], tensors[0].dtype, *tensors[at + 1:])
        args = variants.loss_scalar_arguments(chosen.config, view.n_outer, view.rows_per_outer, view.n_cols,
                                              view.strides, scalars)
        return _compiled_resources(getattr(module, chosen.kernel), backend, device, (*given, *scratch, *args),
                                   chosen.constexpr_values, chosen.option_values)

    known = _known(backend, target, tensors[0].dtype, call.writes_gradient, input_bytes)
    plan, chosen = plan_cross_entropy(target, call, known, compile)
    if (variants.loss_counts(plan.config, facts)
            and not variants.grid_count_fits(view.n_outer * view.rows_per_outer, plan.programs)):
        # Too many rows or programs for the count's word: the stats count them, before.
        return _record(direction, tensors, view, dataclasses.replace(facts, counted=False), scalars)
    logger.debug("cross-entropy %s %s on %s: %s", direction, plan.regime, record.name, plan.reason)
    args = variants.loss_scalar_arguments(plan.config, view.n_outer, view.rows_per_outer, view.n_cols, view.strides,
                                          scalars)
    launches = tuple(variants.loss_constexprs(direction, plan.config, facts, phase)
                     for phase in variants.launch_phases(plan.config))
    return LaunchRecord(getattr(module, chosen[0].kernel), backend, device, plan, args, launches,
                        chosen[0].option_values)


def counts(record: LaunchRecord) -> bool:
    """Whether ``record``'s forward counts its 'mean''s targets itself (``variants.loss_counts``):
    its call's stats then hold 1 in the denominators' places."""
    return bool(record.launches[0].get("COUNTED"))


def sums(record: LaunchRecord) -> bool:
    """Whether ``record``'s forward sums its reduced loss itself (``variants.loss_sums``): it is
    then launched with the loss, of the input's dtype, in the place of ``loss`` (it was built
    with the rows' buffer there, which keys it)."""
    return bool(record.launches[0].get("SUMMED"))


def record_for(direction: str, tensors: tuple[torch.Tensor, ...], view: RowView, facts: variants.LossFacts,
               scalars: tuple) -> LaunchRecord:
    """The launch record of the cross-entropy kernel of ``direction`` on ``tensors``
    (``variants.LOSS_TENSORS`` order) over ``view`` (the row tensors' strides, in
    ``variants.loss_row_tensors`` order), with the values of ``variants.LOSS_SCALARS`` (built on a
    miss). Calling it with the tensors launches, and returns the plan of the launch made: a split
    plan's forward writes ``plan.chunks`` slabs of loss shares from ``loss`` on, one value a row
    apart (``kernels/loss_split.py``), any other the rows' losses alone."""
    key = (direction, facts, view, tensors[0].device, _signature(tensors), scalars)
    found = _records.get(key)
    if found is None:
        if len(_records) >= _RECORDS_LIMIT:
            _forget()
        found = _records[key] = _record(direction, tensors, view, facts, scalars)
    return found


def run_grad_scale(grad: torch.Tensor, dloss: torch.Tensor) -> None:
    """``grad *= dloss`` (one value, read through a pointer: any shape of one element) unless
    dloss is 1, decided on the device; ``grad`` is dense."""
    _grad_scale(grad, dloss)((grad, dloss))


def grad_scale_ahead(grad: torch.Tensor, dloss_dtype: torch.dtype) -> None:
    """Compile, beside the forward that writes ``grad`` (``launch_compile.compile_ahead``), the
    rescale ``run_grad_scale`` will launch on it for an incoming gradient of ``dloss_dtype`` in a
    buffer of its own (as ``loss.backward()`` brings it); its first launch waits for it."""
    # An empty tensor stands for dloss: its dtype, and aligned (a null pointer, as a fresh buffer).
    dloss = grad.new_empty(0, dtype=dloss_dtype)
    record = _grad_scale(grad, dloss)
    compile_ahead(grad.device, lambda: record.compile((grad, dloss)))


def stats_record(target: torch.Tensor, weight: Optional[torch.Tensor], kept: torch.Tensor, n_classes: int,
                 ignore_index: int) -> tuple[LaunchRecord, bool]:
    """The record of ``cross_entropy_stats`` over a contiguous ``target`` (with class weights
    ``weight``, contiguous, if given; ``kept``: the call's values in ``variants.LOSS_STATS``' layout
    and the accumulation dtype), called with (target, weight or kept, kept, stats); and whether
    its compile started beside the caller's (``compile_ahead``: where the backend compiles), for
    the caller to form this call's stats otherwise. Built on each call: ``loss_reduction.stats``
    keeps it per layout."""
    device = target.device
    # One block of targets: one program, which walks them all in a fixed order. Half as many in
    # float64, whose two sums a lane take twice the registers (sm_90, weighted, 16 warps: 128
    # registers and 84 spilled words a thread at 16384).
    wide = kept.dtype == torch.float64
    plan = plan_stats(target_for(device_record(device)), variants.STATS_BLOCK // (2 if wide else 1))
    return _one_program(device, plan, variants.STATS_KERNEL, (target.numel(), n_classes, ignore_index),
                        {"BLOCK": plan.block_n, "WEIGHT": weight is not None, "ACC_FP64": wide},
                        (target, weight if weight is not None else kept, kept, kept))


def sum_record(terms: torch.Tensor, dtype: torch.dtype, target: Optional[torch.Tensor] = None,
               ignore_index: int = 0) -> tuple[Optional[LaunchRecord], bool]:
    """The record of ``cross_entropy_sum`` over the contiguous ``terms`` into a loss of ``dtype``,
    called with (terms, target or terms, out), or None where they are more than its one block
    holds; and whether its compile started beside the caller's, as ``stats_record``'s. With
    ``target`` (contiguous class targets, at most a block), the sum is divided by the count of
    those not ``ignore_index`` (``COUNTED``). Built on each call: ``loss_reduction`` keeps it per
    layout."""
    device = terms.device
    counted, wide = target is not None, torch.float64 in (terms.dtype, dtype)
    plan = plan_sum(target_for(device_record(device)), variants.SUM_BLOCK, wide, counted)
    if terms.numel() > plan.block_n or (counted and target.numel() > plan.block_n):
        return None, False
    return _one_program(device, plan, variants.SUM_KERNEL,
                        (terms.numel(), target.numel() if counted else 0, ignore_index),
                        {"BLOCK": plan.block_n, "ACC_FP64": wide, "COUNTED": counted},
                        (terms, target if counted else terms, terms.new_empty((), dtype=dtype)))


def _one_program(device: torch.device, plan: LaunchPlan, name: str, scalars: tuple, constexprs: dict[str, Any],
                 tensors: tuple[torch.Tensor, ...]) -> tuple[LaunchRecord, bool]:
    """The record of the one-program kernel ``name`` (``plan``: ``loss_planner.plan_stats``), and
    whether its compile on ``tensors`` started beside the caller's (``compile_ahead``)."""
    backend = backend_for(device)
    dependent = device_record(device).dependent_launch
    record = LaunchRecord(getattr(_kernel_module(backend), name), backend, device, plan, scalars,
                          ({**constexprs, "DEPENDENT": dependent},), _one_program_options(plan, dependent))
    return record, compile_ahead(device, lambda: record.compile(tensors)) is not None


def _one_program_options(plan: LaunchPlan, dependent: bool) -> dict[str, Any]:
    """A small kernel's options: its warps, no pipeline, and launched to overlap the kernel before
    it where the device offers it (``kernels/dependency.py``)."""
    return {"num_warps": plan.num_warps, "num_stages": 1, **({"launch_pdl": True} if dependent else {})}


def _grad_scale(grad: torch.Tensor, dloss: torch.Tensor) -> LaunchRecord:
    """The record of ``run_grad_scale`` on these tensors: found by their signature, built on a miss."""
    device = grad.device
    # The signature (``_signature``) written out: this is every held gradient's backward.
    key = ("scale", grad.numel(), device, grad.dtype, grad.data_ptr() % 16 == 0, dloss.dtype,
           dloss.data_ptr() % 16 == 0)
    found = _records.get(key)
    if found is None:
        acc_fp64 = torch.float64 in (grad.dtype, dloss.dtype)
        backend = backend_for(device)
        plan = plan_elementwise(target_for(device_record(device)), grad.numel(), variants.GRAD_SCALE_BLOCK)
        kernel = getattr(_kernel_module(backend), variants.GRAD_SCALE_KERNEL)
        if len(_records) >= _RECORDS_LIMIT:
            _forget()
        dependent = device_record(device).dependent_launch
        found = _records[key] = LaunchRecord(kernel, backend, device, plan, (grad.numel(),),
                                             ({"BLOCK": variants.GRAD_SCALE_BLOCK, "ACC_FP64": acc_fp64,
                                               "DEPENDENT": dependent},), _one_program_options(plan, dependent))
    return found
