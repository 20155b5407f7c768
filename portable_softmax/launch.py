"""Host side of a launch: pick the kernel, plan the grid from the compiled kernel's resources,
hold the split path's scratch, and launch.

Kernels are launched through Triton's own ``kernel[grid](...)``, which selects the binary
specialised for the actual arguments (16-byte alignment of pointers and strides, strides equal to
1). The only thing cached here is the resource use that sizes the grid, and it is keyed on the
same specialisation: keying on the block size alone once served a kernel specialised for aligned
rows to a 781-wide bf16 row ("misaligned address").
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Optional

import torch

from portable_softmax import compat
from portable_softmax.backend import Backend
from portable_softmax.device import backend_for, device_record
from portable_softmax.planner import KernelConfig, LaunchPlan, plan_launch
from portable_softmax.record import DeviceRecord, KernelResources

logger = logging.getLogger(__name__)

PROGRAMS_ENV = "PORTABLE_SOFTMAX_PROGRAMS"


@dataclass(frozen=True)
class RowView:
    """How the tensors of one call map onto rows (see ``kernels.py``): groups of rows, and for
    each tensor its (outer, row, column) strides in elements."""

    n_outer: int
    rows_per_outer: int
    n_cols: int
    strides: tuple[tuple[int, int, int], ...]

    @property
    def n_rows(self) -> int:
        return self.n_outer * self.rows_per_outer


def _kernel_module(backend: Backend) -> Any:
    if backend.interpreted:
        from portable_softmax.interpreter import interpreted_kernels

        return interpreted_kernels()
    from portable_softmax import kernels

    return kernels


def _forced_programs() -> Optional[int]:
    value = os.environ.get(PROGRAMS_ENV, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{PROGRAMS_ENV}={value!r}: expected a positive integer")
    return int(value)


def _specialization(args: tuple) -> tuple:
    """What Triton specialises a launch on, besides constexprs."""
    key = []
    for arg in args:
        if isinstance(arg, torch.Tensor):
            key.append((arg.dtype, arg.data_ptr() % 16 == 0))
        elif isinstance(arg, int):
            key.append((arg == 1, arg % 16 == 0, -2**31 <= arg < 2**31))
        else:
            key.append(arg)
    return tuple(key)


_resources_cache: dict[tuple, KernelResources] = {}


def _compiled_resources(kernel: Any, backend: Backend, device: torch.device, args: tuple, constexprs: dict,
                        options: dict) -> KernelResources:
    if backend.interpreted:
        return KernelResources(registers=0, shared_memory=0, num_warps=options["num_warps"])
    key = (backend.name, device.index, kernel.fn.__name__, tuple(sorted(constexprs.items())),
           tuple(sorted(options.items())), _specialization(args))
    found = _resources_cache.get(key)
    if found is None:
        compiled = kernel.warmup(*args, grid=(1,), **constexprs, **options)
        compiled._init_handles()
        found = KernelResources(registers=compiled.n_regs, shared_memory=compiled.metadata.shared,
                                num_warps=options["num_warps"], spills=getattr(compiled, "n_spills", 0))
        _resources_cache[key] = found
    return found


class _Scratch:
    """The split path's exchange slots (int64, empty = -1) and per-tile arrival counters.

    Kernels leave them clean, so they are allocated (and filled) only when a launch needs more.
    One per device and stream: launches on one stream never overlap.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buffers: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def get(self, device: torch.device, slots: int, tiles: int) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """Buffers with room for ``slots`` and ``tiles``; None if they would have to grow while a
        graph is being captured (the caller then takes a path that needs none)."""
        module = getattr(torch, device.type)
        key = (device.type, device.index, module.current_stream(device).stream_id)
        with self._lock:
            found = self._buffers.get(key)
            if found is not None and found[0].numel() >= slots and found[1].numel() >= tiles:
                return found
            capturing = getattr(module, "is_current_stream_capturing", lambda: False)()
            if capturing:
                return None
            old_slots, old_tiles = (found[0].numel(), found[1].numel()) if found else (0, 0)
            grown = (torch.full((max(slots, 2 * old_slots),), -1, dtype=torch.int64, device=device),
                     torch.zeros((max(tiles, 2 * old_tiles),), dtype=torch.int32, device=device))
            self._buffers[key] = grown
            return grown


_scratch = _Scratch()


def _launch(direction: str, tensors: tuple[torch.Tensor, ...], view: RowView, log: bool, acc_fp64: bool) -> LaunchPlan:
    device = tensors[0].device
    backend = backend_for(device)
    record = device_record(device)
    module = _kernel_module(backend)
    dtype_name = "float64" if acc_fp64 else "float32"
    strides = tuple(s for triple in view.strides for s in triple)
    tiles_rows = (view.rows_per_outer, view.n_cols)
    backward = direction == "backward"

    def arguments(config: KernelConfig, scratch: tuple = ()) -> tuple[Any, tuple, dict, dict]:
        kernel = getattr(module, f"softmax_{direction}_{config.regime}")
        tiles_per_outer = -(-view.rows_per_outer // config.block_m)
        tiles = view.n_outer * tiles_per_outer
        constexprs = {"BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "LOG": log}
        if config.regime == "split":
            constexprs.update(CHUNKS=config.chunks, CHUNKS_P2=config.chunks_p2)
            args = (*tensors, *scratch, tiles * config.chunks, tiles_per_outer, *tiles_rows, *strides)
        else:
            constexprs["ACC_FP64"] = acc_fp64
            args = (*tensors, tiles, tiles_per_outer, *tiles_rows, *strides)
        options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
        if config.regime == "split" and backend.cooperative_launch and compat.COOPERATIVE_LAUNCH:
            options["launch_cooperative_grid"] = True
        return kernel, args, constexprs, options

    def resources(config: KernelConfig) -> KernelResources:
        # Triton's warmup takes dtypes for pointer arguments: the scratch need not exist yet.
        placeholder = (torch.int64, torch.int32) if config.regime == "split" else ()
        kernel, args, constexprs, options = arguments(config, placeholder)
        return _compiled_resources(kernel, backend, device, args, constexprs, options)

    plan_args = dict(backward=backward, rows_per_group=view.rows_per_outer, resources=resources,
                     programs=_forced_programs())
    plan = plan_launch(record, view.n_rows, view.n_cols, dtype_name, **plan_args)
    scratch: tuple = ()
    if plan.regime == "split":
        buffers = _scratch.get(device, plan.tiles * plan.block_m * plan.chunks, plan.tiles)
        if buffers is None:
            plan = plan_launch(record, view.n_rows, view.n_cols, dtype_name, allow_split=False, **plan_args)
        else:
            scratch = buffers
    kernel, args, constexprs, options = arguments(plan.config, scratch)
    logger.debug("%s %s on %s: %s", direction, plan.regime, record.name, plan.reason)
    _run(kernel, backend, record, plan, args, constexprs, options)
    return plan


# Split launches the driver refused as not co-resident, keyed like the resources: the program
# count it did accept. The occupancy rule is a model; the cooperative launch is the judge.
_accepted_programs: dict[tuple, int] = {}


def _is_residency_refusal(error: Exception) -> bool:
    text = str(error).lower()
    return "cooperative" in text and ("too many blocks" in text or "too large" in text)


def _run(kernel: Any, backend: Backend, record: DeviceRecord, plan: LaunchPlan, args: tuple, constexprs: dict,
         options: dict) -> None:
    if options.get("launch_cooperative_grid"):
        key = (kernel.fn.__name__, tuple(sorted(constexprs.items())), tuple(sorted(options.items())),
               _specialization(args), record.name)
        programs = min(plan.programs, _accepted_programs.get(key, plan.programs))
        while True:
            try:
                kernel[(programs,)](*args, **constexprs, **options)
                return
            except RuntimeError as error:
                smaller = programs - max(plan.chunks, programs // 8 // plan.chunks * plan.chunks)
                if not _is_residency_refusal(error) or smaller < plan.chunks:
                    raise
                logger.warning("driver refused %d co-resident programs for %s; retrying with %d",
                               programs, kernel.fn.__name__, smaller)
                programs = _accepted_programs[key] = smaller
    if backend.interpreted:
        import numpy

        from portable_softmax.interpreter import restored_language

        # Padding lanes compute -inf - -inf on purpose (masked out); numpy would warn about it.
        with restored_language(), numpy.errstate(all="ignore"):
            kernel[(plan.programs,)](*args, **constexprs)
        return
    kernel[(plan.programs,)](*args, **constexprs, **options)


def run_forward(x: torch.Tensor, y: torch.Tensor, view: RowView, log: bool) -> LaunchPlan:
    """y = softmax(x) (or log_softmax) over the rows of ``view``; strides in view order x, y."""
    return _launch("forward", (x, y), view, log, y.dtype == torch.float64)


def run_backward(y: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, view: RowView, log: bool) -> LaunchPlan:
    """dx from the saved output y and the gradient dy; strides in view order y, dy, dx."""
    return _launch("backward", (y, dy, dx), view, log, torch.float64 in (y.dtype, dy.dtype, dx.dtype))
