"""Streamed kernels of rows cut into parts, in two launches, no program waiting on another: rows
sharded across ranks (``distributed.py``: each rank holds a slice of every row, a collective
between the launches), and long rows cut into ``n_slices`` slices of ``slice_cols`` columns (the
``sliced`` regime, ``strided_planner._strided_config``: long reductions along a strided dimension).

The first launch writes each part's partials in one read (forward: maximum and sum of
exponentials; backward: the sum the gradient needs); the second combines the ``n_ranks`` parts'
partials of its rows (the ranks' after a gather, or the slices') in a fixed order and writes its
part of the output. Items are (tile, slice), tiles fastest, so that programs running together
read adjacent rows. Rows are streamed in chunks (long vocabulary slices) or held in tiles of
several rows, as the loop kernels stream them. Partials are float32 (float64 where the call
accumulates in float64): ``stats_ptr`` holds [parts, rows] of two (maximum, sum) forward, of one
(sum) backward, by the part, then the row's index in the view."""
from .jit import _jit, _language, tl  # noqa: F401 (_language: see jit.py)
from .common import LOG2E, _grad, _load, _normalized, _row_starts, _store, _tile_rows
from .fused import _fused_row_terms
from .rows import _grad_sums, _online_stats


@_jit
def softmax_forward_partials(
    x_ptr, stats_ptr, n_tiles, tiles_per_outer, rows_per_outer, n_cols, n_slices, slice_cols,
    x_outer_stride, x_row_stride, x_col_stride,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACC_FP64: tl.constexpr,
):
    for item in tl.range(tl.program_id(0), n_tiles * n_slices, tl.num_programs(0)):
        outer, rows, row_mask, first, length, stat_rows = _part_item(item, n_tiles, tiles_per_outer, rows_per_outer,
                                                                     n_cols, slice_cols, BLOCK_M)
        x_base = _part_start(outer, rows, first, x_outer_stride, x_row_stride, x_col_stride)
        # x in its own dtype: ``distributed`` casts first where ``dtype=`` asks for another.
        # No fusion: x stands in for the mask and scale tensors, never read (the rows' terms are
        # constants).
        x_scale, where, q = _fused_row_terms(outer, rows, row_mask, rows_per_outer, x_ptr, 1.0, 1, 1, 0, 0, 0, 0, 0, 0,
                                             0, 0, False)
        row_max, _, total = _online_stats(x_ptr, x_base, row_mask, length, x_col_stride, x_scale, where, q, x_ptr, 0,
                                          x_ptr.dtype.element_ty, BLOCK_M, BLOCK_N, ACC_FP64, 0, 0, False)
        # One [BLOCK_M, 2] block (maximum, sum): a structured store, which triton-ascend's lowering
        # takes where two stores two elements apart it does not.
        pair = tl.arange(0, 2)[None, :]
        where = stats_ptr + stat_rows[:, None] * 2 + pair
        tl.store(where, tl.where(pair == 0, row_max[:, None], total[:, None]), mask=row_mask[:, None])


@_jit
def softmax_forward_normalize(
    x_ptr, stats_ptr, y_ptr, n_tiles, tiles_per_outer, rows_per_outer, n_cols, n_slices, slice_cols, n_ranks,
    x_outer_stride, x_row_stride, x_col_stride, y_outer_stride, y_row_stride, y_col_stride,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOG: tl.constexpr, ACC_FP64: tl.constexpr,
    RANKS_P2: tl.constexpr,
):
    # stats_ptr: every part's partials, [n_ranks, rows, 2] (one all-gather, or the first launch).
    chunk_cols = tl.arange(0, BLOCK_N)
    for item in tl.range(tl.program_id(0), n_tiles * n_slices, tl.num_programs(0)):
        outer, rows, row_mask, first, length, _ = _part_item(item, n_tiles, tiles_per_outer, rows_per_outer, n_cols,
                                                             slice_cols, BLOCK_M)
        x_base = _part_start(outer, rows, first, x_outer_stride, x_row_stride, x_col_stride)
        y_base = _part_start(outer, rows, first, y_outer_stride, y_row_stride, y_col_stride)
        where, present = _parts_read(stats_ptr, outer, rows, row_mask, n_tiles, tiles_per_outer, rows_per_outer,
                                     n_ranks, 2, RANKS_P2)
        peer_max = tl.load(where, mask=present, other=-float("inf"))
        peer_sum = tl.load(where + 1, mask=present, other=0.0)
        row_max = tl.max(peer_max, 1)
        # A part of a row that is -inf only adds 0 * exp(-inf) = 0; a row of -inf only gives
        # -inf - -inf = NaN, as torch does.
        total = tl.sum(peer_sum * tl.exp2((peer_max - row_max[:, None]) * LOG2E), 1)
        ref = tl.where(row_max == -float("inf"), 0.0, row_max)
        scale = 1.0 / total
        shift = -tl.log(total)
        for start in tl.range(0, length, BLOCK_N):
            cols = start + chunk_cols
            mask = row_mask[:, None] & (cols < length)[None, :]
            x = _load(x_ptr, x_base, cols[None, :], x_col_stride, mask, -float("inf"), y_ptr.dtype.element_ty,
                      ACC_FP64, "")
            z = x - ref[:, None]
            _store(y_ptr, y_base, cols[None, :], y_col_stride, mask,
                   _normalized(z, tl.exp2(z * LOG2E), scale[:, None], shift[:, None], LOG))


@_jit
def softmax_backward_partials(
    y_ptr, dy_ptr, stats_ptr, n_tiles, tiles_per_outer, rows_per_outer, n_cols, n_slices, slice_cols,
    y_outer_stride, y_row_stride, y_col_stride, dy_outer_stride, dy_row_stride, dy_col_stride,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOG: tl.constexpr, ACC_FP64: tl.constexpr,
):
    chunk_cols = tl.arange(0, BLOCK_N)
    for item in tl.range(tl.program_id(0), n_tiles * n_slices, tl.num_programs(0)):
        outer, rows, row_mask, first, length, stat_rows = _part_item(item, n_tiles, tiles_per_outer, rows_per_outer,
                                                                     n_cols, slice_cols, BLOCK_M)
        y_base = _part_start(outer, rows, first, y_outer_stride, y_row_stride, y_col_stride)
        dy_base = _part_start(outer, rows, first, dy_outer_stride, dy_row_stride, dy_col_stride)
        row_sum = _grad_sums(y_ptr, dy_ptr, y_base, dy_base, row_mask, length, y_col_stride, dy_col_stride,
                             chunk_cols, BLOCK_M, BLOCK_N, LOG, ACC_FP64, True)
        tl.store(stats_ptr + stat_rows, row_sum, mask=row_mask)


@_jit
def softmax_backward_normalize(
    y_ptr, dy_ptr, stats_ptr, dx_ptr, n_tiles, tiles_per_outer, rows_per_outer, n_cols, n_slices, slice_cols,
    n_ranks, y_outer_stride, y_row_stride, y_col_stride, dy_outer_stride, dy_row_stride, dy_col_stride,
    dx_outer_stride, dx_row_stride, dx_col_stride,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOG: tl.constexpr, ACC_FP64: tl.constexpr,
    RANKS_P2: tl.constexpr,
):
    # stats_ptr: the parts' sums, [n_ranks, rows] (the slices'; sharded rows pass one, all-reduced).
    chunk_cols = tl.arange(0, BLOCK_N)
    for item in tl.range(tl.program_id(0), n_tiles * n_slices, tl.num_programs(0)):
        outer, rows, row_mask, first, length, _ = _part_item(item, n_tiles, tiles_per_outer, rows_per_outer, n_cols,
                                                             slice_cols, BLOCK_M)
        y_base = _part_start(outer, rows, first, y_outer_stride, y_row_stride, y_col_stride)
        dy_base = _part_start(outer, rows, first, dy_outer_stride, dy_row_stride, dy_col_stride)
        dx_base = _part_start(outer, rows, first, dx_outer_stride, dx_row_stride, dx_col_stride)
        where, present = _parts_read(stats_ptr, outer, rows, row_mask, n_tiles, tiles_per_outer, rows_per_outer,
                                     n_ranks, 1, RANKS_P2)
        row_sum = tl.sum(tl.load(where, mask=present, other=0.0), 1)
        for start in tl.range(0, length, BLOCK_N):
            cols = (start + chunk_cols)[None, :]
            mask = row_mask[:, None] & (cols < length)
            _grad_block(y_ptr, dy_ptr, dx_ptr, y_base, dy_base, dx_base, cols, mask, row_sum,
                        y_col_stride, dy_col_stride, dx_col_stride, LOG, ACC_FP64, "")


@_jit
def _part_item(item, n_tiles, tiles_per_outer, rows_per_outer, n_cols, slice_cols, BLOCK_M: tl.constexpr):
    """Item ``item``'s tile (group, rows, which exist), its slice, the slice's first column and
    its length, and where the slice's partials of the rows lie (``_part_rows``)."""
    tile = item % n_tiles
    part = item // n_tiles
    outer, rows, row_mask = _tile_rows(tile, tiles_per_outer, rows_per_outer, BLOCK_M, False)
    first = part * slice_cols
    length = tl.minimum(slice_cols, n_cols - first)
    return outer, rows, row_mask, first, length, _part_rows(part, outer, rows, n_tiles, tiles_per_outer,
                                                            rows_per_outer)


@_jit
def _part_rows(part, outer, rows, n_tiles, tiles_per_outer, rows_per_outer):
    """Where part ``part``'s partials of ``rows`` lie among all parts' ([parts, rows of the view],
    in partials, int64)."""
    all_rows = n_tiles // tiles_per_outer * rows_per_outer
    return part.to(tl.int64) * all_rows + _stat_rows(outer, rows, rows_per_outer)


@_jit
def _stat_rows(outer, rows, rows_per_outer):
    """The index of each row of a tile among all rows of the view: its partials' row."""
    return outer * rows_per_outer + rows


@_jit
def _part_start(outer, rows, first, outer_stride, row_stride, col_stride):
    """Each row's first element of its part (int64 offsets)."""
    return _row_starts(outer, rows, outer_stride, row_stride, False) + first.to(tl.int64) * col_stride


@_jit
def _parts_read(stats_ptr, outer, rows, row_mask, n_tiles, tiles_per_outer, rows_per_outer, n_ranks,
                WIDTH: tl.constexpr, RANKS_P2: tl.constexpr):
    """Where every part's partials of the tile's rows lie ([BLOCK_M, RANKS_P2], in units of
    ``WIDTH`` values), and which exist."""
    ranks = tl.arange(0, RANKS_P2)
    where = _part_rows(ranks[None, :], outer, rows[:, None], n_tiles, tiles_per_outer, rows_per_outer) * WIDTH
    return stats_ptr + where, row_mask[:, None] & (ranks < n_ranks)[None, :]


@_jit
def _grad_block(y_ptr, dy_ptr, dx_ptr, y_base, dy_base, dx_base, cols, mask, row_sum,
                y_col_stride, dy_col_stride, dx_col_stride, LOG: tl.constexpr, ACC_FP64: tl.constexpr,
                EVICT: tl.constexpr):
    """Write dx at block columns ``cols`` from y and dy read there."""
    y = _load(y_ptr, y_base, cols, y_col_stride, mask, 0.0, y_ptr.dtype.element_ty, ACC_FP64, EVICT)
    dy = _load(dy_ptr, dy_base, cols, dy_col_stride, mask, 0.0, dy_ptr.dtype.element_ty, ACC_FP64, EVICT)
    _store(dx_ptr, dx_base, cols, dx_col_stride, mask, _grad(y, dy, row_sum[:, None], LOG))
