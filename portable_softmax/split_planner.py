"""Split rows: a long row, or too few rows to fill the chip, cut into chunks held by co-resident
programs (the ``split`` regime, ``planner``'s docstring says when). Whether the path is open
(``_can_split``) and whether its programs exchange in two launches (``_phased``); a row's chunks,
block, warps, pipeline and windows (``split_config``); the register caps to compile it under
(``split_fit``); and its grid, persistent or a program per item taken by ticket (``plan_split``,
``ticketed_forms``, ``_ticket_fits``). For ``planner`` and ``loss_planner``; the split tiles of
strided rows are ``strided_planner``'s.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from portable_softmax.plan_grid import (KernelConfig, LaunchPlan, ResourceSource, Target, _cdiv, _direction,
                                        _domain_resident, _resources, _size, _tiles, _warps, next_power_of_2)
from portable_softmax.record import DeviceRecord, KernelResources
from portable_softmax.tuning import Tuning

MAX_SPLIT_CHUNKS = 1024
# Rows of this many elements or more never split (``_can_split``).
SPLIT_COLS_LIMIT = 2**31


def _can_split(target: Target, dtype: str, allow_split: bool, n_cols: int, arrival: bool = False) -> bool:
    """Whether the split path is open: its programs wait on each other where the record promises
    residency, else exchange in two launches where the tuning row asks (``_phased``); an
    exchange by ``arrival`` (``KernelConfig.arrival``: no program waits) is open on every
    backend. Rows of
    SPLIT_COLS_LIMIT elements or more stream through the loop regime, whose column offsets come
    from a 64-bit loop counter (Triton passes such a length as i64): the split kernels count a
    chunk's columns in 32 bits, and no tile holds such a row."""
    opened = arrival or target.record.residency_guaranteed or target.tuning.split_two_launches
    return allow_split and opened and dtype != "float64" and n_cols < SPLIT_COLS_LIMIT


def _phased(target: Target) -> bool:
    """Whether split configs for ``target`` exchange in two launches: its programs cannot wait
    on each other."""
    return not target.record.residency_guaranteed


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
    ``align``, where it is split too, even where it needs a chunk more (rows up to ``align - 1``
    short of a whole chunk: 49151, 28671) or wider ones: ``plain`` reads such rows an element an
    instruction, at about half the speed (H200, bf16 forward + backward of 4096x49151: 0.393 ms
    unwindowed in 12 chunks, where 4096x50257 through windows in 13 takes 0.255; NOTES v51)."""
    if windowed.regime != "split":
        return plain
    # Windowed rows run unpipelined: the pipeline's buffers cost them more programs than it buys.
    return dataclasses.replace(windowed, align=align, num_stages=1)


def _split_config(target: Target, tuning: Tuning, n_rows: int, n_cols: int, backward: bool,
                  per_thread: Optional[int] = None, halve_to: int = 0) -> KernelConfig:
    """A row's chunks, block, warps and pipeline; the padding rule halves chunks down to
    ``split_min_chunk``, or ``halve_to`` where wider (rows read through windows,
    ``Tuning.window_min_chunk``)."""
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
    while (block_n // 2 >= max(tuning.split_min_chunk, halve_to) and _cdiv(n_cols, block_n // 2) <= MAX_SPLIT_CHUNKS
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
