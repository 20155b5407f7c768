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
from collections.abc import Callable
from typing import Any, Optional

import torch

from portable_softmax import amdgcn, compat
from portable_softmax.backend import Backend
from portable_softmax.device import backend_for, device_record
from portable_softmax.planner import KernelConfig, LaunchPlan, plan_launch, split_fit, tile_fit, window_align
from portable_softmax.record import DeviceRecord, KernelResources
from portable_softmax.tuning import tuning_for

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

    @property
    def narrow(self) -> bool:
        """Whether every element offset of every tensor fits in int32."""
        counts = (self.n_outer, self.rows_per_outer, self.n_cols)
        return all(sum((count - 1) * abs(stride) for count, stride in zip(counts, triple)) < 2**31
                   for triple in self.strides)


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
        if "amdgcn" in compiled.asm:  # the driver reports no SGPRs, which bound occupancy on gfx9
            found = amdgcn.kernel_resources(amdgcn.amdgcn_resources(compiled.asm["amdgcn"]), options["num_warps"],
                                            compiled.metadata.shared)
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
# Ticketed split launches (a program per item) fill their slots before each launch, so they keep
# their own: the persistent path's slots must stay empty between launches.
_ticket_scratch = _Scratch()


class _Prepared:
    """One planned launch, replayed by every later call with the same key (``_launch``).

    Everything the plan depends on (device, dtypes, shapes, strides, alignment) is in the key, so a
    replay is a dictionary lookup and the launch itself. The first launch goes through Triton's
    ``kernel[grid]`` (which compiles, and whose cooperative refusals ``_run`` answers with a smaller
    grid); later ones, on Triton versions whose launcher we know, call the compiled kernel directly.
    """

    def __init__(self, kernel: Any, backend: Backend, record: DeviceRecord, plan: LaunchPlan, scalars: tuple,
                 constexprs: dict, options: dict,
                 fallback: Optional[Callable[[tuple[torch.Tensor, ...]], "_Prepared"]]) -> None:
        self.kernel, self.backend, self.record, self.plan = kernel, backend, record, plan
        self.scalars, self.constexprs, self.options = scalars, constexprs, options
        self._fallback, self._fallback_prepared = fallback, None
        # The tuning table entry planned with: a replaced entry (a sweep, a test) means re-planning.
        self.tuning = tuning_for(record)
        self._direct: Any = None
        self._tail: tuple = ()

    def __call__(self, device: torch.device, tensors: tuple[torch.Tensor, ...]) -> LaunchPlan:
        scratch: tuple = ()
        if self.plan.regime == "split":
            slots = self.plan.tiles * self.plan.block_m * self.plan.chunks
            pool = _ticket_scratch if self.plan.ticketed else _scratch
            scratch = pool.get(device, slots, self.plan.tiles)
            if scratch is None:
                if self._fallback_prepared is None:
                    self._fallback_prepared = self._fallback(tensors)
                return self._fallback_prepared(device, tensors)
            if self.plan.ticketed:
                # Ticketed programs leave their row's slots full (only the counter resets itself).
                scratch[0][:slots].fill_(-1)
        if self._direct is not None:
            self._direct(*tensors, *scratch, *self._tail)
            return self.plan
        args = (*tensors, *scratch, *self.scalars)
        programs = _run(self.kernel, self.backend, self.record, self.plan, args, self.constexprs, self.options)
        if compat.DIRECT_LAUNCH and not self.backend.interpreted:
            self._prepare_direct(args, programs)
        return self.plan

    def _prepare_direct(self, args: tuple, programs: int) -> None:
        compiled = self.kernel.warmup(*args, grid=(programs,), **self.constexprs, **self.options)
        dynamic = sum(isinstance(a, torch.Tensor) for a in args)
        # The launcher takes every parameter in order, constexprs included (as kernel[grid] passes them).
        values = iter(args[dynamic:])
        self._tail = tuple(self.constexprs[p.name] if p.is_constexpr else next(values)
                           for p in self.kernel.params[dynamic:])
        self._direct = compiled[(programs, 1, 1)]


# Prepared launches by call key; bounded so that a stream of distinct shapes cannot grow it forever.
_prepared: dict[tuple, _Prepared] = {}
_PREPARED_LIMIT = 4096


def _prepare(direction: str, tensors: tuple[torch.Tensor, ...], view: RowView, log: bool, acc_fp64: bool,
             allow_split: bool = True) -> _Prepared:
    device = tensors[0].device
    backend = backend_for(device)
    record = device_record(device)
    module = _kernel_module(backend)
    dtype_name = "float64" if acc_fp64 else "float32"
    strides = tuple(s for triple in view.strides for s in triple)
    tiles_rows = (view.rows_per_outer, view.n_cols)
    backward = direction == "backward"
    input_bytes = sum(t.element_size() for t in tensors[:-1])
    align = window_align(view.n_outer, view.rows_per_outer, view.n_cols, view.strides,
                         [t.element_size() for t in tensors], all(t.data_ptr() % 16 == 0 for t in tensors))

    def arguments(config: KernelConfig) -> tuple[Any, tuple, dict, dict]:
        kernel = getattr(module, f"softmax_{direction}_{config.regime}")
        tiles_per_outer = -(-view.rows_per_outer // config.block_m)
        tiles = view.n_outer * tiles_per_outer
        constexprs = {"BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "LOG": log}
        if config.regime == "split":
            constexprs.update(CHUNKS=config.chunks, CHUNKS_P2=config.chunks_p2, ALIGN=config.align,
                              TICKETED=config.ticketed, STAGES=config.num_stages)
            args = (tiles * config.chunks, tiles_per_outer, *tiles_rows, *strides)
        else:
            constexprs["ACC_FP64"] = acc_fp64
            if config.regime == "tile":
                constexprs.update(REREAD=config.reread, PER_TILE=config.per_tile, DENSE=config.dense)
            args = (tiles, tiles_per_outer, *tiles_rows, *strides)
        options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
        if config.regime == "split" and not config.ticketed and record.cooperative_launch:
            options["launch_cooperative_grid"] = True
        caps = split_fit(record, config, input_bytes)
        if caps:
            options = fitted(kernel, args, constexprs, options, caps, reach=False)
        caps = tile_fit(record, config, tiles)
        if caps:
            # Only where every tile then has a program at once: a second wave left partly empty
            # costs as much as a full one.
            options = fitted(kernel, args, constexprs, options, caps, reach=True)
        return kernel, args, constexprs, options

    def fitted(kernel: Any, args: tuple, constexprs: dict, options: dict, caps: list, reach: bool) -> dict:
        # The most programs per unit whose register cap spills no more than the tuning allows (a
        # cap that spills in the loop costs more than the programs it adds) and that holds more
        # programs than the uncapped kernel, or (reach) as many as the cap was asked for.
        held = backend.occupancy(record, compiled(kernel, args, constexprs, options))
        for programs, fit in caps:
            if programs <= held:
                break
            capped = {**options, **fit}
            used = compiled(kernel, args, constexprs, capped)
            occupancy = backend.occupancy(record, used)
            if used.spills <= tuning_for(record).split_fit_max_spills and occupancy >= (programs if reach else held + 1):
                return capped
        return options

    def compiled(kernel: Any, args: tuple, constexprs: dict, options: dict) -> KernelResources:
        # Triton's warmup takes dtypes for pointer arguments: the scratch need not exist yet.
        placeholder = (torch.int64, torch.int32) if kernel.fn.__name__.endswith("_split") else ()
        return _compiled_resources(kernel, backend, device, (*tensors, *placeholder, *args), constexprs, options)

    def resources(config: KernelConfig) -> KernelResources:
        return compiled(*arguments(config))

    plan = plan_launch(record, view.n_rows, view.n_cols, dtype_name, backward=backward,
                       rows_per_group=view.rows_per_outer, resources=resources, programs=_forced_programs(),
                       allow_split=allow_split, align=align, input_bytes=input_bytes, narrow=view.narrow)
    kernel, args, constexprs, options = arguments(plan.config)
    logger.debug("%s %s on %s: %s", direction, plan.regime, record.name, plan.reason)
    fallback = None
    if plan.regime == "split":
        # Takes the tensors of the call that needs it: a prepared launch holds no tensor.
        def fallback(now: tuple[torch.Tensor, ...]) -> _Prepared:
            return _prepare(direction, now, view, log, acc_fp64, allow_split=False)
    return _Prepared(kernel, backend, record, plan, args, constexprs, options, fallback)


def _launch(direction: str, tensors: tuple[torch.Tensor, ...], view: RowView, log: bool, acc_fp64: bool) -> LaunchPlan:
    device = tensors[0].device
    key = (direction, log, acc_fp64, view, device, device_record(device).name, os.environ.get(PROGRAMS_ENV),
           tuple((t.dtype, t.data_ptr() % 16 == 0) for t in tensors))
    prepared = _prepared.get(key)
    if prepared is None or prepared.tuning is not tuning_for(prepared.record):
        if len(_prepared) >= _PREPARED_LIMIT:
            _prepared.clear()
        prepared = _prepared[key] = _prepare(direction, tensors, view, log, acc_fp64)
    if device.type != "cpu" and device.index != _current_index(device):
        with getattr(torch, device.type).device(device.index):
            return prepared(device, tensors)
    return prepared(device, tensors)


def _current_index(device: torch.device) -> int:
    return getattr(torch, device.type).current_device()


# Split launches the driver refused as not co-resident, keyed like the resources: the program
# count it did accept. The occupancy rule is a model; the cooperative launch is the judge.
_accepted_programs: dict[tuple, int] = {}


def _is_residency_refusal(error: Exception) -> bool:
    text = str(error).lower()
    return "cooperative" in text and ("too many blocks" in text or "too large" in text)


def _run(kernel: Any, backend: Backend, record: DeviceRecord, plan: LaunchPlan, args: tuple, constexprs: dict,
         options: dict) -> int:
    """Launch through ``kernel[grid]``; returns the grid size used."""
    if options.get("launch_cooperative_grid"):
        key = (kernel.fn.__name__, tuple(sorted(constexprs.items())), tuple(sorted(options.items())),
               _specialization(args), record.name)
        programs = min(plan.programs, _accepted_programs.get(key, plan.programs))
        while True:
            try:
                kernel[(programs,)](*args, **constexprs, **options)
                return programs
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
        return plan.programs
    kernel[(plan.programs,)](*args, **constexprs, **options)
    return plan.programs


def run_forward(x: torch.Tensor, y: torch.Tensor, view: RowView, log: bool) -> LaunchPlan:
    """y = softmax(x) (or log_softmax) over the rows of ``view``; strides in view order x, y."""
    return _launch("forward", (x, y), view, log, y.dtype == torch.float64)


def run_backward(y: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, view: RowView, log: bool) -> LaunchPlan:
    """dx from the saved output y and the gradient dy; strides in view order y, dy, dx."""
    return _launch("backward", (y, dy, dx), view, log, torch.float64 in (y.dtype, dy.dtype, dx.dtype))
