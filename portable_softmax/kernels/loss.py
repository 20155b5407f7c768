"""The cross-entropy kernels: the loss of ``loss.cross_entropy`` and its gradient, one Triton source
for every backend (CPU tensors run it through the interpreter, as the rest of the package); their
per-row formulas, and how rows are walked, in ``loss_terms.py``.

Kernels (``variants.LOSS_KERNELS``):

* ``cross_entropy_forward_tile``: a tile of rows held whole in registers: one read; the loss
  rows and lse, and with ``WRITE_GRAD`` the gradient in the same pass (the backward then only
  rescales it, ``cross_entropy_grad_scale``).
* ``cross_entropy_forward_loop``: rows streamed once in chunks (online maximum and sum kept per
  run of lanes, reduced across threads once a row; the target's logit one load a row): loss
  rows and lse; with ``WRITE_GRAD`` streamed a second time for the gradient, a read that the
  first pass asks L2 to serve, which it does only while the rows in flight fit there. Without
  it, rows off 16-byte boundaries are read through aligned windows (``ALIGN``, ``windows.py``).
* ``cross_entropy_forward_split`` (``loss_split.py``): a row's chunks held by co-resident
  programs that exchange their (maximum, sum), then write the gradient from their registers
  and their shares of the loss: one read, one write, for class targets.
* ``cross_entropy_backward``: the gradient streamed from the saved lse and the incoming gradient
  (one value, or one per position for ``reduction='none'``): one read, one write.
* ``cross_entropy_grad_scale``: a held gradient times the incoming one, unless that is 1 (read on
  the device: no host synchronisation).
* ``cross_entropy_sum``: a reduced loss from the terms the forward wrote (its rows' losses, or a
  split plan's shares), summed and rounded to the loss's dtype: one launch where torch took two
  kernels (a sum and a cast).
* ``cross_entropy_stats``: the denominators of a 'mean' of class targets and the summed class
  weights, into the stats the other kernels read: one launch where torch takes three to fifteen
  operations (``loss_reduction.stats``).
"""
from .common import (LANE_WIDTH, LOG2E, _cast, _lane_columns, _lane_combine, _load, _lse_reference, _row_starts,
    _store, _tile_rows, _vector_sum, _vector_update, _wide)
from .dependency import _overlapped
from .jit import _jit, _language, tl  # noqa: F401 (_language: see jit.py)
from .loss_terms import (_capped, _class_terms, _class_terms_of, _constants, _grad, _grad_of, _row_loss, _row_lse,
                         _smoothed, _store_rows, _target_index, _weights)
from .windows import _row_edges, _window_start


@_jit
def cross_entropy_forward_tile(
    x_ptr, target_ptr, weight_ptr, stats_ptr, loss_ptr, lse_ptr, grad_ptr,
    n_tiles, tiles_per_outer, rows_per_outer, n_cols,
    x_outer_stride, x_row_stride, x_col_stride, target_outer_stride, target_row_stride, target_col_stride,
    loss_outer_stride, loss_row_stride, loss_col_stride, lse_outer_stride, lse_row_stride, lse_col_stride,
    grad_outer_stride, grad_row_stride, grad_col_stride,
    ignore_index,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACC_FP64: tl.constexpr, WEIGHT: tl.constexpr,
    PROB_TARGET: tl.constexpr, SMOOTHING: tl.constexpr, Z_LOSS: tl.constexpr, SOFTCAP: tl.constexpr,
    WRITE_GRAD: tl.constexpr, DEPENDENT: tl.constexpr,
):
    cols = tl.arange(0, BLOCK_N)[None, :]
    col_mask = cols < n_cols
    _overlapped(DEPENDENT)
    ce_scale, z_scale, weight_sum, smoothing, z_loss, softcap = _constants(stats_ptr, ACC_FP64)
    w = _weights(weight_ptr, cols, col_mask, WEIGHT, ACC_FP64)
    for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        outer, rows, row_mask = _tile_rows(tile, tiles_per_outer, rows_per_outer, BLOCK_M, False)
        mask = row_mask[:, None] & col_mask
        x_base = _row_starts(outer, rows, x_outer_stride, x_row_stride, False)
        target_base = _row_starts(outer, rows, target_outer_stride, target_row_stride, False)
        x = _load(x_ptr, x_base, cols, x_col_stride, mask, -float("inf"), x_ptr.dtype.element_ty, ACC_FP64, "")
        z, t = _capped(x, mask, softcap, SOFTCAP)
        row_max = tl.max(z, 1)
        ref = _lse_reference(row_max)
        # One exponential an element, its argument one fused multiply-add (``_grad``): summed, and
        # with the gradient, the probabilities e / total.
        e = tl.exp2(z * LOG2E - (ref * LOG2E)[:, None])
        total = tl.sum(e, 1)
        lse = _row_lse(row_max, total)
        # Padding is -inf: kept out of every sum that multiplies it.
        finite_z = tl.where(mask, z, 0.0)
        if PROB_TARGET:
            q = _smoothed(_load(target_ptr, target_base, cols, target_col_stride, mask, 0.0,
                                target_ptr.dtype.element_ty, ACC_FP64, ""), mask, smoothing, n_cols, SMOOTHING)
            prob_sum = tl.sum(w * q, 1)
            prob_dot = tl.sum(w * q * finite_z, 1)
            ignored = rows < 0
            valid = row_mask
            hit = cols < 0
            w_t = prob_sum
            z_t = prob_sum
            smooth_sum = prob_sum
        else:
            q = w
            target, ignored, valid, hit, w_t = _class_terms(target_ptr, target_base, row_mask, cols, weight_ptr,
                                                            ignore_index, n_cols, WEIGHT, ACC_FP64)
            z_t = tl.sum(tl.where(hit, z, 0.0), 1)
            smooth_sum = tl.sum(w * finite_z, 1) if SMOOTHING else z_t
            prob_sum = z_t
            prob_dot = z_t
        loss = _row_loss(lse, row_max, z_t, w_t, smooth_sum, prob_sum, prob_dot, ignored, valid, ce_scale, z_scale,
                         weight_sum, smoothing, z_loss, n_cols, PROB_TARGET, SMOOTHING, Z_LOSS)
        _store_rows(loss_ptr, lse_ptr, outer, rows, row_mask, loss_outer_stride, loss_row_stride, lse_outer_stride,
                    lse_row_stride, loss, lse, row_mask)
        if WRITE_GRAD:
            # A row of -inf only: 0 / 0, NaN, as exp(z - lse) there.
            g = _grad_of(e, 1.0 / total, t, lse, hit, w_t, w, q, prob_sum, ignored, valid, ce_scale, z_scale,
                         weight_sum, smoothing, z_loss, n_cols, PROB_TARGET, SMOOTHING, Z_LOSS, SOFTCAP, True)
            grad_base = _row_starts(outer, rows, grad_outer_stride, grad_row_stride, False)
            _store(grad_ptr, grad_base, cols, grad_col_stride, mask, g)


@_jit
def _streamed_window(x_base, row_mask, n_cols, ALIGN: tl.constexpr):
    """A streamed row's aligned window (``windows.py``): its start, the row's first column in it,
    and the columns of its whole groups [inner, tail) (none for a missing row)."""
    x_window = _window_start(x_base, ALIGN)
    lead = (x_base - x_window).to(tl.int32)
    return x_window, lead, (lead + ALIGN - 1) // ALIGN * ALIGN, tl.where(row_mask, (lead + n_cols) // ALIGN * ALIGN, 0)


@_jit
def _streamed_edges(x_ptr, x_window, lead, row_mask, n_cols, softcap, ACC_FP64: tl.constexpr, ALIGN: tl.constexpr,
                    SOFTCAP: tl.constexpr):
    """The window's edges (``_row_edges``; one element a thread: as [1, 2 * ALIGN] every thread
    computed them all, sm_90 bf16 rows of 50257 48 instructions more): columns, mask, logits, tanh."""
    edge, edge_mask = _row_edges(lead, n_cols, row_mask, ALIGN)
    z_edge, t_edge = _capped(_wide(_cast(tl.load(x_ptr + tl.sum(x_window, 0) + edge, mask=edge_mask,
                                                 other=-float("inf")), x_ptr.dtype.element_ty), ACC_FP64),
                             edge_mask, softcap, SOFTCAP)
    return edge, edge_mask, z_edge, t_edge


@_jit
def _stream_gradient(x_ptr, x_base, x_col_stride, target_ptr, target_base, target_col_stride, weight_ptr, grad_ptr,
                     grad_base, grad_col_stride, row_mask, chunk_cols, n_cols, lse, target, w_t, prob_sum, ignored,
                     valid, factor, ce_scale, z_scale, weight_sum, smoothing, z_loss, softcap, lead, inner, tail, span,
                     BLOCK_N: tl.constexpr, ACC_FP64: tl.constexpr, WEIGHT: tl.constexpr, PROB_TARGET: tl.constexpr,
                     SMOOTHING: tl.constexpr, Z_LOSS: tl.constexpr, SOFTCAP: tl.constexpr, EVICT: tl.constexpr,
                     ALIGN: tl.constexpr):
    """Stream rows once more, writing their gradient (``_grad``) times ``factor`` per row: x read
    again (``EVICT``: its cache policy), the gradient written once. ``ALIGN`` > 1: one row through
    the windows at ``x_base`` and ``grad_base``, columns [0, ``span``), the whole groups [``inner``,
    ``tail``) as vectors (``_streamed_window``); the caller writes the row's edges."""
    for start in tl.range(0, span, BLOCK_N):
        cols = start + chunk_cols
        if ALIGN > 1:
            # Constant over each group (its bounds are multiples of ALIGN): vector loads and stores.
            mask = (cols >= inner) & (cols < tail)
            col_mask = mask
            row_cols = cols - lead[:, None]
        else:
            col_mask = cols < n_cols
            mask = row_mask[:, None] & col_mask
            row_cols = cols
        x = _load(x_ptr, x_base, cols, x_col_stride, mask, -float("inf"), x_ptr.dtype.element_ty, ACC_FP64, EVICT)
        z, t = _capped(x, mask, softcap, SOFTCAP)
        w = _weights(weight_ptr, row_cols, col_mask, WEIGHT, ACC_FP64)
        if PROB_TARGET:
            q = _smoothed(_load(target_ptr, target_base, cols, target_col_stride, mask, 0.0,
                                target_ptr.dtype.element_ty, ACC_FP64, ""), mask, smoothing, n_cols, SMOOTHING)
        else:
            q = w
        g = _grad(z, t, lse, row_cols == target[:, None], w_t, w, q, prob_sum, ignored, valid, ce_scale, z_scale,
                  weight_sum, smoothing, z_loss, n_cols, PROB_TARGET, SMOOTHING, Z_LOSS, SOFTCAP)
        _store(grad_ptr, grad_base, cols, grad_col_stride, mask, g * factor[:, None])


@_jit
def _target_logit(x_ptr, x_base, x_col_stride, target, valid, row_mask, softcap, ACC_FP64: tl.constexpr,
                  SOFTCAP: tl.constexpr):
    """Each row's logit at its target (capped as the row's), 0 where the target names no class: one
    load a row, rather than a compare and a sum over every streamed chunk (no address from an
    invalid target)."""
    found = row_mask & valid
    x = _wide(_cast(tl.load(x_ptr + x_base + tl.where(found, target, 0) * x_col_stride, mask=found, other=0.0),
                    x_ptr.dtype.element_ty), ACC_FP64)
    z, _ = _capped(x, found, softcap, SOFTCAP)
    return tl.where(found, z, 0.0)


@_jit
def _stream_block(x_ptr, target_ptr, weight_ptr, cols, x_window, x_col_stride, target_base, target_col_stride,
                  row_mask, lead, inner, tail, n_cols, lane_max, lane_sum, lane_dot, lane_prob, smoothing, softcap,
                  VEC: tl.constexpr, ACC_FP64: tl.constexpr, WEIGHT: tl.constexpr, PROB_TARGET: tl.constexpr,
                  SMOOTHING: tl.constexpr, SOFTCAP: tl.constexpr, ALIGN: tl.constexpr, EVICT: tl.constexpr):
    """One streamed block of ``cross_entropy_forward_loop``'s rows taken into their running values:
    ``cols`` are [BLOCK_M, LANE_ROWS, LANES] (``_lane_columns``), ``_load`` adds the row starts
    along the first axis. With windows, columns of the window (``inner``, ``tail``: the row's
    whole groups); the row's own are ``row_cols``."""
    if ALIGN > 1:
        # Constant over each group (its bounds are multiples of ALIGN): vector loads.
        mask = (cols >= inner) & (cols < tail)
        col_mask = mask
        row_cols = cols - lead[:, None, None]
    else:
        col_mask = cols < n_cols
        mask = row_mask[:, None, None] & col_mask
        row_cols = cols
    x = _load(x_ptr, x_window[:, None], cols, x_col_stride, mask, -float("inf"), x_ptr.dtype.element_ty, ACC_FP64,
              EVICT)
    z, _ = _capped(x, mask, softcap, SOFTCAP)
    lane_max, lane_sum = _vector_update(lane_max, lane_sum, z, VEC)
    if PROB_TARGET or SMOOTHING:
        # Padding is -inf: kept out of every sum that multiplies it.
        finite_z = tl.where(mask, z, 0.0)
        w = _weights(weight_ptr, row_cols, col_mask, WEIGHT, ACC_FP64)
        if PROB_TARGET:
            wq = w * _smoothed(_load(target_ptr, target_base[:, None], cols, target_col_stride, mask, 0.0,
                                     target_ptr.dtype.element_ty, ACC_FP64, EVICT), mask, smoothing, n_cols,
                               SMOOTHING)
            lane_prob += _vector_sum(wq, VEC)
            lane_dot += _vector_sum(wq * finite_z, VEC)
        else:
            lane_dot += _vector_sum(w * finite_z, VEC)
    return lane_max, lane_sum, lane_dot, lane_prob


@_jit
def cross_entropy_forward_loop(
    x_ptr, target_ptr, weight_ptr, stats_ptr, loss_ptr, lse_ptr, grad_ptr,
    n_tiles, tiles_per_outer, rows_per_outer, n_cols,
    x_outer_stride, x_row_stride, x_col_stride, target_outer_stride, target_row_stride, target_col_stride,
    loss_outer_stride, loss_row_stride, loss_col_stride, lse_outer_stride, lse_row_stride, lse_col_stride,
    grad_outer_stride, grad_row_stride, grad_col_stride,
    ignore_index,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACC_FP64: tl.constexpr, WEIGHT: tl.constexpr,
    PROB_TARGET: tl.constexpr, SMOOTHING: tl.constexpr, Z_LOSS: tl.constexpr, SOFTCAP: tl.constexpr,
    WRITE_GRAD: tl.constexpr, ALIGN: tl.constexpr, DEPENDENT: tl.constexpr,
):
    # WRITE_GRAD: a second streamed pass writes the gradient. Its reads find the row in L2 (the
    # first pass asks to keep it there; the planner sizes the grid so that the rows streamed at
    # once fit: loss_planner.plan_loss), so memory sees one read and one write, as a held tile's.
    # The streamed pass keeps every running quantity per run of lanes ([BLOCK_M, runs],
    # ``_vector_update``) and reduces across threads once per row, after it: a block-wide
    # reduction (shuffles and barriers) per chunk would stall the loads of a memory-bound stream.
    # ALIGN > 1 (rows off 16-byte boundaries, bf16 rows of 50257: read one element an instruction,
    # the stream issue-bound): each row is read through its aligned window (``windows.py``), its
    # whole ALIGN-element groups as vectors in the chunks and the at most 2 * (ALIGN - 1) elements
    # that share a group with a neighbouring row (``_row_edges``) loaded apart, before the
    # stream, and folded into the row's sums after it. One row a tile (a window is a row's own);
    # the forward alone of class targets (the gradient's pass and probability targets' loads
    # take no windows).
    # (One condition each: triton-ascend's front end refuses a chain of three.)
    tl.static_assert(ALIGN == 1 or BLOCK_M == 1, "windows: one row a tile")
    tl.static_assert(ALIGN == 1 or not WRITE_GRAD, "windows: the forward alone")
    tl.static_assert(ALIGN == 1 or not PROB_TARGET, "windows: class targets")
    keep: tl.constexpr = "evict_last" if WRITE_GRAD else ""
    chunk_cols = tl.arange(0, BLOCK_N)[None, :]
    # A thread's 16-byte vector of x's elements (``_vector_update``).
    VEC: tl.constexpr = 128 // tl.constexpr(x_ptr.dtype.element_ty.primitive_bitwidth)
    block_cols = _lane_columns(BLOCK_N, LANE_WIDTH)
    _overlapped(DEPENDENT)
    ce_scale, z_scale, weight_sum, smoothing, z_loss, softcap = _constants(stats_ptr, ACC_FP64)
    for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        outer, rows, row_mask = _tile_rows(tile, tiles_per_outer, rows_per_outer, BLOCK_M, False)
        x_base = _row_starts(outer, rows, x_outer_stride, x_row_stride, False)
        target_base = _row_starts(outer, rows, target_outer_stride, target_row_stride, False)
        # The targets loaded before the stream and used after it: their logits' addresses wait for
        # them, and formed here they held the row's first block back by a round trip (sm_90).
        if not PROB_TARGET:
            target_index = _target_index(target_ptr, target_base, row_mask, ignore_index)
        if ALIGN > 1:
            x_window, lead, inner, tail = _streamed_window(x_base, row_mask, n_cols, ALIGN)
            inner, tail = inner[:, None, None], tail[:, None, None]
            span = n_cols + (ALIGN - 1)
            edge, edge_mask, z_edge, _ = _streamed_edges(x_ptr, x_window, lead, row_mask, n_cols, softcap, ACC_FP64,
                                                         ALIGN, SOFTCAP)
        else:
            # No windows: the row itself; the edge names stand for nothing (used under ALIGN > 1).
            x_window, lead, span = x_base, rows * 0, n_cols
            inner, tail = lead[:, None, None], lead[:, None, None]
            edge, edge_mask, z_edge = lead, row_mask, lead
        lane_max = _wide(tl.full([BLOCK_M, block_cols.shape[2] // VEC], -float("inf"), tl.float32), ACC_FP64)
        lane_sum = _wide(tl.zeros([BLOCK_M, block_cols.shape[2] // VEC], tl.float32), ACC_FP64)
        # The smoothing's sum_c w_c z_c, or a probability target's sum_c w_c q'_c and
        # sum_c w_c q'_c z_c, per run likewise.
        lane_dot = lane_sum
        lane_prob = lane_sum
        for start in tl.range(0, span, BLOCK_N):
            lane_max, lane_sum, lane_dot, lane_prob = _stream_block(
                x_ptr, target_ptr, weight_ptr, start + block_cols, x_window, x_col_stride, target_base,
                target_col_stride, row_mask, lead, inner, tail, n_cols, lane_max, lane_sum, lane_dot, lane_prob,
                smoothing, softcap, VEC, ACC_FP64, WEIGHT, PROB_TARGET, SMOOTHING, SOFTCAP, ALIGN, keep)
        if not PROB_TARGET:
            target, ignored, valid, no_hit, w_t = _class_terms_of(target_index, chunk_cols, weight_ptr, ignore_index,
                                                                  n_cols, row_mask, WEIGHT, ACC_FP64)
            z_t = _target_logit(x_ptr, x_base, x_col_stride, target, valid, row_mask, softcap, ACC_FP64, SOFTCAP)
        else:
            target = rows
            ignored = rows < 0
            valid = row_mask
        row_max, total = _lane_combine(lane_max, lane_sum)
        if ALIGN > 1:
            # The edges taken in as one more block (``_vector_update``'s step: against 0 while -inf or
            # once +inf).
            high = tl.maximum(row_max, tl.max(z_edge, 0))
            scaled_ref = _lse_reference(high) * LOG2E
            total = total * tl.exp2(row_max * LOG2E - scaled_ref) + tl.sum(
                tl.exp2(z_edge * LOG2E - tl.sum(scaled_ref, 0)), 0)
            row_max = high
        if PROB_TARGET:
            prob_sum = tl.sum(lane_prob, 1)
            prob_dot = tl.sum(lane_dot, 1)
            w_t = prob_sum
            z_t = prob_sum
            smooth_sum = prob_sum
        else:
            smooth_sum = tl.sum(lane_dot, 1) if SMOOTHING else z_t
            if SMOOTHING and ALIGN > 1:
                # The edges' terms, their weights at the row's own columns.
                w_edge = _weights(weight_ptr, edge - tl.sum(lead, 0), edge_mask, WEIGHT, ACC_FP64)
                smooth_sum += tl.sum(w_edge * tl.where(edge_mask, z_edge, 0.0), 0)
            prob_sum = z_t
            prob_dot = z_t
        lse = _row_lse(row_max, total)
        loss = _row_loss(lse, row_max, z_t, w_t, smooth_sum, prob_sum, prob_dot, ignored, valid, ce_scale, z_scale,
                         weight_sum, smoothing, z_loss, n_cols, PROB_TARGET, SMOOTHING, Z_LOSS)
        _store_rows(loss_ptr, lse_ptr, outer, rows, row_mask, loss_outer_stride, loss_row_stride, lse_outer_stride,
                    lse_row_stride, loss, lse, row_mask)
        if WRITE_GRAD:
            # The factor 1, a constant (the multiply folds away; a factor made from lse, NaN for a
            # row with a +inf logit, would turn an ignored row's zeros into NaN).
            grad_base = _row_starts(outer, rows, grad_outer_stride, grad_row_stride, False)
            _stream_gradient(x_ptr, x_base, x_col_stride, target_ptr, target_base, target_col_stride, weight_ptr,
                             grad_ptr, grad_base, grad_col_stride, row_mask, chunk_cols, n_cols, lse, target, w_t,
                             prob_sum, ignored, valid, _wide(tl.full([BLOCK_M], 1.0, tl.float32), ACC_FP64), ce_scale,
                             z_scale, weight_sum, smoothing, z_loss, softcap, lead, inner, tail, n_cols, BLOCK_N,
                             ACC_FP64, WEIGHT, PROB_TARGET, SMOOTHING, Z_LOSS, SOFTCAP, "evict_first", 1)


@_jit
def cross_entropy_backward(
    x_ptr, target_ptr, weight_ptr, stats_ptr, lse_ptr, dloss_ptr, grad_ptr,
    n_tiles, tiles_per_outer, rows_per_outer, n_cols,
    x_outer_stride, x_row_stride, x_col_stride, target_outer_stride, target_row_stride, target_col_stride,
    lse_outer_stride, lse_row_stride, lse_col_stride, dloss_outer_stride, dloss_row_stride, dloss_col_stride,
    grad_outer_stride, grad_row_stride, grad_col_stride,
    ignore_index,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACC_FP64: tl.constexpr, WEIGHT: tl.constexpr,
    PROB_TARGET: tl.constexpr, SMOOTHING: tl.constexpr, Z_LOSS: tl.constexpr, SOFTCAP: tl.constexpr,
    ALIGN: tl.constexpr = 1,
):
    # dloss: the incoming gradient, one value (strides 0) or one per position ('none').
    # ALIGN > 1 (rows off 16-byte boundaries, the gradient's equally far: ``window_align`` of both):
    # each row read and written through its aligned window, as the forward alone reads it (element
    # by element, bf16 rows of 50257 took 0.440 ms forward + backward against 0.316 at 50304, H200,
    # NOTES v53); a row a tile, class targets; the row's edges before its stream.
    # (One condition each: triton-ascend's front end refuses a chain of three.)
    tl.static_assert(ALIGN == 1 or BLOCK_M == 1, "windows: one row a tile")
    tl.static_assert(ALIGN == 1 or not PROB_TARGET, "windows: class targets")
    chunk_cols = tl.arange(0, BLOCK_N)[None, :]
    ce_scale, z_scale, weight_sum, smoothing, z_loss, softcap = _constants(stats_ptr, ACC_FP64)
    for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        outer, rows, row_mask = _tile_rows(tile, tiles_per_outer, rows_per_outer, BLOCK_M, False)
        x_base = _row_starts(outer, rows, x_outer_stride, x_row_stride, False)
        grad_base = _row_starts(outer, rows, grad_outer_stride, grad_row_stride, False)
        target_base = _row_starts(outer, rows, target_outer_stride, target_row_stride, False)
        lse = _wide(tl.load(lse_ptr + _row_starts(outer, rows, lse_outer_stride, lse_row_stride, False), mask=row_mask,
                            other=0.0), ACC_FP64)
        dloss = _wide(tl.load(dloss_ptr + _row_starts(outer, rows, dloss_outer_stride, dloss_row_stride, False),
                              mask=row_mask, other=0.0), ACC_FP64)
        if PROB_TARGET:
            # A = sum_c w_c q'_c first: a streamed pass over the targets alone.
            target = rows
            ignored = rows < 0
            valid = row_mask
            lane_prob = _wide(tl.zeros([BLOCK_M, BLOCK_N], tl.float32), ACC_FP64)
            for start in tl.range(0, n_cols, BLOCK_N):
                cols = start + chunk_cols
                mask = row_mask[:, None] & (cols < n_cols)
                q = _smoothed(_load(target_ptr, target_base, cols, target_col_stride, mask, 0.0,
                                    target_ptr.dtype.element_ty, ACC_FP64, ""), mask, smoothing, n_cols, SMOOTHING)
                lane_prob += _weights(weight_ptr, cols, cols < n_cols, WEIGHT, ACC_FP64) * q
            # Summed per lane while streaming, across threads once (cross_entropy_forward_loop).
            prob_sum = tl.sum(lane_prob, 1)
            w_t = prob_sum
        else:
            target, ignored, valid, no_hit, w_t = _class_terms(target_ptr, target_base, row_mask, chunk_cols,
                                                               weight_ptr, ignore_index, n_cols, WEIGHT, ACC_FP64)
            prob_sum = w_t
        if ALIGN > 1:
            x_window, lead, inner, tail = _streamed_window(x_base, row_mask, n_cols, ALIGN)
            # As far past its window as x's row (the planner's windows: both tensors' rows alike).
            grad_window = grad_base - lead
            inner, tail = inner[:, None], tail[:, None]
            span = n_cols + (ALIGN - 1)
            edge, edge_mask, z_edge, t_edge = _streamed_edges(x_ptr, x_window, lead, row_mask, n_cols, softcap,
                                                              ACC_FP64, ALIGN, SOFTCAP)
            # The edges' gradient, at the row's own columns (the stream's stores take the others).
            edge_cols = (edge - tl.sum(lead, 0))[None, :]
            w_edge = _weights(weight_ptr, edge_cols, edge_mask[None, :], WEIGHT, ACC_FP64)
            g_edge = _grad(z_edge[None, :], t_edge[None, :], lse, edge_cols == target[:, None], w_t, w_edge, w_edge,
                           prob_sum, ignored, valid, ce_scale, z_scale, weight_sum, smoothing, z_loss, n_cols,
                           PROB_TARGET, SMOOTHING, Z_LOSS, SOFTCAP)
            # Stored as a block of the row ([1, 2 * ALIGN]) from the stream's own base: from a
            # scalar taken of it (as the load's), triton-ascend's adapter left a conversion
            # unresolved.
            tl.store(grad_ptr + grad_window[:, None] + edge[None, :],
                     _cast(g_edge * dloss[:, None], grad_ptr.dtype.element_ty), mask=edge_mask[None, :])
        else:
            # No windows: the row itself (the window names stand for nothing under ALIGN 1).
            x_window, grad_window, lead, span = x_base, grad_base, rows * 0, n_cols
            inner, tail = lead[:, None], lead[:, None]
        _stream_gradient(x_ptr, x_window, x_col_stride, target_ptr, target_base, target_col_stride, weight_ptr,
                         grad_ptr, grad_window, grad_col_stride, row_mask, chunk_cols, n_cols, lse, target, w_t,
                         prob_sum, ignored, valid, dloss, ce_scale, z_scale, weight_sum, smoothing, z_loss, softcap,
                         lead, inner, tail, span, BLOCK_N, ACC_FP64, WEIGHT, PROB_TARGET, SMOOTHING, Z_LOSS, SOFTCAP,
                         "", ALIGN)


@_jit
def cross_entropy_grad_scale(grad_ptr, dloss_ptr, n_elements, BLOCK: tl.constexpr, ACC_FP64: tl.constexpr,
                             DEPENDENT: tl.constexpr):
    """``grad *= dloss`` over a dense buffer of ``n_elements``, unless dloss is 1: every program
    reads it and returns at once then (the usual ``loss.backward()``). ``DEPENDENT``: launched to
    overlap the kernel before it (``dependency.py``)."""
    _overlapped(DEPENDENT)
    dloss = _wide(tl.load(dloss_ptr), ACC_FP64)
    if dloss != 1.0:
        offsets = tl.arange(0, BLOCK)
        step = tl.num_programs(0).to(tl.int64) * BLOCK
        for start in tl.range(tl.program_id(0).to(tl.int64) * BLOCK, n_elements, step):
            where = start + offsets
            mask = where < n_elements
            g = _wide(tl.load(grad_ptr + where, mask=mask, other=0.0), ACC_FP64)
            tl.store(grad_ptr + where, _cast(g * dloss, grad_ptr.dtype.element_ty), mask=mask)


@_jit
def _counted_targets(target_ptr, where, mask, ignore_index):
    """The contiguous class targets at ``where`` (int64) and whether each is counted: in ``mask``
    and not ``ignore_index``. Masked by ``mask`` itself: ``other`` is cast to the target's dtype,
    which need not hold ignore_index (uint8 and -100)."""
    target = tl.load(target_ptr + where, mask=mask, other=0).to(tl.int64)
    return target, mask & (target != ignore_index)


@_jit
def cross_entropy_stats(target_ptr, weight_ptr, kept_ptr, stats_ptr, n_targets, n_classes, ignore_index,
                        BLOCK: tl.constexpr, WEIGHT: tl.constexpr, ACC_FP64: tl.constexpr, DEPENDENT: tl.constexpr):
    """``variants.LOSS_STATS`` of a 'mean' of class targets (a contiguous ``target`` of
    ``n_targets``): the summed weights of the counted targets (their count without ``WEIGHT``),
    their count, W (the summed class weights; without ``WEIGHT`` the kept C), then the kept values
    (``kept``: ``LOSS_STATS``' layout). One program, summing per lane then across: the same order,
    and result, every run. A target outside [0, C) reads no weight (its loss is NaN anyway).
    ``DEPENDENT``: launched to overlap the kernel before it (``dependency.py``)."""
    _overlapped(DEPENDENT)
    offsets = tl.arange(0, BLOCK)
    # The kept values read first, beside the targets: read after the stores below (which may
    # alias them, as far as the compiler knows) each would wait for its own round trip.
    places = tl.arange(0, 8)
    kept = tl.load(kept_ptr + places, mask=places < 6, other=0.0)
    # Per lane, int32 (a lane counts one target a block); the total in int64.
    count = tl.zeros([BLOCK], tl.int32)
    summed = _wide(tl.zeros([BLOCK], tl.float32), ACC_FP64)
    for start in tl.range(0, n_targets, BLOCK):
        where = start + offsets
        mask = where < n_targets
        target, counted = _counted_targets(target_ptr, where, mask, ignore_index)
        count += counted.to(tl.int32)
        if WEIGHT:
            valid = counted & (target >= 0) & (target < n_classes)
            summed += _wide(tl.load(weight_ptr + tl.where(valid, target, 0), mask=valid, other=0.0), ACC_FP64)
    counted_sum = _wide(tl.sum(count.to(tl.int64), 0), ACC_FP64)
    if WEIGHT:
        totals = _wide(tl.zeros([BLOCK], tl.float32), ACC_FP64)
        for start in tl.range(0, n_classes, BLOCK):
            classes = start + offsets
            totals += _wide(tl.load(weight_ptr + classes, mask=classes < n_classes, other=0.0), ACC_FP64)
        ce_denominator = tl.sum(summed, 0)
        weight_sum = tl.sum(totals, 0)
    else:
        ce_denominator = counted_sum
        weight_sum = _wide(tl.sum(tl.where(places == 2, kept, 0.0), 0), ACC_FP64)
    # One store of the six: the three formed here, then the kept ones.
    ty = stats_ptr.dtype.element_ty
    stats = tl.where(places == 0, _cast(ce_denominator, ty),
                     tl.where(places == 1, _cast(counted_sum, ty),
                              tl.where(places == 2, _cast(weight_sum, ty), kept.to(ty))))
    tl.store(stats_ptr + places, stats, mask=places < 6)


@_jit
def cross_entropy_sum(terms_ptr, target_ptr, out_ptr, n_terms, n_targets, ignore_index, BLOCK: tl.constexpr,
                      ACC_FP64: tl.constexpr, COUNTED: tl.constexpr, DEPENDENT: tl.constexpr):
    """The sum of the ``n_terms`` contiguous ``terms`` (the rows' losses of a 'mean' or 'sum',
    already scaled, or a split plan's shares of them; at most ``BLOCK``), rounded once to ``out``'s
    dtype. One program, one block, every load in flight at once: the same order, and result, every
    run. (Blocks walked one after another by one program cost a round trip each: 7.4 us for two
    on the H200; more terms take torch's sum, ``loss_reduction._launched_sum``.)

    ``COUNTED``: the terms are unscaled (the forward alone of an unweighted 'mean' of class
    targets) and the sum is divided by the count of the ``n_targets`` contiguous class targets
    (at most ``BLOCK``) that are not ``ignore_index``, loaded beside the terms: the mean in this
    one launch where the stats took one more before the forward (``loss_reduction.counted_mean``).
    ``DEPENDENT``: launched to overlap the kernel before it (``dependency.py``)."""
    _overlapped(DEPENDENT)
    where = tl.arange(0, BLOCK)
    total = tl.sum(_wide(tl.load(terms_ptr + where, mask=where < n_terms, other=0.0), ACC_FP64), 0)
    if COUNTED:
        _, counted = _counted_targets(target_ptr, where, where < n_targets, ignore_index)
        # 0 / 0 where every target is ignored: NaN, as torch's.
        total = total / _wide(tl.sum(counted.to(tl.int32), 0).to(tl.float32), ACC_FP64)
    tl.store(out_ptr, _cast(total, out_ptr.dtype.element_ty))
