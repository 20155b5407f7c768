"""Planning the cross-entropy kernels (``kernels/loss.py``, ``kernels/loss_split.py``) and the held
gradient's rescale: a pure function of the target and the problem, as ``planner``; its tiles and
loops are sized by ``plan_grid``, its split rows by ``split_planner``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from portable_softmax.plan_grid import (KernelConfig, LaunchPlan, ResourceSource, Target, _cdiv, _resources, _row_limit,
                                        _size, _warps, next_power_of_2)
from portable_softmax.planner import DTYPE_BYTES
from portable_softmax.record import KernelResources, Tuning
from portable_softmax.split_planner import _can_split, _no_split_note, plan_split, split_config


def _l2_fit(target: Target, plan: LaunchPlan, n_rows: int, row_bytes: int) -> LaunchPlan:
    """``plan`` with its grid cut so that the rows its programs stream at once (a row per program
    at a time) hold at most ``Tuning.loss_l2_share`` of the L2: each row's second pass (the
    gradient) then reads L2, not memory. Unchanged where the record has no L2 size, the share is
    0, the resident grid already fits, or a program a unit would not fit (rows that long are
    read from memory twice whatever the grid: fewer programs would only keep fewer bytes in
    flight)."""
    record = target.record
    share = target.tuning.loss_l2_share
    if not record.l2_cache_bytes or share <= 0:
        return plan
    budget = int(record.l2_cache_bytes * share)
    programs = budget // max(1, row_bytes * plan.block_m)
    resident = record.compute_units * max(plan.occupancy, 1)
    if programs < record.compute_units or programs >= min(plan.programs, resident):
        return plan
    return dataclasses.replace(
        plan, programs=programs, rows_per_program=_cdiv(n_rows, programs),
        reason=f"{plan.reason}; {programs} programs, so that their rows of {row_bytes} B, streamed twice, fit "
               f"{share:g} of the {record.l2_cache_bytes} B L2")


def _row_programs(target: Target, plan: LaunchPlan) -> LaunchPlan:
    """The forward alone's streamed ``plan`` with a program a row where its rows fill
    ``Tuning.loss_alone_row_waves`` waves of resident programs or more (one tile a row: the
    streamed plans' ``block_m`` is 1)."""
    waves = target.tuning.loss_alone_row_waves
    resident = target.record.compute_units * max(plan.occupancy, 1)
    programs = min(plan.tiles, target.record.grid_limit, target.tuning.max_programs)
    if not waves or plan.tiles < waves * resident or programs <= plan.programs:
        return plan
    return dataclasses.replace(plan, programs=programs, rows_per_program=_cdiv(plan.tiles * plan.block_m, programs),
                               reason=f"{plan.reason}; a program a row ({plan.tiles / resident:.1f} waves)")


def split_form(target: Target, n_rows: int, n_cols: int, align: int, arrival: bool, writes_gradient: bool,
               per_thread: Optional[int], column_loads: bool = False) -> KernelConfig:
    """The loss's split configuration as launched uncapped: the softmax forward's (``split_config``)
    by arrival (a program per item, unpipelined), or with the gradient unpipelined where the
    Triton in use does not build the pipelined form or the kernel loads a value a column beside
    the logits (``column_loads``: class weights under label smoothing, which the pipeline would
    stage too: bf16 8192x32000 on the H200, 1 program an SM and 0.870 ms forward + backward
    against 4 and 0.389 unpipelined, NOTES v53); with the gradient, its whole chunks through
    their own loop in rows of up to ``Tuning.loss_whole_chunks`` (``KernelConfig.whole``),
    rows read through windows in chunks of up to ``Tuning.loss_window_chunk``, and chunks halved
    only where their padding passes ``Tuning.loss_max_padding``."""
    tuning = target.tuning
    sizing: dict[str, Any] = {}
    if writes_gradient and not arrival:
        if align > 1 and 0 < tuning.loss_window_chunk < tuning.split_chunk:
            sizing["split_chunk"] = tuning.loss_window_chunk
        if tuning.loss_max_padding:
            sizing["split_max_padding"] = tuning.loss_max_padding
    if sizing:
        target = dataclasses.replace(target, tuning=dataclasses.replace(tuning, **sizing))
    config = split_config(target, n_rows, n_cols, align=align, per_thread=per_thread)
    limit = tuning.loss_whole_chunks
    whole = writes_gradient and not arrival and (not limit or config.chunks <= limit)
    config = dataclasses.replace(config, whole=whole)
    if arrival:
        return dataclasses.replace(config, arrival=True, phased=False, num_stages=1)
    if writes_gradient and (column_loads or not tuning.loss_gradient_pipelined):
        return dataclasses.replace(config, num_stages=1)
    return config


def split_elements_per_thread(tuning: Tuning, column_loads: bool, softcap: bool) -> Optional[int]:
    """The elements a thread holds in the loss's split form (None: the softmax's,
    ``Tuning.split_elements_per_thread``): ``Tuning.loss_split_elements_per_thread``, or half
    as many where the form loads class weights under smoothing (unpipelined, ``split_form``)
    and holds each element's tanh across the exchange beside its exponential (``softcap``):
    H200, fp32 8192x32000 with weights, smoothing and a softcap, 1.109 ms forward + backward at
    8 warps against 1.621 at 4 (bf16 0.829 against 1.063); without the softcap 4 warps win (bf16
    0.388 against 0.554), NOTES v53."""
    per_thread = tuning.loss_split_elements_per_thread or None
    if column_loads and softcap:
        per_thread = (per_thread or tuning.split_elements_per_thread) // 2
    return per_thread


def _unspilled(target: Target, n_rows: int, n_cols: int, align: int, arrival: bool, writes_gradient: bool,
               resources: ResourceSource, input_bytes: int, column_loads: bool,
               softcap: bool) -> tuple[Optional[int], KernelConfig]:
    """The elements a thread holds (None: the tuning's) and the split configuration: the tuning's,
    or, where the compiled kernel spills more than ``Tuning.split_fit_max_spills`` words a thread,
    half as many elements a thread (twice the warps) until it does not or the warps stop growing.
    The every-option forms hold more a thread than the softmax's chunks were sized for (Triton 3.2
    and 3.6, sm_90: bf16 rows of 50257 in chunks of 4096 at 2 warps, 255 registers and 84-98
    spilled words a thread; none under 3.9). Estimates spill nothing: only compiled resources
    (the tables' rows, a first launch's binary) move it."""
    tuning = target.tuning
    per_thread = split_elements_per_thread(tuning, column_loads, softcap)
    config = split_form(target, n_rows, n_cols, align, arrival, writes_gradient, per_thread, column_loads)
    if resources is None or isinstance(resources, KernelResources):
        return per_thread, config
    elements = per_thread or tuning.split_elements_per_thread
    while _resources(resources, target, config, False, input_bytes).spills > tuning.split_fit_max_spills:
        wider = split_form(target, n_rows, n_cols, align, arrival, writes_gradient, elements // 2, column_loads)
        if elements <= 1 or wider.num_warps <= config.num_warps:
            break
        elements, per_thread, config = elements // 2, elements // 2, wider
    return per_thread, config


def plan_loss(target: Target, n_rows: int, n_cols: int, dtype: str, *, writes_gradient: bool,
              rows_per_group: Optional[int] = None, resources: ResourceSource = None,
              input_bytes: Optional[int] = None, rereads: bool = False, splittable: bool = False,
              align: int = 1, column_loads: bool = False, softcap: bool = False) -> LaunchPlan:
    """Plan a cross-entropy kernel: ``tile`` where a tile of whole rows fits a program
    (``_row_limit``; where the gradient is formed from the same registers, rows half as long, as
    the softmax backward's); else for a ``splittable`` forward (class targets:
    ``cross_entropy_forward_split``) ``split`` where the split path is open (``_can_split``:
    residency, or the exchange in two launches; float32 accumulation) and the tuning's
    ``loss_split`` names the form; else ``loop`` (rows streamed in chunks of
    ``Tuning.loop_chunk``, the forward alone's of ``Tuning.loss_alone_chunk``, through the
    windows of ``align``; a forward that writes the gradient streams each row a second time,
    without windows).

    A split row is sized as the softmax forward's split row of the same length
    (``split_planner.split_config``: chunks, blocks, windows; ``split_planner.plan_split``: a persistent or
    ticketed grid, and the residency each needs), from the compiled kernel's resources: it
    reads the logits once and, with the gradient, writes it once, as the softmax forward reads x
    and writes y. Its warps may be its own (``Tuning.loss_split_elements_per_thread``); the one
    that writes the gradient is pipelined as the softmax's (the barrier before its target's
    column lies in a called function, which Triton's pipeliner does not look into) where the
    Triton in use builds it (``Tuning.loss_gradient_pipelined``). Where that grid cannot
    be resident (no cooperative launch for a persistent grid, a row's chunks beyond one
    residency domain) the row streams instead. The forward alone (no gradient: nothing held
    across the exchange) exchanges by arrival where ``Tuning.loss_arrival`` asks
    (``KernelConfig.arrival``): the same chunks, a program per item, unpipelined, one launch in
    which no program waits, open on every backend (no residency needed). Probability
    targets always stream (or take tiles): their loss needs the targets' sums over the row too,
    which the split kernel does not exchange. The backward kernel (``reduction='none'``)
    streams with the loop's blocks (one read, one write: nothing to hold); a row that fits is one
    chunk. Tiles and loops are sized as the softmax's are (``_size``).

    Args:
        target: the device's target.
        n_rows: positions (rows) in all groups; n_cols: the classes.
        dtype: the accumulation's dtype name (``float32`` or ``float64``).
        writes_gradient: the kernel writes the gradient (the forward with a held gradient, or the
            backward).
        rows_per_group: rows per group of the row view (defaults to ``n_rows``).
        resources: the compiled kernel's use, or a function from config to it; estimated if None.
        input_bytes: bytes a column reads (the logits', plus probability targets').
        rereads: a streamed program reads each row twice (the forward that writes the gradient):
            its grid is cut so that the rows in flight fit the L2 (``_l2_fit``).
        splittable: the forward of class targets, which has a split kernel.
        align: ``planner.window_align`` of the logits and the gradient (the logits' alone for
            the forward alone; 1 for probability targets): split rows, and the streamed rows of
            the forward alone and the backward, off 16-byte boundaries are read (and the
            backward's gradient written) through aligned windows (one row a tile, as the loop's
            is).
        column_loads: the kernel loads a value a column beside the logits (class weights under
            label smoothing): its split form that writes the gradient is unpipelined
            (``split_form``), and with ``softcap`` (each element's tanh held too) spread over
            twice the warps.

    Returns:
        The plan (regime ``tile``, ``split`` or ``loop``).
    """
    record = target.record
    tuning = target.tuning
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r} is not one of {sorted(DTYPE_BYTES)}")
    rows_per_group = n_rows if rows_per_group is None else rows_per_group
    if input_bytes is None:
        input_bytes = DTYPE_BYTES[dtype]
    width = next_power_of_2(n_cols)
    note = ""
    if width <= _row_limit(tuning, dtype, writes_gradient):
        block_m = max(1, min(tuning.tile_elements // width, next_power_of_2(rows_per_group)))
        config = KernelConfig("tile", block_m, width, 1,
                              _warps(block_m * width, tuning.elements_per_thread, record, tuning.max_warps))
    else:
        form = "gradient" if writes_gradient else "loss"
        arrival = not writes_gradient and tuning.loss_arrival
        if splittable and form in tuning.loss_split and _can_split(target, dtype, True, n_cols, arrival):
            # One row a chunk's item: a tile of several rows would need them adjacent in memory.
            per_thread, config = _unspilled(target, n_rows, n_cols, align, arrival, writes_gradient, resources,
                                            input_bytes, column_loads, softcap)
            if arrival:
                # Nothing held across the exchange: a program per item, none waiting, one launch.
                kernel = _resources(resources, target, config, False, input_bytes)
                plan = _size(target, config, kernel, n_rows, rows_per_group, None, False)
                assert plan is not None  # no program waits: every grid fits
                return dataclasses.replace(plan, reason=f"cross-entropy {plan.reason}")
            plan = plan_split(target, config, n_rows, n_cols, rows_per_group, resources, False, input_bytes,
                              per_thread=per_thread)
            if plan is not None:
                return dataclasses.replace(plan, reason=f"cross-entropy {plan.reason}")
            note = _no_split_note(record)
        chunk = min((0 if writes_gradient else tuning.loss_alone_chunk) or tuning.loop_chunk, width)
        warps = tuning.loss_loop_warps or _warps(chunk, tuning.elements_per_thread, record, tuning.max_warps)
        # One stage: Triton 3.6 pipelines a loop of these loads only where the loop names its stages,
        # which the streamed loops do not (a launch's num_stages of 3 left them as they were, so
        # the stages once measured here measured nothing); a loop that named them cost 44% more
        # instructions a block through shared memory (sm_90, NOTES v45).
        # Windows where each row is streamed once (the forward alone, the backward), not where the
        # forward that writes the gradient streams it twice.
        config = KernelConfig("loop", 1, chunk, 1, warps, 1, align=1 if rereads else align)
    kernel = _resources(resources, target, config, writes_gradient, input_bytes)
    plan = _size(target, config, kernel, n_rows, rows_per_group, None, writes_gradient, note=note)
    assert plan is not None  # tiles and loops always have a grid
    if plan.regime == "loop" and rereads:
        plan = _l2_fit(target, plan, n_rows, n_cols * input_bytes)
    elif plan.regime == "loop" and not writes_gradient:
        plan = _row_programs(target, plan)
    return dataclasses.replace(plan, reason=f"cross-entropy {plan.reason}")


def plan_stats(target: Target, largest_block: int) -> LaunchPlan:
    """The loss's stats kernel (one program, a fixed order): a block of up to ``largest_block``
    targets, or of the longest row a program holds (``Tuning.row_elements``), all of its loads in
    flight at once. Its latency is the call's: a block of 2048 walked 8192 targets in four
    dependent rounds, 14.9 us on the H200 against the loss kernel's 139 (NOTES v39)."""
    block = min(largest_block, next_power_of_2(target.tuning.row_elements))
    return plan_elementwise(target, block, block)


def plan_sum(target: Target, largest_block: int, wide: bool, counted: bool) -> LaunchPlan:
    """The loss's sum kernel (one program, a fixed order): one block of up to ``largest_block``
    terms, or of four times the longest row a program holds (``Tuning.row_elements``: a row held
    keeps several values an element, the sum one), all of its loads in flight at once; half as
    many for float64 terms (``wide``), a quarter where it loads the counted targets beside
    (``counted``: their int64, sm_90 at 65536 spilled 306 words a thread). sm_90, 16 warps: float32
    blocks of 65536 take 128 registers, float64 of 32768 128, none spilled. More terms than a block
    take torch's sum (``loss_reduction``): blocks walked one after another cost a round trip each."""
    block = min(largest_block, 4 * next_power_of_2(target.tuning.row_elements))
    block //= (2 if wide else 1) * (4 if counted else 1)
    return plan_elementwise(target, block, block)


def plan_elementwise(target: Target, n_elements: int, block: int) -> LaunchPlan:
    """A grid over ``n_elements`` in blocks of ``block`` (the held gradient's rescale): a
    program per block up to a few waves of the chip, each program stepping through the rest."""
    record = target.record
    tuning = target.tuning
    warps = _warps(block, tuning.elements_per_thread, record, tuning.max_warps)
    blocks = max(1, _cdiv(n_elements, block))
    programs = max(1, min(blocks, record.compute_units * max(tuning.tile_waves, 1) * 4, record.grid_limit,
                          tuning.max_programs))
    return LaunchPlan(record.backend, "loop", 1, block, 1, warps, 1, programs, 1, blocks, blocks,
                      _cdiv(blocks, programs), f"elementwise: blocks of {block}, {programs} programs")
