"""Rows that lie side by side in memory, reduced along a strided dimension (a softmax over C of an
NCHW tensor, over a transposed input's rows): tiles of adjacent rows, held whole, split into
chunks, cut into slices streamed in two launches (the ``sliced`` regime) or streamed twice
(``_strided_config``, which ``planner.select_config`` asks for ``strided`` calls).
"""
from __future__ import annotations

from typing import Optional

from portable_softmax.plan_grid import (VECTOR_BYTES, KernelConfig, Target, _cdiv, _direction, _row_limit, _warps,
                                        next_power_of_2)
from portable_softmax.split_planner import MAX_SPLIT_CHUNKS, _can_split, _phased

# A sliced row's normalize phase reads the partials of all its slices at once, [rows, slices].
MAX_SLICES = 64


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
