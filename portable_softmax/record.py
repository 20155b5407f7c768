"""The normalized device record, the resource use of a compiled kernel and the tuning row: the
planner's inputs, as data."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass(frozen=True)
class DeviceRecord:
    """One device, in the same terms whatever its vendor.

    Built only by a backend's ``normalize`` from the driver's raw property dictionary; fields the
    driver does not report are ``None`` rather than guesses.

    Attributes:
        backend: registry name of the backend serving the device (``cuda``, ``hip``, ``npu``,
            ``interpreter`` or a plugin's name).
        name: human-readable device name.
        arch: architecture string (``sm_90``, ``gfx942``, ``Ascend910B3``, ``cpu``).
        warp_size: threads per warp / wavefront; 0 where the notion does not apply (Ascend).
        compute_units: SMs, CUs, or Ascend vector cores: the units persistent programs fill.
        registers_per_unit: 32-bit registers per unit, as the occupancy rule counts them.
        shared_memory_per_unit: bytes of shared memory / LDS per unit (the unified buffer on Ascend).
        max_threads_per_unit: resident-thread limit per unit.
        max_programs_per_unit: resident-program (thread block) limit per unit.
        grid_limit: the most programs one launch may have along axis 0.
        supports_fp64: whether kernels may compute in float64 there.
        supports_bf16: whether bfloat16 tensors are supported there.
        residency_guaranteed: whether a grid sized from occupancy is resident all at once, so
            programs may wait on each other (the split-row path).
        cooperative_launch: whether a launch can ask the driver to refuse a grid that is not
            resident all at once. A persistent split grid, whose programs all wait on each other,
            is planned only where it can; ticketed split rows, which need only one row's chunks
            resident, do without. False unless the device says so (and, for a live device, the
            backend's launcher and Triton can pass the request on: ``device.py``).
        residency_domains: the parts of the chip that each run only the programs dealt to them,
            with their own units (MI300X: 8 XCDs, programs dealt round-robin). Programs that
            wait on each other without a cooperative launch must fit one domain's units.
        l2_cache_bytes: the last-level cache that every unit shares, in bytes (the H100's 50 MiB
            L2); None where the backend does not report one as such (plans then do without).
        dependent_launch: whether a kernel may be launched to start while the one before it in
            the stream still runs, waiting in the kernel for that one's results (NVIDIA's
            programmatic dependent launch, sm_90 on: ``kernels/dependency.py``). False unless the
            device says so (and, for a live device, Triton passes the request on: ``device.py``).
    """

    backend: str
    name: str
    arch: str
    warp_size: int
    compute_units: int
    registers_per_unit: Optional[int]
    shared_memory_per_unit: Optional[int]
    max_threads_per_unit: Optional[int]
    max_programs_per_unit: Optional[int]
    grid_limit: int
    supports_fp64: bool
    supports_bf16: bool
    residency_guaranteed: bool
    # Defaults, so that records built by plugins before these fields existed stay valid: no
    # cooperative launch (so no persistent split grid), and the chip as one residency domain.
    cooperative_launch: bool = False
    residency_domains: int = 1
    l2_cache_bytes: Optional[int] = None
    dependent_launch: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class KernelResources:
    """What one program of a compiled kernel occupies on its unit.

    ``registers`` is per thread and ``shared_memory`` in bytes; 0 means "not reported" (Ascend
    kernels report no registers; the interpreter reports nothing). On AMD, ``registers`` is the
    code object's ``.vgpr_count``: architectural and accumulation VGPRs together where the file is
    unified (gfx90a, gfx94x, gfx950), as the HIP runtime counts them. ``sgprs`` is the scalar
    registers per wave, read from AMD code objects only (0 elsewhere: the rule ignores it).
    """

    registers: int
    shared_memory: int
    num_warps: int
    spills: int = 0
    sgprs: int = 0


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
            them: local memory / 4) a register cap may cost (also for ``tile_fit_bytes``).
        tile_fit_bytes: as ``split_fit_bytes``, for tiles held whole (``planner.tile_fill``):
            input bytes per unit wanted in flight from tiles where the compiled kernel holds
            fewer; 0 turns it off.
        split_min_cols: shortest row worth splitting when there are too few rows to fill the chip.
        split_fill_per_unit: when rows are few, chunks are narrowed (down to split_min_chunk) until
            there are this many programs per unit: few-row shapes are latency-bound.
        split_min_chunk: the narrowest chunk.
        split_max_padding: the largest share of a row's chunks that may be padding past its end;
            above it chunks are halved (down to split_min_chunk), so that fewer programs idle.
        window_max_padding: by the bytes of an element, ``split_max_padding`` for rows read
            through windows where the window (up to ALIGN - 1 columns wider) needs more chunks
            than the row alone (``planner.select_config``); absent: ``split_max_padding``. Float32
            rows a few columns short of whole chunks keep their chunks of 4096 rather than halve
            them (NOTES v51, H200, the softmax: 8192x28671 forward 0.91 -> 0.96 of copy,
            16384x16383 backward 0.83 -> 0.98); bf16 rows lose by it.
        window_min_chunk: the narrowest chunk the padding rule halves a row read through windows
            to (the few-rows narrowing keeps ``split_min_chunk``); 0: ``split_min_chunk``.
            Chunks of 1024 at one warp read bf16 16384x16383 at 0.61 of copy forward, of 2048
            0.81 (NOTES v51, H200).
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
        loop_chunk: chunk width of the streaming (two-read) path, the loss's too.
        loss_alone_chunk: block width of the cross-entropy forward alone where it streams (no
            gradient written: one pass, each block reduced within its threads in lane rows of
            up to 2048, ``kernels.loss._lane_columns``, so a wider block costs no shuffle); 0:
            ``loop_chunk``. The streamed passes that write a gradient hold their block's
            elements in registers and keep ``loop_chunk``.
        loss_loop_warps: warps of a streamed cross-entropy program; 0: from
            ``elements_per_thread`` (8 for 4096-element chunks of 32-lane warps).
        loss_loop_fit: by the bytes a column reads (the logits' element), the programs a unit
            the forward alone's streamed cross-entropy program is capped to fit (a register cap,
            where the backend has one: more warps resident to hide the stream's latency), most
            first down to what it holds uncapped; none where absent.
        loss_alone_row_waves: the forward alone's streamed grid takes a program a row (the
            hardware hands rows to programs as they finish) where its rows fill at least this
            many waves of resident programs; below, and at 0, the ``tile_waves`` grid, each
            program stepping through its rows.
        loss_l2_share: the share of the device's L2 (``DeviceRecord.l2_cache_bytes``) that the
            rows of a cross-entropy forward which streams each row twice (loss, then gradient,
            in the same program) may hold at once: its grid is cut to that many rows' programs
            (where that is at least one a unit), so that the second pass reads L2 rather than
            memory. 0 turns it off (the loop grid of ``tile_waves``), the default: on the H100
            (2026-11-25, ``benchmarks/loss_sweep.py``) the cut grid of bf16 rows of 128256 (153
            programs) read 0.42 of the floor forward + backward against 0.62 with the full grid,
            too few bytes in flight for the L2 hits to pay.
        loss_split: the cross-entropy forwards of class targets whose rows are longer than a
            tile that take the split regime where it is open (``split_planner._can_split``; the loss's
            ``cross_entropy_forward_split``): "gradient", the forward that writes the gradient
            (one read and one write where the loop regime streams each row twice), and "loss",
            the forward alone (one read either way: the split regime's chunks are read at once,
            aligned through windows, where a streamed program has one chunk in flight). The
            others stream through the loop regime. Both by default, from a prediction (NOTES
            v26): the H100 ran the loop at 0.44-0.74 of the floor forward + backward and 0.51-0.84
            forward alone in bf16.
        loss_arrival: whether the split forward alone (the "loss" of ``loss_split``: no gradient
            written, nothing held across the exchange) exchanges by arrival
            (``plan_grid.KernelConfig.arrival``, ``kernels.exchange._arrive``): one launch of a
            program per chunk, none waiting; the row's last chunk to arrive reads its partials
            and writes its terms. Open on every backend, residency or not. Off: the waiting
            exchange where residency is promised (a persistent or ticketed grid), two launches
            where ``split_two_launches`` opens it. On by default, from a prediction (NOTES v30:
            the waiting forward alone read 0.49-0.65 of the copy floor in bf16 on the H200,
            0.65-0.90 on the H100); ``benchmarks/loss_sweep.py``'s ``no-arrival`` compares them.
        loss_split_elements_per_thread: as ``split_elements_per_thread``, for the loss's split
            chunks (their warps); 0: the softmax's. A chunk that writes the gradient holds its
            exponentials across the exchange, as the softmax forward's does (sm_90, bf16 chunks
            of 8192 by ticket: 107 registers at 4 warps, 52 at 8; pipelined 127 and 80, the
            softmax's 128 at 4), and the softmax's 4 warps read higher than 8 (NOTES v11, H200);
            ``benchmarks/loss_sweep.py`` tries both.
        loss_gradient_pipelined: whether the loss's split forward that writes the gradient is
            pipelined where ``split_pipelined`` holds "forward" (NOTES v31, H200: bf16 0.59-0.67
            -> 0.65-0.78 of the floor forward + backward); the Triton in use must build it
            (``compat.LOSS_GRADIENT_PIPELINES``).
        loss_gradient_programs_per_unit: the most programs a unit that the register cap fitted to
            the loss's pipelined split forward that writes the gradient asks for (``split_fit``);
            0: as many as ``split_fit_bytes`` asks. On the H200 (NOTES v31, bf16 rows of 16
            chunks, 3 stages) 4 a unit read 0.77-0.78 of the floor forward + backward and 5 (a
            cap of 102 registers) 0.68-0.69. Only where the kernel runs the whole loop
            (``loss_whole_chunks``): the rows of more chunks that leave it out want the fifth.
        loss_whole_chunks: the most chunks a row may hold for the loss's split forward that writes
            the gradient to run its whole chunks through a second loop, with no column mask
            (``plan_grid.KernelConfig.whole``); 0: every row. That loop's registers are the
            kernel's beside the masked one's: on sm_90 (Triton 3.6, bf16 chunks of 8192, 4 warps,
            3 stages) a cap of 96 registers, 5 programs an SM, spills 12 words a thread with it
            and 2 without. Rows of many chunks wait on their peers and want the fifth program
            more than the loop (NOTES v47, H200: bf16 4096x256000, 32 chunks, 1.24 -> 1.16 ms
            forward + backward), rows of 16 the loop at 4 (8192x128256 1.11 ms against 1.20).
        loss_window_chunk: the widest chunk of the loss's split forward that writes the gradient
            of rows read through aligned windows (off 16-byte boundaries); 0: ``split_chunk``.
            Such rows run unpipelined (``split_planner``), where more, narrower programs an SM
            hold more in flight (NOTES v48, H200, bf16 forward + backward: 8192x32001 in chunks
            of 8192 at 3 programs an SM 0.60 of the floor, of 4096 at 10 an SM 0.73; 4096x50257
            of 8192 at 4 an SM 0.64, of 4096 at 10 0.71).
        loss_max_padding: ``split_max_padding`` for the loss's split forward that writes the
            gradient; 0: ``split_max_padding``. A row's items cost alike however full (NOTES v48):
            aligned rows' chunks of 8192 at 4 programs a unit, pipelined, lead the halved chunks
            of 4096 at 6 where the last pads 12% (NOTES v49, H200, bf16 forward + backward:
            4096x50304 0.79 -> 0.82 of the floor, 8192x50304 0.82 -> 0.84, 4096x57600 0.78 ->
            0.83; float32 level), and windowed rows' 8 chunks of 4096 lead 15 of 2048 where the
            window's last holds a few columns (NOTES v51, graph-timed: 8192x28671 0.402 -> 0.293
            ms, 8192x32767 0.379 -> 0.332; float32 0.494 -> 0.484, 0.573 -> 0.561).
        max_programs: cap on the persistent grid (the interpreter gains nothing from more).
        split_windows: the directions ("forward", "backward") whose split path reads rows off
            16-byte boundaries through aligned windows (``kernels/windows.py``) rather than one element
            per instruction.
        tile_windows: per (direction, bytes a column reads, as ``reread_cols``), the shortest
            rows whose tiles of one row read them, where they lie off 16-byte boundaries, through
            aligned windows (``kernels/tile_windows.py``) rather than one element per instruction
            (float32 accumulation, not causal); off where absent.
        window_tile_elements_per_thread: sets num_warps for such a tile (held or read twice);
            0: the tile's own.
        window_split_cols: per (direction, bytes a column reads, as ``reread_cols``), the
            shortest rows off 16-byte boundaries that split through windows where they would take
            a tile; absent: ``split_min_cols``.
        split_tickets: the directions whose split path may give each item a program that takes
            it by ticket (``kernels.split._split_items``) instead of running a persistent grid: the
            hardware then starts a program wherever one ends, rather than a fixed group of
            programs stepping through rows together. Taken where the resident programs hold
            ``split_ticket_bytes`` of input per unit or more and the items fill
            ``split_ticket_waves`` resident grids.
        ticket_chunk: per (direction, bytes a column reads, as ``reread_cols``), the widest
            chunk of a ticketed split grid of one-row items, where narrower than the planned one
            (``split_planner.ticketed_forms``): more, shorter programs, each started wherever one ends.
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
        flat_tiles: directions in which tiles that cannot be dense (rows shorter than the block,
            or too few to fill the last tile) still drop the group division and the 64-bit
            offsets where the call has one group and int32 offsets (``planner.flat_form``):
            the masks stay. An sm_90 backward tile of 781-wide rows waited on an integer
            division (I2F, MUFU.RCP, F2I: ~25 dependent instructions) before its first load
            (NOTES v33).
        max_program_threads: the most threads a program may have.
        strided_rows: for a reduction along a strided dimension whose rows lie side by side
            in memory (a column softmax, channels of NCHW, a transposed input): the adjacent rows
            a tile spans, by the bytes of an input element, so that its loads read whole sectors
            of the contiguous dimension rather than one element per transaction (the H100 sweep
            of NOTES v15: 32 float32 rows (a 128-byte line), 16 bfloat16 rows).
        strided_split_elements: the elements a split program holds for such tiles (forward;
            halved backward): the tile's rows times its chunk of the reduced dimension. Chunks
            wide enough that reading the exchange slots of all their rows' chunks costs little.
        strided_split_rows: by (direction, bytes of an input element), the most adjacent rows a
            split tile spans instead of ``strided_rows``: doubled while each program is left at
            most ``strided_split_slots`` exchange slots to read (tile rows x chunks). Wider
            pieces of each line per load where the tile has few chunks, whose slots grow with
            the rows.
        strided_split_slots: see ``strided_split_rows``.
        strided_ticket_chunks: split tiles of several rows with at least this many chunks take
            their items by ticket (``split_planner._ticket_fits``) whatever they hold per unit (0:
            none). A persistent program waits on its tile's peers before its next item; a
            program per item leaves the unit to the next while its peers arrive.
        strided_slices: by (direction, bytes of an input element), the shortest reduced length
            of a reduction along a strided dimension that is cut into slices (the ``sliced``
            regime: two launches, the slices' partials then their normalization, no program
            waiting on another) rather than held in split tiles where the split path is open.
            Where it is closed (no residency, float64) long strided rows are always sliced when
            their tiles are too few to fill the chip; a loop program per tile otherwise.
        slice_elements: the reduced elements a slice holds (a program streams), at most
            ``MAX_SLICES`` slices a row; a slice's program reads ``slice_tile_elements`` at a step
            (128 bytes of adjacent rows by the rest), with ``split_elements_per_thread`` each.
        slice_programs_per_unit: slices are cut until the programs fill this many per unit.
        split_wait_atomic: the split kernels re-read their peers' exchange slots in the wait loop
            with a relaxed atomic that adds 0 (kernels ``_read_slots``) rather than a volatile
            load. Only the atomic is kept inside the loop on every target (AMD's volatile loads
            are hoisted out of it); the compile report checks that every wait loop reads memory.
        enable_min_bytes: under ``enable()`` (``enable.py``), calls whose input (forward) or
            output (backward) holds fewer bytes keep torch's own kernel: there the package's host
            cost per call outweighs its kernel's gain. Measured on an H100 (2026-11-25,
            ``benchmarks/enable_bench.py``, rows of 4096): served calls are at least as fast as
            torch's from 16 MiB (bf16 forward and backward, float32 backward; float32 forward
            level there: 16.7 against 16.0 us) and twice as fast from 64 MiB; below, torch's
            7-10 us forward against the served 17-24.
        split_two_launches: where the record promises no residency (a program may not wait on
            another), whether the split path is open all the same, its exchange in two launches
            of the same kernels (``plan_grid.KernelConfig.phased``): every chunk's partials
            published, then every chunk written from its rows' partials. Each chunk is read
            twice, as the loop regime reads it; off in every backend's own row. The tests open it
            on the interpreter, so that every split variant's numerics are checked on CPU.
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
    tile_fit_bytes: int = 0
    split_min_cols: int = 8192
    split_fill_per_unit: int = 2
    split_min_chunk: int = 1024
    split_max_padding: float = 0.1
    window_max_padding: Mapping[int, float] = field(default_factory=dict)
    window_min_chunk: int = 0
    tile_waves: int = 4
    tile_loop_occupancy: Mapping[str, int] = field(default_factory=lambda: both_directions(4))
    tile_wave_fill: float = 0.0
    loop_chunk: int = 4096
    loss_alone_chunk: int = 0
    loss_loop_warps: int = 0
    loss_loop_fit: Mapping[int, int] = field(default_factory=dict)
    loss_alone_row_waves: int = 0
    loss_l2_share: float = 0.0
    loss_split: frozenset[str] = frozenset({"gradient", "loss"})
    loss_arrival: bool = True
    loss_split_elements_per_thread: int = 0
    loss_gradient_pipelined: bool = True
    loss_gradient_programs_per_unit: int = 0
    loss_whole_chunks: int = 0
    loss_window_chunk: int = 0
    loss_max_padding: float = 0.0
    max_programs: int = 2**31 - 1
    split_windows: frozenset[str] = frozenset({"forward", "backward"})
    tile_windows: Mapping[tuple[str, int], int] = field(default_factory=dict)
    window_tile_elements_per_thread: int = 0
    window_split_cols: Mapping[tuple[str, int], int] = field(default_factory=dict)
    split_tickets: frozenset[str] = frozenset({"forward", "backward"})
    split_ticket_bytes: int = 131072
    split_ticket_waves: int = 2
    ticket_chunk: Mapping[tuple[str, int], int] = field(default_factory=dict)
    split_pipelined: frozenset[str] = frozenset()
    split_stages: int = 3
    split_pipeline_items: int = 2
    reread_cols: Mapping[tuple[str, int], frozenset[int]] = field(default_factory=dict)
    reread_elements_per_thread: int = 8
    dense_tiles: frozenset[str] = frozenset()
    flat_tiles: frozenset[str] = frozenset()
    max_program_threads: int = 1024
    split_wait_atomic: bool = True
    split_two_launches: bool = False
    strided_rows: Mapping[int, int] = field(default_factory=lambda: {2: 16, 4: 32, 8: 16})
    strided_split_elements: int = 16384
    strided_split_rows: Mapping[tuple[str, int], int] = field(default_factory=dict)
    strided_split_slots: int = 0
    strided_ticket_chunks: int = 0
    strided_slices: Mapping[tuple[str, int], int] = field(default_factory=dict)
    slice_elements: int = 1024
    slice_tile_elements: int = 8192
    slice_programs_per_unit: int = 4
    enable_min_bytes: int = 16 * 2**20
