"""Launch planning: a pure function of the target (device record, tuning row, occupancy rule), the
compiled kernel's resource use and the problem size. No torch, no driver calls, no registry or
global table: every recorded chip can be planned for on a machine without it (``targets`` gathers
a record's target).

Four regimes (see ``kernels``):

* ``tile``: rows short enough for one program; several short rows share a tile.
* ``split``: a long row, or too few rows to fill the chip, cut into chunks held by co-resident
  programs. Needs ``record.residency_guaranteed`` and float32 accumulation; a persistent grid
  (every program waits on the others) also ``record.cooperative_launch``, and a ticketed row
  (only its chunks wait on each other) must fit one residency domain. Without residency, where
  the tuning row opens it (``Tuning.split_two_launches``: the tests, on the interpreter), the
  same kernels exchange in two launches (``KernelConfig.phased``), and any grid will do.
* ``loop``: stream the row twice; never waits on another program, so it is always safe.
* ``sliced``: a long reduction along a strided dimension cut into slices, in two launches (each
  slice's partials, then each slice's output from all of its row's partials: the streamed
  kernels of sharded rows, ``variants.phases``); no program waits on another either.

This module is the entry (``plan_launch``, ``select_config``, ``plan_sharded``) and holds the
tiles' choices (windows, dense and flat forms, register caps, wave fill). The records and the grid sizing
every regime shares are ``plan_grid``'s, split rows ``split_planner``'s, rows reduced along a
strided dimension ``strided_planner``'s.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Optional, Union

from portable_softmax.plan_grid import (VECTOR_BYTES, KernelConfig, LaunchPlan, ResourceSource, Target, _cdiv,
                                        _direction, _resources, _row_limit, _size, _warps, estimate_resources,
                                        next_power_of_2)
from portable_softmax.split_planner import _can_split, _no_split_note, _split_config, _windowed, plan_split
from portable_softmax.strided_planner import _strided_config

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
# The divisibility Triton specialises integer arguments on.
TRITON_DIVISIBILITY = 16
# Taller tiles hold more per thread: taken only where they fill their waves this much better.
WAVE_FILL_MARGIN = 0.05
# How many times taller than the planned tiles ``Tuning.tile_wave_fill`` tries them.
TALLER_TILES = (2, 4)


def window_align(n_outer: int, rows_per_outer: int, n_cols: int, strides: Sequence[tuple[int, int, int]],
                 element_sizes: Sequence[int], pointers_aligned: bool, shifted_output: bool = False) -> int:
    """The ``ALIGN`` constexpr of the tile and split kernels: the elements in 16 bytes if rows
    should be read through aligned windows (``kernels/windows.py``), else 1.

    Triton proves a row start 16-byte aligned only from strides that are multiples of 16
    elements, and a row's end mask constant over 16 bytes only from a length that is a multiple
    of them; otherwise it reads one element per instruction, which costs bf16 rows of 50257 a
    third of their bandwidth, and as much to rows sliced from a padded vocabulary
    ((4096, 50304)[:, :50257]), which start aligned. A window needs contiguous columns and
    aligned pointers, and every tensor's rows must start equally far past an aligned element, so
    that one window fits all, or with ``shifted_output`` all but the last (the output, then
    written unaligned at the inputs' window columns). ``strides`` are (outer, row, column) per
    tensor, in elements.
    """
    align = VECTOR_BYTES // min(element_sizes)
    if not pointers_aligned or n_cols <= align or any(col != 1 for _, _, col in strides):
        return 1
    used = [i for i, count in enumerate((n_outer, rows_per_outer)) if count > 1]
    if n_cols % align == 0 and all(triple[i] % TRITON_DIVISIBILITY == 0 for triple in strides for i in used):
        return 1
    windowed = strides[:-1] if shifted_output else strides
    if any(triple[i] % align != strides[0][i] % align for triple in windowed for i in used):
        return 1
    return align


def call_windows(n_outer: int, rows_per_outer: int, n_cols: int, strides: Sequence[tuple[int, int, int]],
                 element_sizes: Sequence[int], pointers_aligned: bool) -> tuple[int, bool]:
    """A call's ``ALIGN`` and whether its output is shifted (``variants.CallFacts.shifted``):
    windows that fit every tensor, else, where the inputs share windows but the output does not
    (rows sliced from a padded vocabulary, written contiguous), windows that follow the inputs."""
    window = (n_outer, rows_per_outer, n_cols, strides, element_sizes, pointers_aligned)
    align = window_align(*window)
    if align > 1:
        return align, False
    shifted = window_align(*window, shifted_output=True)
    return shifted, shifted > 1


def contiguous_align(rows: int, cols: int, element_size: int) -> int:
    """``window_align`` for contiguous [rows, cols] tensors of one element size."""
    return window_align(1, rows, cols, [(0, cols, 1)], [element_size], True)


def input_bytes_per_column(element_size: int, backward: bool) -> int:
    """What a row's column reads from one dtype: x forward, y and dy backward."""
    return element_size * (2 if backward else 1)


def select_config(target: Target, n_rows: int, n_cols: int, dtype: str, *, backward: bool = False,
                  rows_per_group: Optional[int] = None, allow_split: bool = True, align: int = 1,
                  input_bytes: Optional[int] = None, strided: bool = False, causal: bool = False,
                  sliceable: bool = True) -> KernelConfig:
    """The regime and block shape for a problem, from the record's tuning table.

    ``align`` (``window_align``) > 1 offers aligned windows; the split path takes them in the
    directions the tuning table's ``split_windows`` names, with a chunk more where the window, up
    to ``align - 1`` columns wider than the row, needs it (``split_planner._windowed``); rows long
    enough to split (``Tuning.split_min_cols``) that would take a tile split through them instead;
    tiles of one row take their own (``_tile_window``). ``input_bytes``, ``strided``, ``causal`` and
    ``sliceable``: as ``plan_launch`` takes them.
    """
    if input_bytes is None:
        input_bytes = input_bytes_per_column(DTYPE_BYTES[dtype], backward)
    if strided:
        rows_per_group = n_rows if rows_per_group is None else rows_per_group
        return _strided_config(target, n_rows, n_cols, dtype, backward, rows_per_group, allow_split, input_bytes,
                               sliceable)
    plain = _plain_config(target, n_rows, n_cols, dtype, backward, rows_per_group, allow_split, input_bytes,
                          causal)
    tuning = target.tuning
    if align == 1 or _direction(backward) not in tuning.split_windows:
        return _tile_window(target, plain, n_cols, align, dtype, backward, causal, input_bytes)
    shortest = tuning.window_split_cols.get((_direction(backward), input_bytes), tuning.split_min_cols)
    if plain.regime == "tile" and n_cols >= shortest and _can_split(target, dtype, allow_split, n_cols):
        # Rows long enough to split read through the split path's windows, not a tile's (H200,
        # NOTES v51, of copy, against tiles without windows: twice-read, bf16 backward 8192x32001
        # 0.56 -> 0.95, 8192x10001 0.44 -> 0.96, fp32 forward 8192x10001 0.54 -> 0.88; held, bf16
        # forward 8192x9000 0.52 -> 0.80, 16384x16383 0.66 -> 0.81; ``Tuning.window_split_cols``).
        plain = _split_config(target, tuning, n_rows, n_cols, backward)
    elif plain.regime != "split":
        return _tile_window(target, plain, n_cols, align, dtype, backward, causal, input_bytes)
    # The window's row, up to align - 1 columns longer, in chunks its padding halves no narrower
    # than ``Tuning.window_min_chunk``; where it needs more chunks than the row alone, nearly all
    # padding, halved by ``Tuning.window_max_padding`` for its element's bytes.
    windowed = _split_config(target, tuning, n_rows, n_cols + align - 1, backward, halve_to=tuning.window_min_chunk)
    padding = tuning.window_max_padding.get(input_bytes // (2 if backward else 1))
    if padding is not None and windowed.chunks > plain.chunks:
        windowed = _split_config(target, dataclasses.replace(tuning, split_max_padding=padding), n_rows,
                                 n_cols + align - 1, backward, halve_to=tuning.window_min_chunk)
    return _windowed(plain, windowed, align)


def _tile_window(target: Target, plain: KernelConfig, n_cols: int, align: int, dtype: str, backward: bool,
                 causal: bool, input_bytes: int) -> KernelConfig:
    """``plain`` read through aligned windows of ``align`` where it is a tile of one row at least as long as
    the tuning's ``tile_windows`` asks for its direction and the bytes a column reads (float32
    accumulation, not causal: ``kernels/tile_windows.py``), at ``Tuning.window_tile_elements_per_thread``:
    else its rows off 16-byte boundaries are read an element an instruction (H200, NOTES v52, bf16
    forward of copy: 4096x4095 0.79, 16384x3001 0.74, 4096x8191 0.68, where 4096x4096 reads 0.97)."""
    tuning = target.tuning
    shortest = tuning.tile_windows.get((_direction(backward), input_bytes))
    if (align == 1 or plain.regime != "tile" or plain.block_m != 1 or dtype == "float64" or causal
            or shortest is None or n_cols < shortest):
        return plain
    per_thread = tuning.window_tile_elements_per_thread
    warps = _warps(plain.block_n, per_thread, target.record, tuning.max_warps) if per_thread else plain.num_warps
    return dataclasses.replace(plain, align=align, num_warps=warps)


def _plain_config(target: Target, n_rows: int, n_cols: int, dtype: str, backward: bool,
                  rows_per_group: Optional[int], allow_split: bool, input_bytes: int,
                  causal: bool = False) -> KernelConfig:
    record = target.record
    tuning = target.tuning
    rows_per_group = n_rows if rows_per_group is None else rows_per_group
    width = next_power_of_2(n_cols)
    row_limit = _row_limit(tuning, dtype, backward)
    can_split = _can_split(target, dtype, allow_split, n_cols)
    few_rows = can_split and n_rows < record.compute_units and n_cols >= tuning.split_min_cols
    if width in tuning.reread_cols.get((_direction(backward), input_bytes), ()) and not few_rows:
        most = tuning.max_program_threads // max(record.warp_size, 1)
        return KernelConfig("tile", 1, width, 1, _warps(width, tuning.reread_elements_per_thread, record, most),
                            reread=True)
    if width <= row_limit:
        block_m = max(1, min(tuning.tile_elements // width, next_power_of_2(rows_per_group)))
        tiles = _cdiv(n_rows, block_m)
        if can_split and tiles < record.compute_units and n_cols >= tuning.split_min_cols:
            return _split_config(target, tuning, n_rows, n_cols, backward)
        # A causal forward reads the kept part of its rows, half of them on average: the warps
        # for what it reads (H200, causal 4096-wide bf16 rows at half the warps: 0.77 -> 0.85 of
        # copy, NOTES v18).
        read = block_m * width // (2 if causal and not backward else 1)
        warps = _warps(read, tuning.elements_per_thread, record, tuning.max_warps)
        return KernelConfig("tile", block_m, width, 1, warps)
    if can_split:
        return _split_config(target, tuning, n_rows, n_cols, backward)
    chunk = min(tuning.loop_chunk, width)
    return KernelConfig("loop", 1, chunk, 1, _warps(chunk, tuning.elements_per_thread, record, tuning.max_warps))


def tile_fill(target: Target, config: KernelConfig, input_bytes: int) -> list[tuple[int, dict[str, Any]]]:
    """As ``split_fit``, for tiles held whole (not twice-read): the register caps that would give
    each unit ``Tuning.tile_fit_bytes`` of tiles at once (a tile reads ``input_bytes`` per
    element), most programs first. A tile program loads, reduces, then stores: while it reduces
    and stores, only the unit's other programs keep memory busy. Empty where the tuning does not
    ask, for other regimes, or where the backend offers no such option."""
    record = target.record
    tuning = target.tuning
    if config.regime != "tile" or config.reread or not tuning.tile_fit_bytes:
        return []
    wanted = _cdiv(tuning.tile_fit_bytes, config.block_m * config.block_n * input_bytes)
    wanted = min(wanted, record.max_programs_per_unit or wanted)
    caps = [(programs, target.fit_options(record, config.num_warps, programs)) for programs in range(wanted, 0, -1)]
    return [(programs, options) for programs, options in caps if options]


def tile_fit(target: Target, config: KernelConfig, tiles: int) -> list[tuple[int, dict[str, Any]]]:
    """As ``split_fit``, for a grid of a program per tile where ``Tuning.tile_wave_fill`` asks for
    one: the one cap that lets all ``tiles`` of ``config`` be resident at once, with the programs
    per unit that takes (a cap short of that only fills the last wave differently). Empty where
    the tuning does not ask, for one tile per unit or fewer, or where no cap can."""
    record = target.record
    tuning = target.tuning
    wanted = _cdiv(tiles, max(record.compute_units, 1))
    if (config.regime != "tile" or config.reread or not tuning.tile_wave_fill or tiles <= record.compute_units
            or wanted > (record.max_programs_per_unit or wanted)):
        return []
    options = target.fit_options(record, config.num_warps, wanted)
    return [(wanted, options)] if options else []


def wave_fill(target: Target, plan: LaunchPlan) -> float:
    """How full the waves of resident programs are that run a plan's tiles, on average: 1 when
    its tiles split evenly into them."""
    record = target.record
    resident = max(1, record.compute_units * plan.occupancy)
    return plan.tiles / (_cdiv(plan.tiles, resident) * resident)


def plan_launch(target: Target, n_rows: int, n_cols: int, dtype: str, *, backward: bool = False,
                rows_per_group: Optional[int] = None, resources: ResourceSource = None,
                programs: Optional[int] = None, allow_split: bool = True, align: int = 1,
                input_bytes: Optional[int] = None, narrow: bool = False, strided: bool = False,
                causal: bool = False, sliceable: bool = True) -> LaunchPlan:
    """Plan one launch (for the sliced regime, both of its launches: one program per item each).

    Args:
        record: the device.
        n_rows: rows in all groups together; n_cols: the softmax length.
        dtype: torch dtype name of the data (``float32``, ``bfloat16``, ``float16``, ``float64``).
        backward: plan the backward kernel (two inputs per element).
        rows_per_group: rows per group of the row view (defaults to ``n_rows``).
        resources: the compiled kernel's use, or a function from config to it; estimated if None.
        programs: a forced grid size (``PORTABLE_SOFTMAX_PROGRAMS``); checked for safety.
        allow_split: False rules the split path out (e.g. no scratch can be allocated now).
        align: ``window_align`` of the tensors: offers aligned windows (``select_config``).
        input_bytes: bytes a row's column reads (x forward; y and dy backward); from ``dtype``
            if None. Decides between a persistent and a ticketed split grid (``_ticket_fits``).
        narrow: every element offset of every tensor fits in int32: tile plans may then take the
            kernels' ``DENSE`` form (``dense_form``).
        strided: the rows lie side by side in memory and are reduced along a strided dimension
            (``_strided_config``).
        causal: a fused causal call (``fused.py``), whose forward reads only the kept part of
            each row: tiles get warps for what they read.
        sliceable: the call may take the sliced regime (``_strided_config``), whose kernels fuse
            nothing.

    Returns:
        The plan. Raises ValueError if ``programs`` would break the split path's residency.
    """
    record = target.record
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r} is not one of {sorted(DTYPE_BYTES)}")
    rows_per_group = n_rows if rows_per_group is None else rows_per_group
    if input_bytes is None:
        input_bytes = input_bytes_per_column(DTYPE_BYTES[dtype], backward)
    config = select_config(target, n_rows, n_cols, dtype, backward=backward, rows_per_group=rows_per_group,
                           allow_split=allow_split, align=align, input_bytes=input_bytes, strided=strided,
                           causal=causal, sliceable=sliceable)
    if config.regime == "sliced":
        # Two launches of a program per item, compiled per phase: nothing to size from resources.
        return _size(target, config, estimate_resources(record, config, backward, input_bytes), n_rows,
                     rows_per_group, programs, backward)
    if config.regime == "split":
        plan = plan_split(target, config, n_rows, n_cols, rows_per_group, resources, backward, input_bytes, programs)
    else:
        plan = _size(target, config, _resources(resources, target, config, backward, input_bytes), n_rows,
                     rows_per_group, programs, backward)
    if plan is None:
        config = select_config(target, n_rows, n_cols, dtype, backward=backward, rows_per_group=rows_per_group,
                               allow_split=False, align=align, input_bytes=input_bytes, strided=strided,
                               causal=causal, sliceable=sliceable)
        kernel = _resources(resources, target, config, backward, input_bytes)
        plan = _size(target, config, kernel, n_rows, rows_per_group, programs, backward, note=_no_split_note(record))
    # The dense form before the waves are filled: its kernel holds fewer registers, so its grid
    # fills its waves differently, and the fill to judge is that of the form that launches (with
    # Triton 3.9 a bf16 backward of 32768 rows of 256 took 16-row tiles for the fill of their
    # 114-register form, 8 a unit, then launched their 80-register dense form at 12: 1.29 waves).
    if dense_form(target, plan, n_rows, n_cols, rows_per_group, narrow, backward):
        config = dataclasses.replace(plan.config, dense=True)
        kernel = _resources(resources, target, config, backward, input_bytes)
        plan = _size(target, config, kernel, n_rows, rows_per_group, programs, backward)
    elif flat_form(target, plan, n_rows, rows_per_group, narrow, backward):
        config = dataclasses.replace(plan.config, flat=True)
        kernel = _resources(resources, target, config, backward, input_bytes)
        plan = _size(target, config, kernel, n_rows, rows_per_group, programs, backward)
    # Windowed tiles hold one row (taller tiles would read their rows an element an instruction).
    if (programs is None and plan.regime == "tile" and not plan.reread and plan.align == 1
            and plan.tiles > record.compute_units * plan.occupancy
            and wave_fill(target, plan) < target.tuning.tile_wave_fill):
        plan = _fuller_waves(target, plan, resources, n_rows, n_cols, backward, input_bytes, rows_per_group, narrow)
    if plan.regime == "tile" and plan.programs == plan.tiles:
        # The same grid, compiled without the loop over tiles that a program of it never repeats.
        config = dataclasses.replace(plan.config, per_tile=True)
        kernel = _resources(resources, target, config, backward, input_bytes)
        plan = dataclasses.replace(plan, per_tile=True, occupancy=target.occupancy(record, kernel))
    return plan


def dense_form(target: Target, plan: Union[LaunchPlan, KernelConfig], n_rows: int, n_cols: int,
               rows_per_group: int, narrow: bool, backward: bool) -> bool:
    """Whether a tile plan takes the kernels' ``DENSE`` form, as Inductor writes its kernels (no group
    division, int32 offsets, no masks): twice-read tiles, and held ones in the directions
    ``Tuning.dense_tiles`` names, where the call has one group of rows that fill their tiles and
    every offset fits in int32 (``narrow``)."""
    eligible = plan.reread or _direction(backward) in target.tuning.dense_tiles
    fits = narrow and rows_per_group == n_rows and n_cols == plan.block_n and n_rows % plan.block_m == 0
    return plan.regime == "tile" and eligible and fits


def flat_form(target: Target, plan: Union[LaunchPlan, KernelConfig], n_rows: int, rows_per_group: int, narrow: bool,
              backward: bool) -> bool:
    """Whether a tile plan that is not dense takes the kernels' flat form (``DENSE`` 2: no group
    division, int32 offsets, masks kept), in the directions ``Tuning.flat_tiles`` names, where the
    call has one group of rows whose offsets fit in int32 (``narrow``)."""
    eligible = _direction(backward) in target.tuning.flat_tiles and not plan.dense
    return plan.regime == "tile" and eligible and narrow and rows_per_group == n_rows


def _fuller_waves(target: Target, plan: LaunchPlan, resources: ResourceSource, n_rows: int, n_cols: int,
                  backward: bool, input_bytes: int, rows_per_group: int, narrow: bool) -> LaunchPlan:
    """``plan``'s tile grid or one of tiles 2 or 4 times taller, whichever fills its waves of
    resident programs best (``Tuning.tile_wave_fill``); taller tiles that spill more than a
    register cap may are passed over. The launcher's resources function compiles each with the
    register cap of ``tile_fit`` where that makes room for every tile at once, as it did
    ``plan``'s. A dense plan's taller tiles are dense where their rows still fill them
    (``dense_form``), else flat where the tuning asks (``flat_form``)."""
    best = plan
    for factor in TALLER_TILES:
        config = dataclasses.replace(plan.config, block_m=plan.block_m * factor)
        if config.block_m > next_power_of_2(rows_per_group):
            break
        if config.dense and not dense_form(target, config, n_rows, n_cols, rows_per_group, narrow, backward):
            config = dataclasses.replace(config, dense=False)
            config = dataclasses.replace(config, flat=flat_form(target, config, n_rows, rows_per_group, narrow,
                                                                backward))
        kernel = _resources(resources, target, config, backward, input_bytes)
        if kernel.spills > target.tuning.split_fit_max_spills:
            continue
        found = _size(target, config, kernel, n_rows, rows_per_group, None, backward)
        if found is not None and wave_fill(target, found) > wave_fill(target, best) + WAVE_FILL_MARGIN:
            best = dataclasses.replace(found, reason=f"{found.reason}; waves {wave_fill(target, found):.2f} full")
    return best


def plan_sharded(target: Target, n_rows: int, n_cols: int, dtype: str, *, backward: bool = False,
                 rows_per_group: Optional[int] = None, input_bytes: Optional[int] = None,
                 strided: bool = False) -> LaunchPlan:
    """Plan the streamed kernels of rows sharded across ranks (``kernels.softmax_forward_partials``
    and the others): the loop regime's chunks for long slices, tiles of several rows for short
    ones, tiles of ``Tuning.strided_rows`` adjacent rows for ``strided`` ones; a grid as the loop
    regime's. No program waits on another, so every backend takes them."""
    record = target.record
    tuning = target.tuning
    rows_per_group = n_rows if rows_per_group is None else rows_per_group
    if input_bytes is None:
        input_bytes = input_bytes_per_column(DTYPE_BYTES[dtype], backward)
    width = next_power_of_2(max(n_cols, 1))
    inputs = 2 if backward else 1
    if strided:
        block_m = min(next_power_of_2(rows_per_group),
                      tuning.strided_rows.get(input_bytes // inputs, VECTOR_BYTES * 2 // max(1, input_bytes // inputs)))
        block_n = max(1, min(tuning.loop_chunk // block_m, width))
    elif width <= tuning.tile_elements:
        block_m, block_n = max(1, min(tuning.tile_elements // width, next_power_of_2(rows_per_group))), width
    else:
        block_m, block_n = 1, min(tuning.loop_chunk, width)
    config = KernelConfig("loop", block_m, block_n, 1,
                          _warps(block_m * block_n, tuning.elements_per_thread, record, tuning.max_warps))
    plan = _size(target, config, estimate_resources(record, config, backward, input_bytes), n_rows, rows_per_group,
                 None, backward)
    assert plan is not None  # the loop regime always has a grid
    return dataclasses.replace(plan, reason=f"sharded rows, {plan.reason}")
