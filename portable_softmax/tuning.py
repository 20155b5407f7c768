"""Tuning tables: the per-target numbers the planner reads, kept as data.

Keys are ``(backend, arch)`` with ``arch = "*"`` as the backend's default. The defaults were chosen
from the H200 sweep recorded in ``benchmarks/NOTES.md`` (4-warp split chunks, a tile grid of up to 4
resident waves); a new target gets its backend's defaults until someone measures it.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from portable_softmax.backend import registered_backends
from portable_softmax.record import DeviceRecord


def both_directions(value: int) -> dict[str, int]:
    """A per-direction setting with one value for "forward" and "backward"."""
    return {"forward": value, "backward": value}


@dataclass(frozen=True)
class Tuning:
    """Attributes:
        tile_elements: elements a program holds per tile when rows are short (rows are packed
            into one tile until it holds this many).
        row_elements: the longest row one program holds whole in registers (forward); backward
            holds two tensors, so half of it.
        elements_per_thread: sets num_warps for a tile: tile elements / (this x warp size).
        max_warps: upper bound on num_warps.
        split_chunk: the widest chunk a program holds in the split-row path (forward; halved
            for backward).
        split_elements_per_thread: as elements_per_thread, for split chunks.
        split_programs_per_unit: cap on resident programs per unit in the split-row path.
        split_fit_bytes: input bytes per unit that the split path wants in flight (programs per
            unit x bytes of a chunk). While one program waits on its peers the others keep
            memory busy, so where the compiled kernel holds too few programs for this, the
            backend's ``fit_options`` (a register cap) are asked for enough, or for as many as a
            cap allows without spilling more than ``split_fit_max_spills``; 0 turns that off.
        split_fit_max_spills: the most spilled 32-bit words per thread (as Triton reports
            them: local memory / 4) a register cap may cost.
        split_min_cols: shortest row worth splitting when there are too few rows to fill the chip.
        split_fill_per_unit: when rows are few, chunks are narrowed (down to split_min_chunk) until
            there are this many programs per unit: few-row shapes are latency-bound.
        split_min_chunk: the narrowest chunk.
        split_max_padding: the largest share of a row's chunks that may be padding past its end;
            above it chunks are halved (down to split_min_chunk), so that fewer programs idle.
        tile_waves: the tile and loop grids hold at most this many times the resident programs
            (1 = strictly persistent).
        tile_loop_occupancy: per direction ("forward", "backward"): tile kernels that fit
            fewer programs per unit than this loop over tiles on the ``tile_waves`` grid; at or
            above it the grid has a program per tile, and the hardware starts a new one as each
            ends, overlapping one's loads with another's reduction. Twice-read tiles always get
            a program per tile.
        tile_wave_fill: a grid of a program per tile whose last wave of resident programs is
            filled less than this (tiles / (waves x resident)) looks for one that fills it
            better: a register cap that makes room for every tile at once, or tiles of 2 or 4
            times the rows with such a cap. Short rows end in one or two waves, and a second
            wave a third full costs as much as a full one. 0 turns it off.
        loop_chunk: chunk width of the streaming (two-read) path.
        max_programs: cap on the persistent grid (the interpreter gains nothing from more).
        split_windows: the directions ("forward", "backward") whose split path reads rows off
            16-byte boundaries through aligned windows (``kernels.py``) rather than one element
            per instruction.
        split_tickets: the directions whose split path may give each item a program that takes
            it by ticket (``kernels._split_items``) instead of running a persistent grid: the
            hardware then starts a program wherever one ends, rather than a fixed group of
            programs stepping through rows together. Taken where the resident programs hold
            ``split_ticket_bytes`` of input per unit or more and the items fill
            ``split_ticket_waves`` resident grids.
        split_pipelined: the directions whose persistent split grids are software-pipelined:
            each program copies its next items' chunks into ``split_stages`` - 1 shared-memory
            buffers while it waits on its current row's peers, so that memory stays busy without
            more registers. Only rows read whole (not through aligned windows), and only where
            each program takes ``split_pipeline_items`` items or more (a ticketed program has
            one: nothing to pipeline).
        split_stages: the pipeline depth (Triton's ``num_stages``) there; 3 keeps one chunk
            in flight during a wait (the other buffer holds the chunk being used).
        split_pipeline_items: the fewest items per program, on average, that a pipelined grid
            takes; below it (few-row shapes) the pipeline's buffers only cost occupancy.
        reread_cols: per (direction, bytes a column reads: x's element size forward, y's plus
            dy's backward), the power-of-two row widths that a program reads twice where there
            are rows enough to fill the chip: y and dy (x forward) for the row's sum, then again
            (from L2) for the output, as torch.compile's backward does, rather than holding them
            across the sum or splitting the row. The forward computes its exponentials twice.
            Off where absent.
        reread_elements_per_thread: sets num_warps there, up to ``max_program_threads``.
        dense_tiles: directions in which held tiles, not only twice-read ones, take the kernels'
            ``DENSE`` form (``planner.dense_form``) where the call allows it.
        max_program_threads: the most threads a program may have.
        split_wait_atomic: the split kernels re-read their peers' exchange slots in the wait loop
            with a relaxed atomic that adds 0 (kernels ``_read_slots``) rather than a volatile
            load. Only the atomic is kept inside the loop on every target (AMD's volatile loads
            are hoisted out of it); the compile report checks that every wait loop reads memory.
    """

    tile_elements: int = 1024
    row_elements: int = 16384
    elements_per_thread: int = 16
    max_warps: int = 16
    split_chunk: int = 8192
    split_elements_per_thread: int = 64
    split_programs_per_unit: int = 16
    split_fit_bytes: int = 98304
    split_fit_max_spills: int = 8
    split_min_cols: int = 8192
    split_fill_per_unit: int = 2
    split_min_chunk: int = 1024
    split_max_padding: float = 0.1
    tile_waves: int = 4
    tile_loop_occupancy: Mapping[str, int] = field(default_factory=lambda: both_directions(4))
    tile_wave_fill: float = 0.0
    loop_chunk: int = 4096
    max_programs: int = 2**31 - 1
    split_windows: frozenset[str] = frozenset({"forward", "backward"})
    split_tickets: frozenset[str] = frozenset({"forward", "backward"})
    split_ticket_bytes: int = 131072
    split_ticket_waves: int = 2
    split_pipelined: frozenset[str] = frozenset()
    split_stages: int = 3
    split_pipeline_items: int = 2
    reread_cols: Mapping[tuple[str, int], frozenset[int]] = field(default_factory=dict)
    reread_elements_per_thread: int = 8
    dense_tiles: frozenset[str] = frozenset()
    max_program_threads: int = 1024
    split_wait_atomic: bool = True


_DEFAULT = Tuning()

# A program per tile from 3 programs per unit forward and 2 backward, measured on the H200 only
# (NOTES v12): rows of 8192 gain 0.04-0.10 of copy in both dtypes and directions; the bf16 forward
# of 16384, 2 programs per unit, reads 0.90 per tile against 0.92 on the looping grid.
_CUDA_TILE_LOOP = {"forward": 3, "backward": 2}

# Rows read twice where a column reads 4 bytes, measured on the H200 only: of 16384 (NOTES v10),
# fp32 forward 0.90 -> 0.95 of copy, bf16 backward 0.99 -> 1.02 (fp16, the same bytes, not
# measured); in the kernels' dense form (NOTES v13), bf16 backward of 4096 1.02 -> 1.05 and of
# 32768 0.97 -> 1.03, where rows of 8192 read 1.01 against 1.02-1.03 held. Elsewhere twice-read
# tiles were level or lower: bf16 forward (twice the exponentials) 0.69-0.84, fp32 backward of
# 16384-32768 0.87-0.96.
_CUDA_REREAD = {("forward", 4): frozenset({16384}), ("backward", 4): frozenset({4096, 16384, 32768})}

# Held tiles in the kernels' dense form too, measured on the H200 only (NOTES v13, three passes):
# rows of 128-256 gain 0.02-0.08 of copy (bf16 32768x128 backward 1.01-1.07 -> 1.10-1.17, fp32
# 32768x128 forward 0.93-0.95 -> 0.99-1.04); rows of 1024-16384 level.
_CUDA_DENSE = frozenset({"forward", "backward"})

# CUDA's split wait re-reads its slots with a volatile load: ptxas keeps ``ld.volatile`` in the
# loop (the compile report checks the SASS), where a relaxed atomic costs a shared-memory broadcast
# and a barrier per trip (Triton issues an atomic once per element and hands its result to the
# threads that replicate it) and, in the called wait of pipelined kernels, shared memory that
# overlaps the pipeline's buffers (NOTES v9).
_CUDA_WAIT_ATOMIC = False

class TuningTable(dict):
    """The tuning rows by ``(backend, arch)``: a dict that tells its observers of every change, so
    that what was planned from it (``launch``'s records) is planned again."""

    def __init__(self, rows: Mapping[tuple[str, str], Tuning]) -> None:
        super().__init__(rows)
        self._observers: list[Callable[[], None]] = []

    def on_change(self, observer: Callable[[], None]) -> None:
        self._observers.append(observer)

    def _changed(self) -> None:
        for observer in self._observers:
            observer()

    def __setitem__(self, key: tuple[str, str], value: Tuning) -> None:
        super().__setitem__(key, value)
        self._changed()

    def __delitem__(self, key: tuple[str, str]) -> None:
        super().__delitem__(key)
        self._changed()

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        self._changed()

    def pop(self, *args: Any) -> Any:
        found = super().pop(*args)
        self._changed()
        return found


TUNING = TuningTable({
    # Pipelined split grids measured on the H200 only (NOTES v9): the bf16 backward of long rows
    # gains up to 0.09 of copy, the forward 0.01-0.02; windowed rows and few rows lose.
    ("cuda", "*"): replace(_DEFAULT, split_pipelined=frozenset({"forward", "backward"}), reread_cols=_CUDA_REREAD,
                           tile_wave_fill=0.85, tile_loop_occupancy=_CUDA_TILE_LOOP, dense_tiles=_CUDA_DENSE,
                           split_wait_atomic=_CUDA_WAIT_ATOMIC),
    ("hip", "*"): _DEFAULT,
    # No residency on Ascend: long rows stream through the unified buffer in 8K chunks; one
    # program per vector core.
    ("npu", "*"): replace(_DEFAULT, tile_elements=8192, row_elements=8192, loop_chunk=8192, max_warps=1, tile_waves=1,
                          tile_loop_occupancy=both_directions(2**31 - 1)),
    # The interpreter runs one numpy operation per tile, so bigger tiles and few programs are fastest.
    ("interpreter", "*"): replace(_DEFAULT, tile_elements=65536, row_elements=65536, loop_chunk=16384,
                                  max_warps=1, max_programs=4, tile_waves=1),
})


def tuning_for(record: DeviceRecord) -> Tuning:
    """The row in force for ``record``: the table's for its architecture or its backend, else the
    backend's own rows (a plugin's ``Backend(tuning=...)``), else the defaults."""
    found = TUNING.get((record.backend, record.arch)) or TUNING.get((record.backend, "*"))
    if found is not None:
        return found
    own = getattr(registered_backends().get(record.backend), "tuning", None) or {}
    return own.get(record.arch) or own.get("*") or _DEFAULT
