"""The cross-entropy kernels' launches (``kernels/loss.py``): planned once per call signature by
the pure planner (``loss_planner.plan_loss``), from the kernel's known resources checked against
its compiled binary (``launch_plan.plan_checked``), and kept as
``launch.LaunchRecord``s, so that a repeated call is one dictionary lookup and its launches.

The kernel arguments come from the variant table (``variants.LOSS_TENSORS`` and its neighbours),
which the compile report and the Ascend lowering read too.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from portable_softmax import variants
from portable_softmax.backend import on_registry_change
from portable_softmax.device import backend_for, device_record
from portable_softmax.launch import LaunchRecord, RowView, _compiled_resources, _kernel_module, _known
from portable_softmax.launch_plan import Variant, loss_writes_gradient, plan_cross_entropy
from portable_softmax.loss_planner import plan_elementwise
from portable_softmax.planner import LaunchPlan
from portable_softmax.record import KernelResources
from portable_softmax.targets import target_for
from portable_softmax.tuning import TUNING

logger = logging.getLogger(__name__)

# Records by call signature; bounded; emptied when what they were planned from changes.
_records: dict[tuple, LaunchRecord] = {}
_RECORDS_LIMIT = 4096
TUNING.on_change(_records.clear)
on_registry_change(_records.clear)


def _signature(tensors: Sequence[torch.Tensor]) -> tuple:
    # What Triton specialises a pointer on: its dtype and 16-byte alignment.
    return tuple((t.dtype, t.data_ptr() % 16 == 0) for t in tensors)


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

    def compile(chosen: Variant) -> KernelResources:
        args = variants.loss_scalar_arguments(chosen.config, view.n_outer, view.rows_per_outer, view.n_cols,
                                              view.strides, scalars)
        return _compiled_resources(getattr(module, chosen.kernel), backend, device, (*tensors, *args),
                                   chosen.constexpr_values, chosen.option_values)

    known = _known(backend, target, tensors[0].dtype, loss_writes_gradient(direction, facts), input_bytes)
    plan, chosen = plan_cross_entropy(target, direction, view, facts, scalars, input_bytes, known, compile)
    logger.debug("cross-entropy %s %s on %s: %s", direction, plan.regime, record.name, plan.reason)
    args = variants.loss_scalar_arguments(plan.config, view.n_outer, view.rows_per_outer, view.n_cols, view.strides,
                                          scalars)
    return LaunchRecord(getattr(module, chosen[0].kernel), backend, device, plan, args,
                        (chosen[0].constexpr_values,), chosen[0].option_values, None)


def plan_for(direction: str, tensors: tuple[torch.Tensor, ...], view: RowView, facts: variants.LossFacts,
             scalars: tuple) -> LaunchPlan:
    """The plan a launch of these tensors takes (building its record on a miss)."""
    return _found(direction, tensors, view, facts, scalars).plan


def _found(direction: str, tensors: tuple[torch.Tensor, ...], view: RowView, facts: variants.LossFacts,
           scalars: tuple) -> LaunchRecord:
    key = (direction, facts, view, tensors[0].device, _signature(tensors), scalars)
    found = _records.get(key)
    if found is None:
        if len(_records) >= _RECORDS_LIMIT:
            _records.clear()
        found = _records[key] = _record(direction, tensors, view, facts, scalars)
    return found


def run(direction: str, tensors: tuple[torch.Tensor, ...], view: RowView, facts: variants.LossFacts,
        scalars: tuple) -> LaunchPlan:
    """Launch the cross-entropy kernel of ``direction`` on ``tensors`` (``variants.LOSS_TENSORS``
    order) over ``view`` (the row tensors' strides, in ``variants.loss_row_tensors`` order), with
    the values of ``variants.LOSS_SCALARS``."""
    return _found(direction, tensors, view, facts, scalars)(tensors)


def run_grad_scale(grad: torch.Tensor, dloss: torch.Tensor) -> None:
    """``grad *= dloss`` (one value) unless dloss is 1, decided on the device; ``grad`` is dense."""
    device = grad.device
    acc_fp64 = torch.float64 in (grad.dtype, dloss.dtype)
    key = ("scale", grad.numel(), device, _signature((grad, dloss)), acc_fp64)
    found = _records.get(key)
    if found is None:
        backend = backend_for(device)
        plan = plan_elementwise(target_for(device_record(device)), grad.numel(), variants.GRAD_SCALE_BLOCK)
        kernel = getattr(_kernel_module(backend), variants.GRAD_SCALE_KERNEL)
        if len(_records) >= _RECORDS_LIMIT:
            _records.clear()
        found = _records[key] = LaunchRecord(kernel, backend, device, plan, (grad.numel(),),
                                             ({"BLOCK": variants.GRAD_SCALE_BLOCK, "ACC_FP64": acc_fp64},),
                                             {"num_warps": plan.num_warps, "num_stages": 1}, None)
    found((grad, dloss))
