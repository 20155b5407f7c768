"""The runtime: launch records, the split path's scratch, and the launch itself.

A *launch record* is built once per call signature (device, dtypes, shape, strides, the 16-byte
alignment Triton specialises pointers on, direction, variant): the plan, the compiled binary,
the grid, the scalar arguments and the scratch. Building one plans the launch from the known
resources of the kernel's variants and compiles only the one it launches, checked against the plan
(``launch_plan``), and makes the first launch through Triton's ``kernel[grid](...)``, whose
cooperative refusals are answered with a smaller grid. Later
calls with the same signature find the record in a dictionary and launch through the compiled
kernel's own launcher (``compat.direct_launcher``): no planning, compiling, argument binding or
device query.

Compiles go through ``launch_compile`` (planning's, and a first launch's), which also starts a
backward's compile beside its forward's, and a sliced plan's second launch's beside its first's.

The key must hold everything the binary was specialised on: keying on the block size alone once
served a kernel specialised for aligned rows to a 781-wide bf16 row ("misaligned address").
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any, Optional, Union

import torch
import triton

from portable_softmax import compat, variants
from portable_softmax.backend import Backend
from portable_softmax.device import backend_for, device_record
from portable_softmax.interpreter import language_unpatched
from portable_softmax.kernel_resources import table_for
from portable_softmax.launch_compile import _compiled_resources, _kernel_module, _specialization, compile_ahead
from portable_softmax.launch_plan import (Fusion, Lookup, RowView, Variant, known_resources, plan_softmax,
                                          softmax_call)
from portable_softmax.plan_grid import LaunchPlan, Target
from portable_softmax.planner import plan_sharded
from portable_softmax.targets import target_for
from portable_softmax.record import KernelResources
from portable_softmax.tuning import TUNING

logger = logging.getLogger(__name__)

PROGRAMS_ENV = "PORTABLE_SOFTMAX_PROGRAMS"


def _forced_programs() -> Optional[int]:
    value = os.environ.get(PROGRAMS_ENV, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{PROGRAMS_ENV}={value!r}: expected a positive integer")
    return int(value)


class _Scratch:
    """The split path's exchange slots (int64, empty = -1) and per-tile arrival counters.

    Kernels leave them clean, so they are allocated (and filled) only when a launch needs more.
    One per device and stream: launches on one stream never overlap.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buffers: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        # Moved on every growth: a record that kept buffers from an earlier generation asks again.
        self.generation = 0

    def get(self, device: torch.device, stream: int, slots: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Buffers with room for ``slots`` and ``tiles`` on ``stream`` (``lookup``'s)."""
        return self.lookup(device, stream, slots, tiles)[0]

    def lookup(self, device: torch.device, stream: int, slots: int,
               tiles: int) -> tuple[tuple[torch.Tensor, torch.Tensor], Optional[int]]:
        """Buffers with room for ``slots`` and ``tiles`` on ``stream``, and where they are the
        pool's, the pool's ``generation`` with them (a caller may keep them until it moves), else
        None. Where they would have to grow while a graph is being captured, the launch's own
        instead, kept nowhere: taken from the graph's memory pool and filled by kernels the graph
        holds, so that each replay finds them clean. (``torch.cuda.graph`` captures on a stream of
        its own, whose buffers a warm-up on another stream never grew: streaming such a capture's
        rows instead read bf16 4096x53248 forward + backward at 0.344 ms against 0.246, NOTES v49.)"""
        key = (device.type, device.index, stream)
        with self._lock:
            found = self._buffers.get(key)
            if found is not None and found[0].numel() >= slots and found[1].numel() >= tiles:
                return found, self.generation
            module = getattr(torch, device.type)
            if getattr(module, "is_current_stream_capturing", lambda: False)():
                return _filled(device, slots, tiles), None
            old_slots, old_tiles = (found[0].numel(), found[1].numel()) if found else (0, 0)
            grown = _filled(device, max(slots, 2 * old_slots), max(tiles, 2 * old_tiles))
            self._buffers[key] = grown
            self.generation += 1
            return grown, self.generation


def _filled(device: torch.device, slots: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty exchange slots and zeroed counters."""
    return (torch.full((slots,), -1, dtype=torch.int64, device=device),
            torch.zeros((tiles,), dtype=torch.int32, device=device))


_scratch = _Scratch()
# Ticketed split launches (a program per item) fill their slots before each launch, so they keep
# their own: the persistent path's slots must stay empty between launches.
_ticket_scratch = _Scratch()
# Split tiles of several rows count arrivals instead (kernels.exchange._gather_tile) and leave their slots
# full: their own, too.
_counted_scratch = _Scratch()
# A split exchange in two launches (``KernelConfig.phased``) leaves its slots full, and no counter
# moved but the ticket counter, which its last draw resets; one by arrival (``KernelConfig.arrival``)
# leaves its slots full and its counters reset by each row's last chunk. Either reads only slots
# its own launch stored, and finds every counter 0: they share a pool, not the persistent one.
_phased_scratch = _Scratch()


class LaunchRecord:
    """One planned launch, replayed by every later call with the same signature.

    The first call launches through ``kernel[grid]`` (``_run``: compiles if needed, answers a
    cooperative refusal with a smaller grid); where ``compat.direct_launcher`` knows the
    installed Triton's launcher, later calls go straight to it with the arguments laid out
    then. A call on another current device than the record's switches to it for the launch.
    ``launches``: the constexprs of each launch a call makes, in order (a split exchange in two
    launches makes two, ``variants.launch_phases``).
    """

    def __init__(self, kernel: Any, backend: Backend, device: torch.device, plan: LaunchPlan, scalars: tuple,
                 launches: tuple[dict, ...], options: dict) -> None:
        self.kernel, self.backend, self.device = kernel, backend, device
        self.scalars, self.launches, self.options = scalars, launches, options
        self.plan = plan
        # Regimes that fuse take two more tensors: a call that brings none gets its input there.
        self._arity = len(variants.TENSORS["backward" if kernel.fn.__name__.startswith("softmax_backward")
                                           else "forward"])
        # (The softmax kernels only: the cross-entropy kernels' tensors are their own, ``loss_launch``.)
        self._pad = plan.regime in variants.FUSED_REGIMES and kernel.fn.__name__.startswith("softmax_")
        # Its binaries asked for at the compile door: once, by the first launch (where the
        # launcher is not known every launch comes below, and finds them in Triton's cache).
        self._compiled = False
        self._stream: Callable[[], int] = (lambda: 0) if backend.interpreted else compat.stream_getter(device)
        self._current = None if backend.interpreted else compat.current_device_getter(device)

    @property
    def plan(self) -> LaunchPlan:
        return self._plan

    @plan.setter
    def plan(self, plan: LaunchPlan) -> None:
        """The plan, and the scratch its grid needs (a plan set again resizes it)."""
        self._plan = plan
        # A row's slots lie CHUNKS_P2 apart (``kernels.exchange._row_slots``: on their own lines).
        self._slots = plan.tiles * plan.block_m * plan.config.chunks_p2 if plan.regime == "split" else 0
        # Counters: one per tile (rows split one at a time), a loss grid's count of its targets and
        # sum of its loss (``variants.GRID_COUNTERS``) and a partial of that sum a program; or the
        # ticket counter and two per tile (tiles of several rows count arrivals and departures:
        # kernels.exchange._gather_tile).
        self._counters = (plan.tiles + variants.GRID_COUNTERS + plan.programs if plan.block_m == 1
                          else 1 + 2 * plan.tiles)
        # Ticketed grids of one-row items leave their slots full: they are emptied before each launch
        # (nothing waits on an empty slot in a two-launch exchange).
        self._refill = plan.ticketed and plan.block_m == 1 and not plan.phased
        # The launcher laid out for the grid of the plan before: the next launch lays it out again.
        self._direct: Optional[list[Callable[[int, tuple], None]]] = None
        self._pool = (_phased_scratch if plan.phased or plan.arrival
                      else _counted_scratch if plan.block_m > 1 else _ticket_scratch if plan.ticketed else _scratch)
        # The pool's buffers the last launch took: (stream, the pool's generation, the buffers),
        # taken again without the pool's lock while both hold (a repeated call's one lookup).
        self._held: Optional[tuple[int, int, tuple[torch.Tensor, torch.Tensor]]] = None

    def __call__(self, tensors: tuple[torch.Tensor, ...]) -> LaunchPlan:
        if self._current is not None and self._current() != self.device.index:
            with getattr(torch, self.device.type).device(self.device.index):
                return self._launch(tensors)
        return self._launch(tensors)

    def _launch(self, tensors: tuple[torch.Tensor, ...]) -> LaunchPlan:
        if self._pad and len(tensors) == self._arity:
            tensors = (*tensors, tensors[0], tensors[0])
        stream = self._stream()
        if self._slots:
            held = self._held
            if held is not None and held[0] == stream and held[1] == self._pool.generation:
                scratch = held[2]
            else:
                scratch, generation = self._pool.lookup(self.device, stream, self._slots, self._counters)
                self._held = None if generation is None else (stream, generation, scratch)
            if self._refill:
                # Ticketed programs leave their row's slots full (only the counter resets itself).
                scratch[0][:self._slots].fill_(-1)
            tensors = (*tensors, *scratch)
        if self._direct is not None:
            for direct in self._direct:
                direct(stream, tensors)
            return self.plan
        args = (*tensors, *self.scalars)
        if self.backend.interpreted:
            for constexprs in self.launches:
                _run(self.kernel, self.backend, self.plan, args, constexprs, self.options)
            return self.plan
        # The first launch compiles (and so may every launch where the launcher is not known):
        # through ``_compiled_resources``, which finds a binary planning or ``compile_ahead``
        # compiled (or is compiling in another thread), then the launch finds it in Triton's cache.
        with language_unpatched():
            direct = []
            for constexprs in self.launches:
                if not self._compiled:
                    _compiled_resources(self.kernel, self.backend, self.device, args, constexprs, self.options)
                programs = _run(self.kernel, self.backend, self.plan, args, constexprs, self.options)
                direct.append(compat.direct_launcher(self.kernel, args, programs, constexprs, self.options,
                                                     len(tensors)))
            self._compiled = True
            self._direct = None if None in direct else direct
        return self.plan

    def compile(self, tensors: tuple[torch.Tensor, ...]) -> None:
        """Compile the binaries a first launch on tensors like ``tensors`` (their dtypes and
        16-byte alignment) runs, as that launch would, without launching (``compile_ahead``)."""
        if self._pad and len(tensors) == self._arity:
            tensors = (*tensors, tensors[0], tensors[0])
        # Triton's warmup takes dtypes for pointer arguments: the scratch need not exist yet.
        args = (*tensors, *((torch.int64, torch.int32) if self._slots else ()), *self.scalars)
        for constexprs in self.launches:
            _compiled_resources(self.kernel, self.backend, self.device, args, constexprs, self.options)


class SlicedRecord:
    """The two launches of a sliced plan (``strided_planner._sliced_config``): each slice's partials into
    a buffer of [slices, rows] partials, then each slice's output from all of its row's partials
    (the streamed kernels of sharded rows, ``variants.phases``). Each phase is a ``LaunchRecord``
    of its own; the partials are allocated per call from torch's caching allocator (graph capture
    takes them from its pool). Its binaries are compiled when it is built (``_sliced_record``)."""

    def __init__(self, direction: str, phases: tuple[LaunchRecord, LaunchRecord], plan: LaunchPlan,
                 stats_shape: tuple[int, ...], stats_dtype: torch.dtype) -> None:
        self.plan = plan
        self._partials, self._normalize = phases
        self._inputs = len(variants.TENSORS[direction]) - 1
        self._stats_shape, self._stats_dtype = stats_shape, stats_dtype

    def __call__(self, tensors: tuple[torch.Tensor, ...]) -> LaunchPlan:
        inputs, output = tensors[:self._inputs], tensors[self._inputs]
        stats = torch.empty(self._stats_shape, dtype=self._stats_dtype, device=output.device)
        self._partials((*inputs, stats))
        self._normalize((*inputs, stats, output))
        return self.plan

    def compile(self, tensors: tuple[torch.Tensor, ...]) -> None:
        """Compile both phases' binaries for calls on tensors like ``tensors`` (inputs, then the
        output: their dtypes and 16-byte alignment), without launching: the normalize phase's in
        a thread beside (``compile_ahead``), the partials' in this one. The first call's launches
        then find them at the compile door, the normalize's waiting there for its compile where
        it is still running: a cold first call waits for about 0.6 of the two compiles in series
        (``compile_ahead``), not for their sum (issue 34 item 4). Under a graph capture nothing
        compiles ahead: the normalize's launch compiles it, as before."""
        inputs, output = tensors[:self._inputs], tensors[self._inputs]
        # The partials, a fresh buffer each call (aligned), stand as their dtype: Triton takes a
        # dtype for an aligned pointer.
        ahead = (*(_stand_in(t) for t in inputs), self._stats_dtype, _stand_in(output))
        normalize = self._normalize
        compile_ahead(output.device, lambda: normalize.compile(ahead))
        self._partials.compile((*inputs, self._stats_dtype))


def _stand_in(t: torch.Tensor) -> torch.Tensor:
    """What a compile in another thread is given for ``t``: an empty tensor of its dtype where ``t``
    is 16-byte aligned (a null pointer is: nothing held for the thread, as ``op_calls._backward_ahead``),
    else ``t`` itself (held until that compile ends, which the call's launch waits for anyway)."""
    return t if t.data_ptr() % 16 else t.new_empty(0)


def _sliced_record(direction: str, module: Any, backend: Backend, device: torch.device, plan: LaunchPlan,
                   view: RowView, log: bool, acc_fp64: bool, tensors: tuple[torch.Tensor, ...]) -> SlicedRecord:
    """The record of a sliced plan for ``tensors`` (inputs, then the output), its binaries compiled
    (``SlicedRecord.compile``): planning compiled none (``launch_plan.plan_softmax``)."""
    phases = []
    for phase in variants.phases(direction):
        kernel = getattr(module, variants.sharded_kernel_name(phase))
        strides = variants.phase_strides(direction, phase, view.strides)
        scalars = variants.sharded_scalar_arguments(phase, plan.config, view.n_outer, view.rows_per_outer,
                                                    view.n_cols, strides, 1)
        constexprs = variants.sharded_constexprs(phase, plan.config, log, acc_fp64, 1)
        phases.append(LaunchRecord(kernel, backend, device, plan, scalars, (constexprs,),
                                   {"num_warps": plan.num_warps, "num_stages": 1}))
    # Forward partials are (maximum, sum) pairs; backward ones, sums.
    shape = (plan.chunks, view.n_rows, 2) if direction == "forward" else (plan.chunks, view.n_rows)
    record = SlicedRecord(direction, (phases[0], phases[1]), plan, shape,
                          torch.float64 if acc_fp64 else torch.float32)
    # At the build, not at the first call: a backward's record built ahead of its call, beside
    # its forward (``op_calls._backward_ahead``), compiles its binaries there too. Its first
    # launches find them at the compile door; later ones launch as before.
    if not backend.interpreted:
        record.compile(tensors)
    return record


def build_record(direction: str, tensors: tuple[torch.Tensor, ...], view: RowView, log: bool, acc_fp64: bool,
                 fusion: Optional[Fusion] = None) -> Union[LaunchRecord, SlicedRecord]:
    """Plan and prepare the launch of ``tensors`` (inputs, then output; with ``fusion`` then the
    mask and scale tensors, the input standing in for an absent one) over ``view``: planned from
    the variants' known resources, compiling only the one that launches (``launch_plan``)."""
    device = tensors[0].device
    backend = backend_for(device)
    record = device_record(device)
    target = target_for(record)
    module = _kernel_module(backend)
    arity = len(variants.TENSORS[direction])
    data = tensors[:arity]
    call = softmax_call(target, direction, view, [t.element_size() for t in data],
                        all(t.data_ptr() % 16 == 0 for t in data), log, acc_fp64, programs=_forced_programs(),
                        fusion=fusion)

    def compile(variant: Variant) -> KernelResources:
        kernel = getattr(module, variant.kernel)
        # Regimes that fuse take the mask and scale tensors too; the input stands in where absent.
        inputs = tensors if variant.config.regime in variants.FUSED_REGIMES else data
        if len(inputs) == arity and variant.config.regime in variants.FUSED_REGIMES:
            inputs = (*inputs, tensors[0], tensors[0])
        # Triton's warmup takes dtypes for pointer arguments: the scratch need not exist yet.
        placeholder = (torch.int64, torch.int32) if variant.config.regime == "split" else ()
        return _compiled_resources(kernel, backend, device, (*inputs, *placeholder, *call.scalars(variant.config)),
                                   variant.constexpr_values, variant.option_values)

    known = _known(backend, target, data[0].dtype, call.backward, call.input_bytes)
    plan, chosen = plan_softmax(target, call, known, compile)
    logger.debug("%s %s on %s: %s", direction, plan.regime, record.name, plan.reason)
    if plan.regime == variants.SLICED:
        return _sliced_record(direction, module, backend, device, plan, view, log, acc_fp64, data)
    launches = tuple(variants.constexprs(plan.config, call.facts, phase)
                     for phase in variants.launch_phases(plan.config))
    return LaunchRecord(getattr(module, chosen[0].kernel), backend, device, plan, call.scalars(plan.config), launches,
                        chosen[0].option_values)


def _known(backend: Backend, target: Target, dtype: torch.dtype, backward: bool, input_bytes: int) -> Lookup:
    """What planning knows of a variant's resources before compiling it: the interpreter's (it
    reports none), else the target's table for this Triton, else an estimate."""
    if backend.interpreted:
        return lambda variant: KernelResources(registers=0, shared_memory=0,
                                               num_warps=variant.option_values["num_warps"])
    record = target.record
    table = table_for(record.backend, record.arch, triton.__version__)
    return known_resources(target, table, str(dtype).replace("torch.", ""), backward, input_bytes)


# Launch records by call signature; bounded so that a stream of distinct shapes cannot grow it
# forever. Any change to the tuning table empties it (``TUNING.on_change``): records hold plans.
_records: dict[tuple, Union[LaunchRecord, SlicedRecord]] = {}
_RECORDS_LIMIT = 4096
TUNING.on_change(_records.clear)


def _launch(direction: str, tensors: tuple[torch.Tensor, ...], view: RowView, log: bool, acc_fp64: bool,
            fusion: Optional[Fusion] = None) -> LaunchPlan:
    device = tensors[0].device
    # A fused call's variant and scalars (a number scale, the mask's strides) are part of its
    # signature: a record holds them as arguments.
    key = (direction, log, acc_fp64, view, device, os.environ.get(PROGRAMS_ENV),
           tuple((t.dtype, t.data_ptr() % 16 == 0) for t in tensors), fusion)
    found = _records.get(key)
    if found is None:
        if len(_records) >= _RECORDS_LIMIT:
            _records.clear()
        found = _records[key] = build_record(direction, tensors, view, log, acc_fp64, fusion=fusion)
    return found(tensors)


# Split launches the driver refused as not co-resident, keyed like the resources: the program
# count it did accept. The occupancy rule is a model; the cooperative launch is the judge.
_accepted_programs: dict[tuple, int] = {}


def _is_residency_refusal(error: Exception) -> bool:
    text = str(error).lower()
    return "cooperative" in text and ("too many blocks" in text or "too large" in text)


def _run(kernel: Any, backend: Backend, plan: LaunchPlan, args: tuple, constexprs: dict, options: dict) -> int:
    """Launch through ``kernel[grid]``; returns the grid size used."""
    if options.get("launch_cooperative_grid"):
        key = (kernel.fn.__name__, tuple(sorted(constexprs.items())), tuple(sorted(options.items())),
               _specialization(args))
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


def run_forward(x: torch.Tensor, y: torch.Tensor, view: RowView, log: bool, fusion: Optional[Fusion] = None,
                fused: tuple[torch.Tensor, ...] = ()) -> LaunchPlan:
    """y = softmax(x) (or log_softmax) over the rows of ``view``; strides in view order x, y. A
    fused call gives its variant (``fusion``) and its mask and scale tensors (``fused``)."""
    return _launch("forward", (x, y, *fused), view, log, y.dtype == torch.float64, fusion)


def run_backward(y: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, view: RowView, log: bool,
                 fusion: Optional[Fusion] = None, fused: tuple[torch.Tensor, ...] = ()) -> LaunchPlan:
    """dx from the saved output y and the gradient dy; strides in view order y, dy, dx; a fused
    call's variant and tensors as ``run_forward``'s."""
    return _launch("backward", (y, dy, dx, *fused), view, log, torch.float64 in (y.dtype, dy.dtype, dx.dtype),
                   fusion)


# Launches of the sharded-row kernels (``variants.SHARDED_PHASES``) by signature: the plan, the
# kernel and its arguments after the tensors.
_sharded: dict[tuple, tuple[Any, Backend, LaunchPlan, tuple, dict, dict]] = {}
TUNING.on_change(_sharded.clear)


def run_sharded(phase: str, tensors: tuple[torch.Tensor, ...], view: RowView, log: bool, acc_fp64: bool,
                ranks: int) -> LaunchPlan:
    """Launch the ``phase`` kernel of rows sharded across ``ranks`` ranks (``distributed.py``):
    ``tensors`` in ``variants.SHARDED_TENSORS[phase]``'s order, ``view`` over the row tensors."""
    device = tensors[0].device
    key = (phase, log, acc_fp64, view, ranks, device, tuple((t.dtype, t.data_ptr() % 16 == 0) for t in tensors))
    found = _sharded.get(key)
    if found is None:
        backend = backend_for(device)
        record = device_record(device)
        names = variants.SHARDED_TENSORS[phase]
        rows = [t for t, name in zip(tensors, names) if name != "stats"]
        backward = phase.startswith("backward")
        inputs = rows[:2] if backward else rows[:1]
        plan = plan_sharded(target_for(record), view.n_rows, view.n_cols, "float64" if acc_fp64 else "float32",
                            backward=backward, rows_per_group=view.rows_per_outer,
                            input_bytes=sum(t.element_size() for t in inputs), strided=view.strided)
        kernel = getattr(_kernel_module(backend), variants.sharded_kernel_name(phase))
        scalars = variants.sharded_scalar_arguments(phase, plan.config, view.n_outer, view.rows_per_outer,
                                                    view.n_cols, view.strides, ranks)
        constexprs = variants.sharded_constexprs(phase, plan.config, log, acc_fp64, ranks)
        options = {"num_warps": plan.num_warps, "num_stages": 1}
        if len(_sharded) >= _RECORDS_LIMIT:
            _sharded.clear()
        found = _sharded[key] = (kernel, backend, plan, scalars, constexprs, options)
    kernel, backend, plan, scalars, constexprs, options = found
    if backend.interpreted:
        _run(kernel, backend, plan, (*tensors, *scalars), constexprs, options)
    else:
        with language_unpatched():
            _run(kernel, backend, plan, (*tensors, *scalars), constexprs, options)
    return plan
