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
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

from portable_softmax.record import DeviceRecord, KernelResources
from portable_softmax.tuning import Tuning

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
MAX_SPLIT_CHUNKS = 1024
# A sliced row's normalize phase reads the partials of all its slices at once, [rows, slices].
MAX_SLICES = 64
# The widest vector load, and the divisibility Triton specialises integer arguments on.
VECTOR_BYTES = 16
TRITON_DIVISIBILITY = 16
# Rows of this many elements or more never split (``_can_split``).
SPLIT_COLS_LIMIT = 2**31
# Taller tiles hold more per thread: taken only where they fill their waves this much better.
WAVE_FILL_MARGIN = 0.05
# How many times taller than the planned tiles ``Tuning.tile_wave_fill`` tries them.
TALLER_TILES = (2, 4)


@dataclass(frozen=True)
class Target:
    """Everything the planner knows of a device, handed to it: the record, the tuning row in
    force for it, and its backend's occupancy rule and register caps (``targets.target_for``
    gathers them for a record). The planner asks nothing else: no registry, no global table."""

    record: DeviceRecord
    tuning: Tuning
    occupancy: Callable[[DeviceRecord, KernelResources], int]
    fit_options: Callable[[DeviceRecord, int, int], dict[str, Any]]


@dataclass(frozen=True)
class KernelConfig:
    """The compile-time choices: what a compiled kernel is specialised on, besides its arguments."""

    regime: str
    block_m: int
    block_n: int
    chunks: int
    num_warps: int
    num_stages: int = 1
    # The kernels' ALIGN: 1, or the elements in 16 bytes when rows are read in aligned windows.
    align: int = 1
    # The split kernels' TICKETED: a program per item, items taken by ticket (kernels.split._split_items).
    ticketed: bool = False
    # The tile kernels' REREAD: the inputs read twice rather than held.
    reread: bool = False
    # The tile kernels' PER_TILE: a grid of a program per tile, so no loop over tiles.
    per_tile: bool = False
    # The tile kernels' DENSE: one group of rows that fill their tiles, int32 offsets, no masks.
    dense: bool = False
    # The split kernels' exchange in two launches (``variants.launch_phases``), where programs
    # cannot wait on each other: every chunk publishes its partials, then every chunk reads them.
    phased: bool = False

    @property
    def chunks_p2(self) -> int:
        return next_power_of_2(self.chunks)


@dataclass(frozen=True)
class LaunchPlan:
    """A complete launch: the kernel configuration, the grid and why."""

    backend: str
    regime: str
    block_m: int
    block_n: int
    chunks: int
    num_warps: int
    num_stages: int
    programs: int
    occupancy: int
    tiles: int
    items: int
    rows_per_program: int
    reason: str
    align: int = 1
    ticketed: bool = False
    reread: bool = False
    per_tile: bool = False
    dense: bool = False
    phased: bool = False

    @property
    def config(self) -> KernelConfig:
        return KernelConfig(self.regime, self.block_m, self.block_n, self.chunks, self.num_warps, self.num_stages,
                            self.align, self.ticketed, self.reread, self.per_tile, self.dense, self.phased)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


ResourceSource = Union[KernelResources, Callable[[KernelConfig], KernelResources], None]


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


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _direction(backward: bool) -> str:
    """The direction as the tuning table's direction sets name it."""
    return "backward" if backward else "forward"


def _tiles(config: KernelConfig, n_rows: int, rows_per_group: int) -> int:
    """Tiles of ``config.block_m`` rows, which never span two groups."""
    return _cdiv(n_rows, max(rows_per_group, 1)) * _cdiv(rows_per_group, config.block_m)


def _warps(elements: int, per_thread: int, record: DeviceRecord, most: int) -> int:
    """The power-of-two warps that give each thread ``per_thread`` of ``elements``, at most ``most``."""
    lanes = max(record.warp_size, 1)
    warps = next_power_of_2(max(1, elements // (per_thread * lanes)))
    return max(1, min(warps, most))


def estimate_resources(record: DeviceRecord, config: KernelConfig, backward: bool = False,
                       input_bytes: Optional[int] = None) -> KernelResources:
    """A register and shared-memory guess for a config, for planning without a compiler.
    ``input_bytes``: what a column reads (as ``plan_launch`` takes it), for pipeline buffers."""
    lanes = max(record.warp_size, 1) * config.num_warps
    per_thread = _cdiv(config.block_m * config.block_n, lanes) * (2 if backward else 1)
    if config.regime == "loop" or config.reread:
        per_thread = _cdiv(per_thread, 2)
    registers = min(255, 32 + per_thread) if record.registers_per_unit else 0
    shared = 4 * config.block_m * config.num_warps * (2 if config.regime == "split" else 1)
    if config.num_stages > 1:
        column = input_bytes if input_bytes is not None else 4 * (2 if backward else 1)
        shared += (config.num_stages - 1) * config.block_m * config.block_n * column
    return KernelResources(registers=registers, shared_memory=shared, num_warps=config.num_warps)


def select_config(target: Target, n_rows: int, n_cols: int, dtype: str, *, backward: bool = False,
                  rows_per_group: Optional[int] = None, allow_split: bool = True, align: int = 1,
                  input_bytes: Optional[int] = None, strided: bool = False, causal: bool = False,
                  sliceable: bool = True) -> KernelConfig:
    """The regime and block shape for a problem, from the record's tuning table.

    ``align`` (``window_align``) > 1 offers aligned windows; the split path takes them in the
    directions the tuning table's ``split_windows`` names, where the window, up to ``align - 1``
    columns wider than the row, needs no more or wider chunks. ``input_bytes``, ``strided``,
    ``causal`` and ``sliceable``: as ``plan_launch`` takes them.
    """
    if input_bytes is None:
        input_bytes = input_bytes_per_column(DTYPE_BYTES[dtype], backward)
    if strided:
        rows_per_group = n_rows if rows_per_group is None else rows_per_group
        return _strided_config(target, n_rows, n_cols, dtype, backward, rows_per_group, allow_split, input_bytes,
                               sliceable)
    plain = _plain_config(target, n_rows, n_cols, dtype, backward, rows_per_group, allow_split, input_bytes,
                          causal)
    if align == 1 or plain.regime != "split" or _direction(backward) not in target.tuning.split_windows:
        return plain
    windowed = _plain_config(target, n_rows, n_cols + align - 1, dtype, backward, rows_per_group, allow_split,
                             input_bytes, causal)
    return _windowed(plain, windowed, align)


def split_config(target: Target, n_rows: int, n_cols: int, *, backward: bool = False, align: int = 1,
                 per_thread: Optional[int] = None) -> KernelConfig:
    """The split configuration of ``n_rows`` rows of ``n_cols`` (chunks, block, warps, pipeline),
    read through aligned windows where ``align`` > 1 offers them, as ``select_config`` sizes a
    split row: for a caller that has chosen the split regime itself (the loss's forward,
    ``loss_planner.plan_loss``). ``backward``: chunks for two inputs a column. ``per_thread``:
    the elements a thread holds, for the warps (``Tuning.split_elements_per_thread`` if None)."""
    plain = _split_config(target, target.tuning, n_rows, n_cols, backward, per_thread)
    if align == 1 or _direction(backward) not in target.tuning.split_windows:
        return plain
    return _windowed(plain, _split_config(target, target.tuning, n_rows, n_cols + align - 1, backward, per_thread),
                     align)


def _windowed(plain: KernelConfig, windowed: KernelConfig, align: int) -> KernelConfig:
    """``windowed`` (planned for rows ``align - 1`` columns longer) read through windows of
    ``align``, where it needs no more or wider chunks than ``plain``; else ``plain``."""
    if dataclasses.replace(windowed, align=1) != plain:
        return plain
    # Windowed rows run unpipelined: the pipeline's buffers cost them more programs than it buys.
    return dataclasses.replace(windowed, align=align, num_stages=1)


def _row_limit(tuning: Tuning, dtype: str, backward: bool) -> int:
    """The most elements of a row (or of a strided tile) one program holds whole."""
    return tuning.row_elements // (2 if backward else 1) // (2 if dtype == "float64" else 1)


def _can_split(target: Target, dtype: str, allow_split: bool, n_cols: int) -> bool:
    """Whether the split path is open: its programs wait on each other where the record promises
    residency, else exchange in two launches where the tuning row asks (``_phased``). Rows of
    SPLIT_COLS_LIMIT elements or more stream through the loop regime, whose column offsets come
    from a 64-bit loop counter (Triton passes such a length as i64): the split kernels count a
    chunk's columns in 32 bits, and no tile holds such a row."""
    opened = target.record.residency_guaranteed or target.tuning.split_two_launches
    return allow_split and opened and dtype != "float64" and n_cols < SPLIT_COLS_LIMIT


def _phased(target: Target) -> bool:
    """Whether split configs for ``target`` exchange in two launches: its programs cannot wait
    on each other."""
    return not target.record.residency_guaranteed


def _strided_config(target: Target, n_rows: int, n_cols: int, dtype: str, backward: bool, rows_per_group: int,
                    allow_split: bool, input_bytes: int, sliceable: bool = True) -> KernelConfig:
    """The configuration for rows that lie side by side in memory, reduced along a strided
    dimension: every tile spans ``Tuning.strided_rows`` adjacent rows, so that its loads read
    whole sectors of the contiguous dimension, and as much of the reduced one as a program holds
    (``_row_limit``): the whole row (tile), else chunks of it held at once by several programs
    (split, ``Tuning.strided_split_elements``), else (``sliceable``: the sliced kernels fuse
    nothing) slices streamed in two launches (sliced, ``_sliced_config``), else streamed twice
    by a program per tile (loop). Where the tuning row names the direction and element size in
    ``strided_slices``, rows at least that long are sliced rather than split."""
    record = target.record
    tuning = target.tuning
    width = next_power_of_2(n_cols)
    inputs = 2 if backward else 1
    element = max(1, input_bytes // inputs)
    side = min(next_power_of_2(rows_per_group), tuning.strided_rows.get(element, VECTOR_BYTES * 2 // element))
    if side * width <= _row_limit(tuning, dtype, backward):
        block_m = max(side, min(tuning.tile_elements // width, next_power_of_2(rows_per_group)))
        return KernelConfig("tile", block_m, width, 1,
                            _warps(block_m * width, tuning.elements_per_thread, record, tuning.max_warps))
    sliced = _sliced_config(target, n_rows, n_cols, rows_per_group, element) if sliceable else None
    sliced_from = tuning.strided_slices.get((_direction(backward), element))
    if sliced is not None and sliced_from is not None and n_cols >= sliced_from:
        return sliced
    if _can_split(target, dtype, allow_split, n_cols):
        config = _strided_split(target, n_rows, n_cols, rows_per_group, side, inputs)
        # Wider tiles, up to the tuning's rows, while a program's exchange slots stay few.
        widest = min(next_power_of_2(rows_per_group),
                     tuning.strided_split_rows.get((_direction(backward), element), side))
        while config.block_m < widest:
            wider = _strided_split(target, n_rows, n_cols, rows_per_group, 2 * config.block_m, inputs)
            if wider.block_m * wider.chunks > tuning.strided_split_slots:
                break
            config = wider
        return config
    if sliced is not None:
        return sliced
    chunk = max(1, min(tuning.loop_chunk // side, width))
    return KernelConfig("loop", side, chunk, 1, _warps(side * chunk, tuning.elements_per_thread, record, tuning.max_warps))


def _sliced_config(target: Target, n_rows: int, n_cols: int, rows_per_group: int,
                   element: int) -> Optional[KernelConfig]:
    """Slices of strided rows (``_strided_config``): tiles of 128 bytes of adjacent rows, rows cut
    into slices of ``Tuning.slice_elements`` (at most ``MAX_SLICES``) until the tiles' slices give
    ``slice_programs_per_unit`` programs a unit; None where that leaves fewer than two slices (a
    loop program per tile then streams as much)."""
    record = target.record
    tuning = target.tuning
    side = min(next_power_of_2(rows_per_group), max(1, VECTOR_BYTES * 8 // element))
    tiles = _cdiv(n_rows, max(rows_per_group, 1)) * _cdiv(rows_per_group, side)
    slices = min(MAX_SLICES, _cdiv(n_cols, tuning.slice_elements),
                 _cdiv(record.compute_units * tuning.slice_programs_per_unit, tiles))
    if slices < 2:
        return None
    # Equal slices, none of them empty.
    slices = _cdiv(n_cols, _cdiv(n_cols, slices))
    step = max(1, min(tuning.slice_tile_elements // side, next_power_of_2(_cdiv(n_cols, slices))))
    return KernelConfig("sliced", side, step, slices,
                        _warps(side * step, tuning.split_elements_per_thread, record, tuning.max_warps))


def _strided_split(target: Target, n_rows: int, n_cols: int, rows_per_group: int, side: int,
                   inputs: int) -> KernelConfig:
    """Split tiles of ``side`` adjacent rows (``_strided_config``)."""
    record = target.record
    tuning = target.tuning
    chunks = _cdiv(n_cols, max(1, tuning.strided_split_elements // inputs // side))
    tiles = _cdiv(n_rows, max(rows_per_group, 1)) * _cdiv(rows_per_group, side)
    wanted = _cdiv(record.compute_units * tuning.split_fill_per_unit, tiles)
    if chunks < wanted:
        # Few tiles: narrower chunks put more of the chip to work on each.
        chunks = max(chunks, min(wanted, _cdiv(n_cols * side, tuning.split_min_chunk), MAX_SPLIT_CHUNKS))
    block_n = next_power_of_2(_cdiv(n_cols, chunks))
    return KernelConfig("split", side, block_n, _cdiv(n_cols, block_n),
                        _warps(side * block_n, tuning.split_elements_per_thread, record, tuning.max_warps),
                        phased=_phased(target))


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


def _split_config(target: Target, tuning: Tuning, n_rows: int, n_cols: int, backward: bool,
                  per_thread: Optional[int] = None) -> KernelConfig:
    record = target.record
    widest = tuning.split_chunk // (2 if backward else 1)
    chunks = _cdiv(n_cols, widest)
    wanted = _cdiv(record.compute_units * tuning.split_fill_per_unit, n_rows)
    if chunks < wanted:
        # Few rows: narrower chunks put more of the chip to work on each row.
        chunks = max(chunks, min(wanted, _cdiv(n_cols, tuning.split_min_chunk), MAX_SPLIT_CHUNKS))
    # The narrowest power of two that still needs no more chunks: odd rows (50257) waste less.
    block_n = next_power_of_2(_cdiv(n_cols, chunks))
    # Halve chunks whose padding still idles too much of the row's programs (50257 in 8K chunks: 12%).
    while (block_n // 2 >= tuning.split_min_chunk and _cdiv(n_cols, block_n // 2) <= MAX_SPLIT_CHUNKS
           and 1 - n_cols / (_cdiv(n_cols, block_n) * block_n) > tuning.split_max_padding):
        block_n //= 2
    chunks = _cdiv(n_cols, block_n)
    stages = tuning.split_stages if _direction(backward) in tuning.split_pipelined else 1
    warps = _warps(block_n, per_thread or tuning.split_elements_per_thread, record, tuning.max_warps)
    return KernelConfig("split", 1, block_n, chunks, warps, stages, phased=_phased(target))


def split_fit(target: Target, config: KernelConfig, input_bytes: int) -> list[tuple[int, dict[str, Any]]]:
    """The register caps to try on a split kernel, most programs per unit first: from the count
    ``Tuning.split_fit_bytes`` asks for (a chunk reads ``input_bytes`` per column: x's element
    size forward, y's plus dy's backward) down to one, each with the backend's compile options
    that make it fit. Empty for other regimes, or where the backend offers no such option."""
    record = target.record
    tuning = target.tuning
    wanted = _cdiv(tuning.split_fit_bytes, config.block_m * config.block_n * input_bytes)
    wanted = min(wanted, tuning.split_programs_per_unit, record.max_programs_per_unit or wanted)
    if config.regime != "split" or wanted < 1:
        return []
    caps = [(programs, target.fit_options(record, config.num_warps, programs)) for programs in range(wanted, 0, -1)]
    return [(programs, options) for programs, options in caps if options]


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


def _resources(source: ResourceSource, target: Target, config: KernelConfig, backward: bool,
               input_bytes: int) -> KernelResources:
    record = target.record
    if source is None:
        return estimate_resources(record, config, backward, input_bytes)
    if isinstance(source, KernelResources):
        return source
    return source(config)


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
    if (programs is None and plan.regime == "tile" and not plan.reread
            and plan.tiles > record.compute_units * plan.occupancy
            and wave_fill(target, plan) < target.tuning.tile_wave_fill):
        plan = _fuller_waves(target, plan, resources, n_rows, n_cols, backward, input_bytes, rows_per_group, narrow)
    if plan.regime == "tile" and plan.programs == plan.tiles:
        # The same grid, compiled without the loop over tiles that a program of it never repeats.
        config = dataclasses.replace(plan.config, per_tile=True)
        kernel = _resources(resources, target, config, backward, input_bytes)
        plan = dataclasses.replace(plan, per_tile=True, occupancy=target.occupancy(record, kernel))
    return plan


def plan_split(target: Target, config: KernelConfig, n_rows: int, n_cols: int, rows_per_group: int,
               resources: ResourceSource, backward: bool, input_bytes: int, programs: Optional[int] = None,
               per_thread: Optional[int] = None) -> Optional[LaunchPlan]:
    """The grid of a split ``config`` (``select_config``, ``split_config``): a program per item
    taken by ticket where the tuning row asks in the direction and the ticketed form fits
    (``ticketed_forms``, ``_ticket_fits``), else a persistent grid, unpipelined where its programs
    would get too few items (``Tuning.split_pipeline_items``). None where the split path does not
    fit resident (``_size``): the caller then takes another regime. ``programs``: a forced grid,
    persistent (``plan_launch``); ``per_thread``: as ``split_config`` takes it."""
    if programs is None and _direction(backward) in target.tuning.split_tickets:
        for ticketed in ticketed_forms(target, config, n_cols, backward, input_bytes, per_thread):
            kernel = _resources(resources, target, ticketed, backward, input_bytes)
            if _ticket_fits(target, ticketed, kernel, n_rows, rows_per_group, input_bytes):
                config = ticketed
                break
    if not config.ticketed:
        kernel = _resources(resources, target, config, backward, input_bytes)
    plan = _size(target, config, kernel, n_rows, rows_per_group, programs, backward)
    if plan is not None and config.num_stages > 1 and plan.items < target.tuning.split_pipeline_items * plan.programs:
        config = dataclasses.replace(config, num_stages=1)
        kernel = _resources(resources, target, config, backward, input_bytes)
        plan = _size(target, config, kernel, n_rows, rows_per_group, programs, backward)
    return plan


def ticketed_forms(target: Target, config: KernelConfig, n_cols: int, backward: bool,
                   input_bytes: int, per_thread: Optional[int] = None) -> list[KernelConfig]:
    """The ticketed forms of a split ``config``, in the order ``plan_launch`` tries them: each
    unpipelined (a program takes one item: nothing to pipeline); for one-row items first with
    chunks no wider than ``Tuning.ticket_chunk`` gives for the direction and the bytes a column
    reads (an aligned window's chunks cover its ``align - 1`` extra columns, as
    ``select_config`` counts them), then with the config's own."""
    tuning = target.tuning
    own = dataclasses.replace(config, ticketed=True, num_stages=1)
    widest = tuning.ticket_chunk.get((_direction(backward), input_bytes), config.block_n)
    span = n_cols + (config.align - 1 if config.align > 1 else 0)
    if config.block_m > 1 or widest >= config.block_n or _cdiv(span, widest) > MAX_SPLIT_CHUNKS:
        return [own]
    warps = _warps(widest, per_thread or tuning.split_elements_per_thread, target.record, tuning.max_warps)
    return [dataclasses.replace(own, block_n=widest, chunks=_cdiv(span, widest), num_warps=warps), own]


def _no_split_note(record: DeviceRecord) -> str:
    """Why a plan that wanted the split path streams or tiles instead."""
    if record.cooperative_launch:
        return "split path does not fit resident; "
    return "split path does not fit resident without a cooperative launch; "


def dense_form(target: Target, plan: Union[LaunchPlan, KernelConfig], n_rows: int, n_cols: int,
               rows_per_group: int, narrow: bool, backward: bool) -> bool:
    """Whether a tile plan takes the kernels' ``DENSE`` form, as Inductor writes its kernels (no group
    division, int32 offsets, no masks): twice-read tiles, and held ones in the directions
    ``Tuning.dense_tiles`` names, where the call has one group of rows that fill their tiles and
    every offset fits in int32 (``narrow``)."""
    eligible = plan.reread or _direction(backward) in target.tuning.dense_tiles
    fits = narrow and rows_per_group == n_rows and n_cols == plan.block_n and n_rows % plan.block_m == 0
    return plan.regime == "tile" and eligible and fits


def _fuller_waves(target: Target, plan: LaunchPlan, resources: ResourceSource, n_rows: int, n_cols: int,
                  backward: bool, input_bytes: int, rows_per_group: int, narrow: bool) -> LaunchPlan:
    """``plan``'s tile grid or one of tiles 2 or 4 times taller, whichever fills its waves of
    resident programs best (``Tuning.tile_wave_fill``); taller tiles that spill more than a
    register cap may are passed over. The launcher's resources function compiles each with the
    register cap of ``tile_fit`` where that makes room for every tile at once, as it did
    ``plan``'s. A dense plan's taller tiles are dense where their rows still fill them
    (``dense_form``)."""
    best = plan
    for factor in TALLER_TILES:
        config = dataclasses.replace(plan.config, block_m=plan.block_m * factor)
        if config.block_m > next_power_of_2(rows_per_group):
            break
        if config.dense and not dense_form(target, config, n_rows, n_cols, rows_per_group, narrow, backward):
            config = dataclasses.replace(config, dense=False)
        kernel = _resources(resources, target, config, backward, input_bytes)
        if kernel.spills > target.tuning.split_fit_max_spills:
            continue
        found = _size(target, config, kernel, n_rows, rows_per_group, None, backward)
        if found is not None and wave_fill(target, found) > wave_fill(target, best) + WAVE_FILL_MARGIN:
            best = dataclasses.replace(found, reason=f"{found.reason}; waves {wave_fill(target, found):.2f} full")
    return best


def _ticket_fits(target: Target, config: KernelConfig, kernel: KernelResources, n_rows: int,
                 rows_per_group: int, input_bytes: int) -> bool:
    """Whether a split launch gives each item a program that takes it by ticket (``config``,
    compiled as ``kernel``), rather than running a persistent grid. ``plan_launch`` asks in the
    directions ``Tuning.split_tickets`` names, with no forced grid size; it is yes where the
    ticketed programs resident on a unit hold ``split_ticket_bytes`` of input or more, or the
    items are tiles of several rows in ``strided_ticket_chunks`` chunks or more, and the items
    fill ``split_ticket_waves`` resident grids (few-row shapes keep the persistent grid, which
    needs no scratch reset before each launch)."""
    record = target.record
    tuning = target.tuning
    per_unit = min(target.occupancy(record, kernel), tuning.split_programs_per_unit)
    items = _tiles(config, n_rows, rows_per_group) * config.chunks
    held = per_unit * config.block_m * config.block_n * input_bytes
    many_chunks = config.block_m > 1 and 0 < tuning.strided_ticket_chunks <= config.chunks
    return ((config.phased or config.chunks <= _domain_resident(record, per_unit))
            and (held >= tuning.split_ticket_bytes or many_chunks)
            and items >= tuning.split_ticket_waves * record.compute_units * per_unit)


def _domain_resident(record: DeviceRecord, per_unit: int) -> int:
    """The programs one residency domain holds at once (an XCD on MI300X): the most chunks a
    ticketed row may have. A row's chunks wait on each other, and its last ones may be left to
    programs that only one domain has still to start, while that domain's units hold the row's
    first ones: the row must fit there."""
    return record.compute_units // max(record.residency_domains, 1) * per_unit


def _size(target: Target, config: KernelConfig, kernel: KernelResources, n_rows: int, rows_per_group: int,
          forced: Optional[int], backward: bool, note: str = "") -> Optional[LaunchPlan]:
    record = target.record
    tuning = target.tuning
    occupancy = target.occupancy(record, kernel)
    tiles = _tiles(config, n_rows, rows_per_group)
    items = tiles * config.chunks
    cap = min(record.grid_limit, tuning.max_programs)
    per_unit = min(occupancy, tuning.split_programs_per_unit)
    if config.ticketed:
        # A row's chunks wait on each other: they must be resident at once (not where they
        # exchange in two launches).
        if (not config.phased and _domain_resident(record, per_unit) < config.chunks) or items > cap:
            return None
        programs = items
        reason = (f"{note}split: rows of {config.chunks} chunks x {config.block_n}; a program per item, taken by "
                  f"ticket; {per_unit} programs/unit resident (occupancy {occupancy})")
    elif config.regime == "sliced":
        programs = min(items if forced is None else forced, cap)
        reason = (f"{note}sliced: rows of {config.chunks} slices, {config.block_m} rows x {config.block_n} a step; "
                  f"two launches (partials, then normalize), no program waits on another")
    elif config.regime == "split" and config.phased:
        # No program waits on another: any grid will do, as for the loop regime's.
        programs = min(items if forced is None else forced, cap)
        reason = f"{note}split: rows of {config.chunks} chunks x {config.block_n}"
    elif config.regime == "split":
        if not record.cooperative_launch:
            # Every program waits on the others: safe only where the driver refuses a grid
            # that is not resident all at once.
            return None
        resident = record.compute_units * per_unit
        programs = min(items, resident)
        programs -= programs % config.chunks
        if programs < config.chunks:
            return None
        if forced is not None:
            if forced % config.chunks or forced > resident:
                raise ValueError(
                    f"PORTABLE_SOFTMAX_PROGRAMS={forced} is unsafe for the split-row path: it must be a multiple of "
                    f"{config.chunks} (chunks per row) and at most {resident} (programs resident at once)")
            programs = forced
        reason = (f"{note}split: rows of {config.chunks} chunks x {config.block_n}; {per_unit} programs/unit resident "
                  f"(occupancy {occupancy}), grid a multiple of {config.chunks}")
    else:
        # Twice-read tiles always: torch.compile's backward runs them so, a program per row.
        per_tile = config.regime == "tile" and (
            occupancy >= tuning.tile_loop_occupancy[_direction(backward)] or config.reread)
        waves = tiles if per_tile else max(1, record.compute_units * max(occupancy, 1) * tuning.tile_waves)
        programs = min(tiles, waves, cap)
        if forced is not None:
            programs = min(forced, cap)
        shape = f"{config.block_m} rows x {config.block_n}" if config.regime == "tile" else f"chunks of {config.block_n}"
        reason = f"{note}{config.regime}: {shape}; {occupancy} programs/unit over {record.compute_units} units"
        if per_tile:
            reason += "; a program per tile"
        if config.reread:
            reason += "; inputs read twice"
        if config.dense:
            reason += "; dense (int32 offsets, no masks)"
    programs = max(1, programs)
    rows_per_program = _cdiv(n_rows, max(1, programs // config.chunks))
    if config.regime == "split" and config.num_stages > 1:
        reason += f"; pipelined, {config.num_stages} stages"
    if config.phased:
        reason += "; exchanged in two launches (partials published, then read), no program waits on another"
    if config.align > 1:
        reason += f"; rows read in aligned windows of {config.align}"
    return LaunchPlan(record.backend, config.regime, config.block_m, config.block_n, config.chunks, config.num_warps,
                      config.num_stages, programs, occupancy, tiles, items, rows_per_program, reason, config.align,
                      config.ticketed, config.reread, config.per_tile, config.dense, config.phased)


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
