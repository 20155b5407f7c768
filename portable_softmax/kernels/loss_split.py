"""The cross-entropy's split regime: ``cross_entropy_forward_split``, a row cut into ``CHUNKS``
chunks held by as many programs at once, with the softmax split regime's items, aligned windows
and exchange (``split.py``, ``windows.py``, ``exchange.py``). The forward then reads the logits
once and, with ``WRITE_GRAD``, writes the gradient from the registers that hold them: memory
sees one read and one write, where the loop regime streams each row twice.

Each chunk publishes its (maximum, sum of exponentials) and reads its row's from every chunk
(``exchange._exchange``, with its ``PHASE``: one launch whose programs wait on their peers, or
two where they cannot). It then knows the row's lse and writes:

* its columns of the gradient (``loss._grad_of``: float32, rounded once, the tile kernel's
  formula), p taken from the exponentials it summed;
* its share of the row's loss, into its slab of ``loss``: a (CHUNKS, positions) float32 buffer
  that the caller sums over the chunks, so that no second exchange and no float atomic is needed
  and the sum is the same in every run. The share of the chunk whose columns hold the target
  (chunk 0 where the target names no class; for a target among a window row's edges, the chunk
  that works them; by arrival, the row's last chunk) holds the terms of the whole row (lse's, the
  target logit's, which it loads alone, and the z-loss); every chunk's holds the smoothing's sum
  over its own columns, -eps / C sum_c w_c z_c. Each share is scaled and masked as the row's loss
  (``loss._scaled_loss``): ignored rows give 0 times the scale in every chunk, a target outside
  the classes NaN. With ``SUMMED`` (a reduced loss that writes the gradient, a persistent grid)
  the shares are not stored: each program adds its own as it goes, and the grid's last program to
  finish sums those partials into ``loss``, the reduced loss itself (``grid_sum.py``);
* that chunk the row's lse.

Without the gradient nothing is held across the exchange, and only one chunk need learn the
row's lse: with ``PHASE`` ``EXCHANGE_ARRIVE`` (``exchange._arrive``) no chunk waits; each
publishes and counts its arrival, and the row's last to arrive reads every chunk's partials and
takes the row's terms into its share (and stores the lse), in place of the target's chunk; it
loads the target's logit itself, after the exchange. The others write their smoothing sums only.

With ``WHOLE``, a persistent grid runs its items in two loops, the second masked: where its
program's chunk of every row lies inside the row, the first, with no column mask, takes them all
(``cross_entropy_forward_split``'s comments).

Class targets only: a probability target's loss needs its own sums over the row, which this
kernel does not exchange (the planner keeps them on tiles and loops). float32 accumulation only:
the exchange packs float32 partials (the planner keeps float64 rows off the split path).
"""
from .jit import _jit, _jit_call, _language, tl  # noqa: F401 (_language: see jit.py)
from .common import LOG2E, _cast, _load, _lse_reference, _row_starts
from .dependency import _overlapped
from .exchange import (EXCHANGE_ARRIVE, EXCHANGE_PUBLISH, EXCHANGE_READ, EXCHANGE_WAIT, MAXIMA_LSE, _arrive,
                       _empty_last, _empty_previous, _exchange, _float_bits)
from .grid_count import _arrived, _counted_total, _grid_counters
from .grid_sum import _finished, _sum_counters
from .loss import _target_logit
from .loss_terms import (_capped, _class_terms, _constants, _cross_entropy, _grad_of, _scaled_loss, _store_rows,
                         _weights)
from .split import _split_item, _split_items, _staged_columns
from .windows import _edge_load, _edge_store, _output_window, _row_edges, _split_window, _window_store


@_jit
def cross_entropy_forward_split(
    x_ptr, target_ptr, weight_ptr, stats_ptr, loss_ptr, lse_ptr, grad_ptr, slot_ptr, done_ptr,
    n_items, tiles_per_outer, rows_per_outer, n_cols,
    x_outer_stride, x_row_stride, x_col_stride, target_outer_stride, target_row_stride, target_col_stride,
    loss_outer_stride, loss_row_stride, loss_col_stride, lse_outer_stride, lse_row_stride, lse_col_stride,
    grad_outer_stride, grad_row_stride, grad_col_stride,
    ignore_index,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACC_FP64: tl.constexpr, WEIGHT: tl.constexpr,
    PROB_TARGET: tl.constexpr, SMOOTHING: tl.constexpr, Z_LOSS: tl.constexpr, SOFTCAP: tl.constexpr,
    WRITE_GRAD: tl.constexpr, CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr, ALIGN: tl.constexpr,
    TICKETED: tl.constexpr, STAGES: tl.constexpr, WAIT_ATOMIC: tl.constexpr, SHIFTED: tl.constexpr,
    PHASE: tl.constexpr, DEPENDENT: tl.constexpr, COUNTED: tl.constexpr, SUMMED: tl.constexpr,
    WHOLE: tl.constexpr,
):
    # Rows of classes are taken one at a time (a tile of several would need them adjacent in
    # memory); class targets, float32 (module docstring).
    tl.static_assert(BLOCK_M == 1, "split cross-entropy rows are taken one at a time")
    tl.static_assert(not PROB_TARGET, "probability targets have no split kernel")
    tl.static_assert(not ACC_FP64, "the exchange packs float32 partials")
    chunk_cols = tl.arange(0, BLOCK_N)
    _overlapped(DEPENDENT)
    ce_scale, z_scale, weight_sum, smoothing, z_loss, softcap = _constants(stats_ptr, False)
    # A row's shares of its loss lie a slab of one value per row apart (a tile is one row).
    n_rows = n_items // CHUNKS
    # COUNTED (an unweighted 'mean' that writes the gradient): the grid counts the counted targets
    # itself (``grid_count.py``; its stats' denominators are 1), in counters after the tiles'.
    tl.static_assert(not COUNTED or (WRITE_GRAD and not TICKETED), "a grid counts its targets: resident, gradient")
    word, departures = _grid_counters(done_ptr, n_rows)
    if COUNTED and PHASE != EXCHANGE_READ:
        # Before the item loop: Triton's pipeliner moves what the loop body does for its first item
        # into another stage than the wait for the count (the program then waits on its own
        # arrival: a grid that hung on an H200, NOTES v43).
        _arrived(target_ptr, word, n_items, n_rows, rows_per_outer, target_outer_stride, target_row_stride,
                 ignore_index)
    if (COUNTED and STAGES > 1) and PHASE != EXCHANGE_PUBLISH:
        # Read before the loop too: a pipelined loop that calls the read for its first item pays
        # for the call site on every item (``grid_count.py``).
        ce_scale = 1.0 / _counted_total(word, departures, n_items, PHASE == EXCHANGE_WAIT).to(tl.float32)
        z_scale = ce_scale
    # SUMMED (a reduced loss, the gradient written, a grid not by ticket): the grid sums the
    # shares itself (``grid_sum.py``) into ``loss_ptr``, the loss (in its dtype), a partial a program.
    tl.static_assert(not SUMMED or (WRITE_GRAD and not TICKETED), "a grid sums its shares: persistent, gradient")
    first, stop, step = _split_items(n_items, done_ptr, TICKETED)
    # With WHOLE, a persistent grid that is a multiple of CHUNKS gives each program one chunk of
    # every row it takes. Where that chunk lies wholly inside the row (every chunk but the row's
    # last, without windows), its loop is compiled with no column mask: no select of -inf, no
    # compare an element vector, loads and stores unpredicated (sm_90, bf16 8192x32000: 942 -> 810
    # instructions an item). Its registers are the kernel's beside the masked loop's: the planner
    # leaves it out of rows of many chunks (``Tuning.loss_whole_chunks``).
    tl.static_assert(not WHOLE or (ALIGN == 1 and not TICKETED), "whole chunks: persistent grids of aligned rows")
    summed = tl.zeros([BLOCK_M], tl.float32)
    split = first
    if WHOLE:
        # Each group of CHUNKS programs takes its chunks rotated by the group's number: programs a
        # wave of units apart (on one unit, as the first wave fills the chip) then hold different
        # chunks where the unit count is a multiple of CHUNKS (132 and 4 chunks: 33 groups a wave),
        # so that no unit holds only the rows' masked last chunks, which its peers wait on.
        # (A grid that is not a multiple of CHUNKS, forced, takes its items as they come.)
        grouped = tl.num_programs(0) % CHUNKS == 0
        first = tl.where(grouped, first // CHUNKS * CHUNKS + (first + first // CHUNKS) % CHUNKS, first)
        whole = ((first % CHUNKS + 1) * BLOCK_N <= n_cols) & grouped
        split = tl.where(whole, stop, first)
    # Two loops one after the other, one of them empty, the whole one only where it can be taken:
    # in the two arms of a branch Triton gave each its own pipeline buffers (64 KB a program for
    # bf16 chunks of 8192, against 32).
    for part in tl.static_range(2):
        if part == 1 or WHOLE:
            summed = _split_loop(
                x_ptr, target_ptr, weight_ptr, loss_ptr, lse_ptr, grad_ptr, slot_ptr, done_ptr,
                tl.where(part == 0, first, split), tl.where(part == 0, split, stop), step, n_items, n_rows,
                tiles_per_outer, rows_per_outer, n_cols, chunk_cols, x_outer_stride, x_row_stride, x_col_stride,
                target_outer_stride, target_row_stride, loss_outer_stride, loss_row_stride, lse_outer_stride,
                lse_row_stride, grad_outer_stride, grad_row_stride, grad_col_stride, ignore_index, word, departures,
                ce_scale, z_scale, weight_sum, smoothing, z_loss, softcap, summed, BLOCK_M, BLOCK_N, WEIGHT,
                SMOOTHING, Z_LOSS, SOFTCAP, WRITE_GRAD, CHUNKS, CHUNKS_P2, ALIGN, TICKETED, STAGES, WAIT_ATOMIC,
                SHIFTED, PHASE, COUNTED, SUMMED, part == 0)
    _empty_last(slot_ptr, done_ptr, n_items, tiles_per_outer, rows_per_outer, BLOCK_M, CHUNKS, CHUNKS_P2, TICKETED,
                PHASE)
    if SUMMED and PHASE != EXCHANGE_PUBLISH:
        finish, partials = _sum_counters(done_ptr, n_rows)
        _finished(tl.sum(summed, 0), finish, partials, loss_ptr, n_items)


@_jit
def _split_loop(x_ptr, target_ptr, weight_ptr, loss_ptr, lse_ptr, grad_ptr, slot_ptr, done_ptr, first, stop, step,
                n_items, n_rows, tiles_per_outer, rows_per_outer, n_cols, chunk_cols, x_outer_stride, x_row_stride,
                x_col_stride, target_outer_stride, target_row_stride, loss_outer_stride, loss_row_stride,
                lse_outer_stride, lse_row_stride, grad_outer_stride, grad_row_stride, grad_col_stride, ignore_index,
                word, departures, ce_scale, z_scale, weight_sum, smoothing, z_loss, softcap, summed,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WEIGHT: tl.constexpr, SMOOTHING: tl.constexpr,
                Z_LOSS: tl.constexpr, SOFTCAP: tl.constexpr, WRITE_GRAD: tl.constexpr, CHUNKS: tl.constexpr,
                CHUNKS_P2: tl.constexpr, ALIGN: tl.constexpr, TICKETED: tl.constexpr, STAGES: tl.constexpr,
                WAIT_ATOMIC: tl.constexpr, SHIFTED: tl.constexpr, PHASE: tl.constexpr, COUNTED: tl.constexpr,
                SUMMED: tl.constexpr, WHOLE: tl.constexpr):
    """The split forward's items (``cross_entropy_forward_split``): this program's share of the
    reduced loss with ``SUMMED``. ``WHOLE``: every item's chunk lies inside its row, its mask
    ``_whole`` (the compiler folds it away)."""
    for item in tl.range(first, stop, step, num_stages=STAGES):
        tile, chunk, outer, rows, row_mask, cols = _split_item(
            item, tiles_per_outer, rows_per_outer, chunk_cols, BLOCK_M, BLOCK_N, CHUNKS)
        x_base, lead, mask = _split_window(outer, rows, row_mask, cols, n_cols, x_outer_stride, x_row_stride, ALIGN)
        if WHOLE:
            mask = _whole(cols, row_mask)
        if STAGES > 1:
            # Zero-filled, as the pipelined copy fills; padded with -inf under the later mask, or
            # the load's would be carried from stage to stage (``split._staged_columns``).
            x = _load(x_ptr, x_base, cols, x_col_stride, mask, 0.0, x_ptr.dtype.element_ty, False, "")
            cols, mask = _staged_columns(item, cols, mask, lead, n_cols, row_mask, chunk_cols, BLOCK_N, CHUNKS,
                                         ALIGN, STAGES)
            if WHOLE:
                mask = _whole(cols, row_mask)
            x = tl.where(mask, x, -float("inf"))
        else:
            x = _load(x_ptr, x_base, cols, x_col_stride, mask, -float("inf"), x_ptr.dtype.element_ty, False, "")
        # The row's own columns (a window's less its lead: 0 without windows).
        row_cols = cols - lead[:, None]
        z, t = _capped(x, mask, softcap, SOFTCAP)
        chunk_max = tl.max(z, 1)
        if ALIGN > 1:
            # Only the chunk that holds the row's last element works its edges, both of them: the
            # rest skip that work in a branch every thread of the program takes alike, and nothing
            # of the edges is held across the exchange (the gradient loads them again). Every chunk
            # of a row waits on its slowest: the last chunk is the one with room (its columns run
            # out), where the row's first chunk is full (NOTES v50). sm_90, bf16 rows of 50257 in
            # chunks of 4096: the edges cost about 300 of 1440 instructions an item and 8 spilled
            # words; H200, 0.274 -> 0.240 ms forward + backward without them (a bound), NOTES v49.
            edged = _holds_edges(lead, n_cols, chunk, BLOCK_N)
            z_edge = tl.full([2 * ALIGN], -float("inf"), tl.float32)
            edge_max = tl.full([BLOCK_M], -float("inf"), tl.float32)
            if edged:
                _, _, z_edge, _ = _edge_values(x_ptr, x_base, lead, n_cols, row_mask, softcap, ALIGN, SOFTCAP)
                edge_max = tl.maximum(edge_max, tl.max(z_edge, 0))
            chunk_max = tl.maximum(chunk_max, edge_max)
        if SMOOTHING:
            # This chunk's sum_c w_c z_c (padding is -inf: kept out of the product), before the
            # exponentials: after them, z was held beside them, a register an element (sm_90, bf16
            # chunks of 4096 at 2 warps: 227 registers against 168 without smoothing, NOTES v53).
            w = _weights(weight_ptr, row_cols, mask, WEIGHT, False)
            smooth_sum = tl.sum(w * tl.where(mask, z, 0.0), 1)
            if ALIGN > 1:
                smooth_edge = tl.zeros([BLOCK_M], tl.float32)
                if edged:
                    edge, edge_mask = _row_edges(lead, n_cols, row_mask, ALIGN)
                    w_edge = _weights(weight_ptr, edge - tl.sum(lead, 0), edge_mask, WEIGHT, False)
                    smooth_edge += tl.sum(w_edge * tl.where(edge_mask, z_edge, 0.0), 0)
                smooth_sum += smooth_edge
        else:
            smooth_sum = tl.full([BLOCK_M], 0.0, tl.float32)
        # A chunk with no finite value must not turn its exponentials into NaN: -inf - -inf; one
        # holding +inf sums to +inf (``_lse_reference``), as the exchange takes it (``MAXIMA_LSE``).
        ref = _lse_reference(chunk_max)
        # One exponential per element: summed now, and once lse is known, the probabilities. Its
        # argument z log2(e) - ref log2(e): one fused multiply-add an element (``loss._grad``).
        e = tl.exp2(z * LOG2E - (ref * LOG2E)[:, None])
        total = tl.sum(e, 1)
        if ALIGN > 1:
            edge_total = tl.zeros([BLOCK_M], tl.float32)
            if edged:
                edge_total += tl.sum(tl.exp2(z_edge * LOG2E - tl.sum(ref, 0) * LOG2E), 0)
            total += edge_total
        # The row's target and its weight, loads issued before the exchange, whose round trips
        # they overlap. The row's own terms go to the chunk whose columns hold the target (chunk 0
        # where it names no class), which loads its logit there: a logit of its own columns,
        # read before it writes them (``inplace_backward``: no other program writes them); by
        # arrival, to the row's last chunk.
        target_base = _row_starts(outer, rows, target_outer_stride, target_row_stride, False)
        target, ignored, valid, _, w_t = _class_terms(target_ptr, target_base, row_mask, row_cols, weight_ptr,
                                                      ignore_index, n_cols, WEIGHT, False)
        if PHASE == EXCHANGE_ARRIVE:
            # No chunk waits: the row's last to arrive learns its lse, and its share takes the row's
            # terms, the target's logit loaded there (from L2 where another chunk's columns hold it).
            tl.static_assert(not WRITE_GRAD, "the gradient needs every chunk's lse: the arrival form has none")
            tl.static_assert(STAGES == 1, "a program per item: nothing to pipeline")
            packed = (_float_bits(chunk_max) << 32) | _float_bits(total)
            last, row_max, row_total = _arrive(slot_ptr, done_ptr, tile, chunk, row_mask, packed, CHUNKS, CHUNKS_P2)
            owns = row_mask & last
            holds = owns & valid
            z_t = _target_logit(x_ptr, x_base + lead, x_col_stride, target, valid, holds, softcap, False, SOFTCAP)
            # The others read nothing: their share's +inf test takes their own maximum (the last's
            # share holds the row's, and a NaN there is the row's sum).
            row_max = tl.where(last, row_max, chunk_max)
        else:
            owner = (target + lead) // BLOCK_N
            if ALIGN > 1:
                # A target among the row's edges is the edges' chunk's, which writes their gradient
                # (its one-hot term after the edges', in one program).
                at = target + lead
                edge = (at < (lead + ALIGN - 1) // ALIGN * ALIGN) | (at >= (lead + n_cols) // ALIGN * ALIGN)
                owner = tl.where(edge, (lead + n_cols - 1) // BLOCK_N, owner)
            owns = tl.where(valid, owner, 0) == chunk
            holds = row_mask & valid & owns
            z_t = _target_logit(x_ptr, x_base + lead, x_col_stride, target, valid, holds, softcap, False, SOFTCAP)
            packed = (_float_bits(chunk_max) << 32) | _float_bits(total)
            row_max, row_total = _exchange(slot_ptr, done_ptr, tile, chunk, row_mask, packed, BLOCK_M, CHUNKS,
                                           CHUNKS_P2, MAXIMA_LSE, STAGES, WAIT_ATOMIC, PHASE)
        # A row's are scalars: as blocks of its one row, as the loss's helpers take rows.
        row_max = tl.full([BLOCK_M], 0.0, tl.float32) + row_max
        row_total = tl.full([BLOCK_M], 0.0, tl.float32) + row_total
        # A publishing launch writes nothing: the next one writes every chunk.
        if PHASE != EXCHANGE_PUBLISH:
            if COUNTED and STAGES == 1:
                # The count, read once: before the first share or gradient it scales, after the
                # first item's loads and exchange (unpipelined, nothing else is in flight). Both of
                # the 'mean''s denominators are the count (unweighted); 0 / 0 is NaN, as torch's.
                if item == first:
                    counted = _counted_total(word, departures, n_items, PHASE == EXCHANGE_WAIT)
                    ce_scale = 1.0 / counted.to(tl.float32)
                    z_scale = ce_scale
            # A row of -inf only has lse -inf, as torch's logsumexp (its peers' sums are 0 * NaN).
            lse = tl.where(row_max == -float("inf"), -float("inf"), row_max + tl.log(row_total))
            # The row's terms (lse - z_t formed at once, as the tile kernel does) and its z-loss in
            # the owner's share; every share the smoothing's sum over its own columns.
            ce = _cross_entropy(lse, z_t, w_t, smooth_sum, w_t, w_t, weight_sum, smoothing, n_cols, False, SMOOTHING)
            ce = tl.where(owns, ce, -smoothing / n_cols * smooth_sum)
            share = _scaled_loss(ce, tl.where(owns, lse, 0.0), row_max, ignored, valid, ce_scale, z_scale, z_loss,
                                 Z_LOSS)
            if SUMMED:
                summed += share
                tl.store(lse_ptr + _row_starts(outer, rows, lse_outer_stride, lse_row_stride, False), lse,
                         mask=row_mask & owns)
            else:
                _store_rows(loss_ptr + chunk * n_rows, lse_ptr, outer, rows, row_mask, loss_outer_stride,
                            loss_row_stride, lse_outer_stride, lse_row_stride, share, lse, row_mask & owns)
            if WRITE_GRAD:
                _write_gradient(e, t, x_ptr, x_base, cols, mask, row_cols, lead, chunk_max,
                                row_max, lse, holds, target, z_t, w_t, ignored, valid, weight_ptr, grad_ptr, outer,
                                rows, row_mask, grad_outer_stride, grad_row_stride, grad_col_stride, n_cols, chunk,
                                ce_scale, z_scale, weight_sum, smoothing, z_loss, softcap, BLOCK_N, WEIGHT, SMOOTHING,
                                Z_LOSS, SOFTCAP, ALIGN, SHIFTED, STAGES)
        _empty_previous(slot_ptr, tile, chunk, tiles_per_outer, rows_per_outer, BLOCK_M, CHUNKS, CHUNKS_P2, TICKETED,
                        PHASE)
    return summed


@_jit
def _write_gradient(e, t, x_ptr, x_base, cols, mask, row_cols, lead, chunk_max, row_max,
                    lse, holds, target, z_t, w_t, ignored, valid, weight_ptr, grad_ptr, outer, rows, row_mask,
                    grad_outer_stride, grad_row_stride, grad_col_stride, n_cols, chunk, ce_scale, z_scale, weight_sum,
                    smoothing, z_loss, softcap, BLOCK_N: tl.constexpr, WEIGHT: tl.constexpr, SMOOTHING: tl.constexpr,
                    Z_LOSS: tl.constexpr, SOFTCAP: tl.constexpr, ALIGN: tl.constexpr, SHIFTED: tl.constexpr,
                    STAGES: tl.constexpr):
    """Write a chunk's columns of the gradient (``loss._grad_of``) from its exponentials ``e``
    (and its window's edges'), p = e exp(its maximum - lse); then, where the chunk ``holds`` the
    target, the target's column again, with its one-hot term.

    Every column is first written without the one-hot term: telling the target's column apart at
    every column would hold a compare (a register an element) across the exchange: on sm_90 the
    bf16 forward by ticket in chunks of 8192 took 138 registers at 4 warps against 107 (107
    against 52 at 8), and occupancy with them. The target's value, from its logit (one load) in float32 as the rest, is
    stored after a barrier, which orders it behind the program's other stores of that column
    (PTX: the barrier performs the threads' prior accesses relative to every thread of the
    program). Triton does not software-pipeline a loop that holds a barrier, but one that calls a
    function holding it: pipelined (``STAGES`` > 1), the barrier and the store are called, with
    the row's scalars (sm_90, bf16 chunks of 8192 at 4 warps and 3 stages: 96 registers without a
    spill under the launch's cap, 33 KB of stage buffers)."""
    # A chunk of -inf only scales its zeros by exp(row maximum - lse): 0, or NaN for a row of
    # -inf only, as the tile kernel's p.
    scale = tl.exp2((tl.where(chunk_max == -float("inf"), row_max, chunk_max) - lse) * LOG2E)
    if WEIGHT:
        w = _weights(weight_ptr, row_cols, mask, WEIGHT, False)
    else:
        # 1 at every column: the stores' masks leave the padding out, so the smoothing's term
        # needs no select of 1 or 0 an element (sm_90, bf16 chunks of 4096 at 2 warps: 21
        # instructions an item and 2 spilled words fewer under a cap of 96, NOTES v53).
        w = 1.0
    grad_row = _row_starts(outer, rows, grad_outer_stride, grad_row_stride, False)
    grad_base = _output_window(grad_row, lead, ALIGN, SHIFTED)
    # An ignored row's gradient is 0 whatever its logits. A 16-bit gradient stores those zeros
    # apart, under the mask the bulk's store leaves out (no branch: on one, the pipelined form's
    # gradient came out wrong on an H200, Triton 3.6, NOTES v32): LLVM moves a select of 0.0 in
    # ``_grad_of`` past the rounding, onto each 16-bit half, a SEL, a PRMT and a predicate an
    # element on sm_90. A float32 one keeps the select: one FSEL an element, cheaper than the
    # second store (NOTES v35).
    selected = grad_ptr.dtype.element_ty == tl.float32
    g = _grad_of(e, scale, t, lse, _none(mask), w_t, w, w, w_t, ignored, valid, ce_scale, z_scale, weight_sum,
                 smoothing, z_loss, n_cols, False, SMOOTHING, Z_LOSS, SOFTCAP, selected)
    if not selected:
        # (``ignored == 0``, not ``~ignored``: Triton 3.2's interpreter cannot invert an int1.)
        counted = row_mask & (ignored == 0)
        _window_store(grad_ptr, grad_base, cols, grad_col_stride, mask & counted[:, None], g, lead, n_cols, counted,
                      chunk * BLOCK_N, BLOCK_N, ALIGN, SHIFTED)
        zeroed = row_mask & ignored
        zeros = tl.zeros([1, BLOCK_N], tl.float32)
        _window_store(grad_ptr, grad_base, cols, grad_col_stride, mask & zeroed[:, None], zeros, lead, n_cols, zeroed,
                      chunk * BLOCK_N, BLOCK_N, ALIGN, SHIFTED)
    else:
        _window_store(grad_ptr, grad_base, cols, grad_col_stride, mask, g, lead, n_cols, row_mask, chunk * BLOCK_N,
                      BLOCK_N, ALIGN, SHIFTED)
    if ALIGN > 1:
        if _holds_edges(lead, n_cols, chunk, BLOCK_N):
            # The edges' logits loaded again (from L2; this program writes them last, so
            # ``inplace_backward`` leaves them as they were), their exponentials formed again as
            # the forward formed them.
            edge, edge_mask, z_edge, t_edge = _edge_values(x_ptr, x_base, lead, n_cols, row_mask, softcap, ALIGN,
                                                           SOFTCAP)
            e_edge = tl.exp2(z_edge * LOG2E - tl.sum(_lse_reference(chunk_max), 0) * LOG2E)[None, :]
            w_edge = _weights(weight_ptr, edge - tl.sum(lead, 0), edge_mask, WEIGHT, False)[None, :]
            g_edge = _grad_of(e_edge, scale, t_edge[None, :], lse, _none(edge_mask[None, :]), w_t, w_edge, w_edge, w_t,
                              ignored, valid, ce_scale, z_scale, weight_sum, smoothing, z_loss, n_cols, False,
                              SMOOTHING, Z_LOSS, SOFTCAP, True)
            _edge_store(grad_ptr, grad_base, edge, edge_mask, tl.sum(g_edge, 0))
    # The target's tanh from its capped logit (z = softcap tanh): the derivative's 1 - tanh^2.
    p_t = tl.exp2((z_t - lse) * LOG2E)[:, None]
    g_t = _grad_of(p_t, 1.0, (z_t / softcap)[:, None], lse, holds[:, None], w_t, w_t[:, None], w_t[:, None], w_t,
                   ignored, valid, ce_scale, z_scale, weight_sum, smoothing, z_loss, n_cols, False, SMOOTHING, Z_LOSS,
                   SOFTCAP, True)
    at = grad_row + tl.where(holds, target, 0) * grad_col_stride
    value = _cast(tl.sum(g_t, 1), grad_ptr.dtype.element_ty)
    if STAGES > 1:
        # Behind a call: Triton pipelines a loop whose barrier lies in a function it calls (as the
        # exchange's wait loop, ``exchange._exchange``), not one that holds it. Its arguments are
        # scalars: the row's one target.
        _target_stored_called(grad_ptr, tl.sum(at, 0), tl.sum(value, 0), tl.sum(holds.to(tl.int32), 0) > 0)
    else:
        _target_stored(grad_ptr, at, value, holds)


def _target_store(ptr, at, value, holds):
    """Store ``value`` at ``ptr + at`` where ``holds``, behind a barrier: after every store of the
    program's threads before it, the bulk store of that column among them."""
    tl.debug_barrier()
    tl.store(ptr + at, value, mask=holds)


_target_stored = _jit(_target_store)


_target_stored_called = _jit_call(_target_store)


@_jit
def _edge_values(x_ptr, x_base, lead, n_cols, row_mask, softcap, ALIGN: tl.constexpr, SOFTCAP: tl.constexpr):
    """A window row's edges (``windows._row_edges``): their columns, mask, capped logits (-inf
    where masked) and tanh."""
    edge, edge_mask = _row_edges(lead, n_cols, row_mask, ALIGN)
    z, t = _capped(_edge_load(x_ptr, x_base, edge, edge_mask, -float("inf"), x_ptr.dtype.element_ty), edge_mask,
                   softcap, SOFTCAP)
    return edge, edge_mask, z, t


@_jit
def _holds_edges(lead, n_cols, chunk, BLOCK_N: tl.constexpr):
    """Whether a window chunk works its row's edges (``windows._row_edges``), both of them: the
    chunk that holds the row's last element (its last group's)."""
    return chunk == (tl.sum(lead, 0) + n_cols - 1) // BLOCK_N


@_jit
def _none(mask):
    """A mask of ``mask``'s shape that holds nowhere (the target's column, written apart here): a
    comparison the compiler folds to false, not ``mask & False``, whose constant is an int1 that
    Triton 3.2's interpreter cannot make."""
    return mask != mask


@_jit
def _whole(cols, row_mask):
    """The mask of a chunk that lies inside its row: its row's, over every column (``cols ==
    cols`` folds to true; a constant int1 Triton 3.2's interpreter cannot make, as ``_none``)."""
    return (cols == cols) & row_mask[:, None]
