"""The planner's records and what the planning of every regime shares: the target handed to it
(``Target``), a compiled kernel's compile-time choices (``KernelConfig``) and a complete launch
(``LaunchPlan``); the arithmetic of tiles, chunks and warps; a resource estimate for planning
without a compiler (``estimate_resources``); and the grid of a configuration in any regime, with
why (``_size``). Pure, as ``planner`` (the entry) is: no torch, no driver calls, no globals.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional, Union

from portable_softmax.record import DeviceRecord, KernelResources
from portable_softmax.tuning import Tuning

# The widest vector load.
VECTOR_BYTES = 16


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
    # The split kernels' exchange by arrival (``variants.launch_phases``: the loss's forward that
    # writes no gradient): one launch in which no program waits; each chunk publishes and counts,
    # and its row's last reads them all (``kernels.exchange._arrive``).
    arrival: bool = False
    # The tile kernels' DENSE=2 (``variants.dense_level``): one group, int32 offsets, masks kept,
    # for tiles that cannot be dense (``planner.flat_form``).
    flat: bool = False
    # The loss's split forward's WHOLE (``variants.loss_constexprs``): a persistent program whose
    # chunk lies inside every row it takes runs them through a loop with no column mask
    # (``kernels/loss_split.py``; ``loss_planner``: rows of up to ``Tuning.loss_whole_chunks``).
    whole: bool = False

    @property
    def chunks_p2(self) -> int:
        return next_power_of_2(self.chunks)

    @property
    def whole_loop(self) -> bool:
        """The loss's split kernel's WHOLE: ``whole`` where a program holds one chunk of every row
        it takes (a persistent grid, not one by ticket) and its rows need no windows."""
        return self.whole and self.align == 1 and not self.ticketed


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
    arrival: bool = False
    flat: bool = False
    whole: bool = False

    @property
    def config(self) -> KernelConfig:
        return KernelConfig(self.regime, self.block_m, self.block_n, self.chunks, self.num_warps, self.num_stages,
                            self.align, self.ticketed, self.reread, self.per_tile, self.dense, self.phased,
                            self.arrival, self.flat, self.whole)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


ResourceSource = Union[KernelResources, Callable[[KernelConfig], KernelResources], None]


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


def _row_limit(tuning: Tuning, dtype: str, backward: bool) -> int:
    """The most elements of a row (or of a strided tile) one program holds whole."""
    return tuning.row_elements // (2 if backward else 1) // (2 if dtype == "float64" else 1)


def _resources(source: ResourceSource, target: Target, config: KernelConfig, backward: bool,
               input_bytes: int) -> KernelResources:
    record = target.record
    if source is None:
        return estimate_resources(record, config, backward, input_bytes)
    if isinstance(source, KernelResources):
        return source
    return source(config)


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
    elif config.regime == "split" and config.arrival:
        # No program waits on another: a program per item (up to the grid's limit, beyond which
        # programs step through the rest), resident or not, in one launch.
        programs = min(items if forced is None else forced, cap)
        reason = (f"{note}split: rows of {config.chunks} chunks x {config.block_n}; a program per item, exchanged by "
                  f"arrival (the row's last chunk reads its partials and writes its terms), no program waits on "
                  f"another")
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
        if config.flat:
            reason += "; flat (one group, int32 offsets, masked)"
    programs = max(1, programs)
    rows_per_program = _cdiv(n_rows, max(1, programs // config.chunks))
    if config.regime == "split" and config.num_stages > 1:
        reason += f"; pipelined, {config.num_stages} stages"
    if config.phased:
        reason += "; exchanged in two launches (partials published, then read), no program waits on another"
    if config.align > 1:
        reason += f"; rows read in aligned windows of {config.align}"
    if config.whole_loop:
        reason += "; chunks inside every row a program takes through a loop without column masks"
    return LaunchPlan(record.backend, config.regime, config.block_m, config.block_n, config.chunks, config.num_warps,
                      config.num_stages, programs, occupancy, tiles, items, rows_per_program, reason, config.align,
                      config.ticketed, config.reread, config.per_tile, config.dense, config.phased, config.arrival,
                      config.flat, config.whole)
