"""A tile of one row off 16-byte boundaries, read through its aligned window (``windows.py``): the
tile kernels' ``ALIGN`` > 1 (``rows.py``). A bf16 row of 4095 columns held as one tile was read
and written an element an instruction: 0.75 of copy forward and 0.66 backward on the H200 where
4096 columns read 0.94 and 1.11 (NOTES v52). Through the window, the row's whole ALIGN-element
groups move as vectors under a mask constant over each group (``windows._chunk_mask``), and its
at most 2 * (ALIGN - 1) edge elements, which share a group with a neighbouring row, are loaded and
stored in place, in the same block, under a mask that holds only at them: each thread's
instructions for the other elements are predicated off and move nothing. So the row's maximum
and sums stay one reduction each. (Edges in a small block of their own, as the split kernels'
chunks take them, cost two reductions more, each across the program's warps: 4096x4095 read 0.78
/ 0.77 so, 0.99 / 1.12 without the edges, NOTES v52.)

The window's bulk fits the tile's block: its last whole group ends at or before
``ceil(n_cols / ALIGN) * ALIGN``, which is no wider than the block (a power of two, at least
ALIGN, at least ``n_cols``). One row a tile (``BLOCK_M`` 1), float32 accumulation, no causal
ladder: the planner offers windows to those tiles alone (``planner._tile_window``)."""
from .jit import _jit, _language, tl  # noqa: F401 (_language: see jit.py)
from .common import LOG2E, _grad, _grad_terms, _load, _normalized, _store
from .fused import _emptied, _fused_grad, _fused_input, _fused_terms
from .windows import _chunk_mask, _output_window, _window_start, _window_store


@_jit
def _forward_window(x_ptr, y_ptr, mask_ptr, scale_ptr, outer, rows, row_mask, rows_per_outer, n_cols, x_row, y_row,
                    x_col_stride, y_col_stride, scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride,
                    mask_q_stride, mask_k_stride, scale_a_stride, scale_b_stride, scale_q_stride,
                    BLOCK_N: tl.constexpr, LOG: tl.constexpr, REREAD: tl.constexpr, SCALE: tl.constexpr,
                    MASK: tl.constexpr, ALIGN: tl.constexpr, SHIFTED: tl.constexpr):
    """The forward tile (``rows._forward_tile``) of the row starting at ``x_row`` (its output's at
    ``y_row``) through its window; the fused terms at the row's own columns (the window's less
    its lead)."""
    cols = tl.arange(0, BLOCK_N)[None, :]
    x_base = _window_start(x_row, ALIGN)
    lead = (x_row - x_base).to(tl.int32)
    groups, edges, inside = _window_masks(cols, lead, n_cols, row_mask, ALIGN)
    y_base = _output_window(y_row, lead, ALIGN, SHIFTED)
    x = _window_load(x_ptr, x_base, cols, x_col_stride, groups, edges, -float("inf"), y_ptr.dtype.element_ty,
                     "evict_last" if REREAD else "")
    x = _fused(x, cols - lead[:, None], inside, outer, rows, row_mask, rows_per_outer, n_cols, mask_ptr, scale_ptr,
               scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride,
               scale_a_stride, scale_b_stride, scale_q_stride, SCALE, MASK)
    row_max = tl.max(x, 1)
    z = x - row_max[:, None]
    e = tl.exp2(z * LOG2E)
    total = tl.sum(e, 1)
    if REREAD:
        # As the held tile's twice-read form: read again (from L2) rather than held across the sum.
        x = _window_load(x_ptr, x_base, cols, x_col_stride, groups, edges, -float("inf"), y_ptr.dtype.element_ty,
                         "evict_first")
        x = _fused(x, cols - lead[:, None], inside, outer, rows, row_mask, rows_per_outer, n_cols, mask_ptr,
                   scale_ptr, scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride,
                   mask_k_stride, scale_a_stride, scale_b_stride, scale_q_stride, SCALE, MASK)
        z = x - row_max[:, None]
        e = tl.exp2(z * LOG2E)
    out = _emptied(_normalized(z, e, (1.0 / total)[:, None], -tl.log(total)[:, None], LOG), row_max[:, None], LOG,
                   MASK)
    _window_store(y_ptr, y_base, cols, y_col_stride, groups, out, lead, n_cols, row_mask, 0, BLOCK_N, ALIGN, SHIFTED)
    _store(y_ptr, y_base, cols, y_col_stride, edges, out)


@_jit
def _backward_window(y_ptr, dy_ptr, dx_ptr, mask_ptr, scale_ptr, outer, rows, row_mask, rows_per_outer, n_cols,
                     y_row, dy_row, dx_row, y_col_stride, dy_col_stride, dx_col_stride, scale_value, n_heads,
                     n_queries, mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride, scale_a_stride,
                     scale_b_stride, scale_q_stride, BLOCK_N: tl.constexpr, LOG: tl.constexpr,
                     REREAD: tl.constexpr, SCALE: tl.constexpr, MASK: tl.constexpr, ALIGN: tl.constexpr,
                     SHIFTED: tl.constexpr):
    """The backward tile (``rows.softmax_backward_tile``) of the row whose y, dy and dx start at
    ``y_row``, ``dy_row`` and ``dx_row`` through their window (y's and dy's rows lie equally far
    past an aligned element: ``planner.window_align``)."""
    cols = tl.arange(0, BLOCK_N)[None, :]
    y_base = _window_start(y_row, ALIGN)
    lead = (y_row - y_base).to(tl.int32)
    groups, edges, inside = _window_masks(cols, lead, n_cols, row_mask, ALIGN)
    dy_base = _window_start(dy_row, ALIGN)
    dx_base = _output_window(dx_row, lead, ALIGN, SHIFTED)
    keep: tl.constexpr = "evict_last" if REREAD else ""
    y = _window_load(y_ptr, y_base, cols, y_col_stride, groups, edges, 0.0, y_ptr.dtype.element_ty, keep)
    dy = _window_load(dy_ptr, dy_base, cols, dy_col_stride, groups, edges, 0.0, dy_ptr.dtype.element_ty, keep)
    row_sum = tl.sum(_grad_terms(y, dy, LOG), 1)[:, None]
    if REREAD:
        y = _window_load(y_ptr, y_base, cols, y_col_stride, groups, edges, 0.0, y_ptr.dtype.element_ty, "evict_first")
        dy = _window_load(dy_ptr, dy_base, cols, dy_col_stride, groups, edges, 0.0, dy_ptr.dtype.element_ty,
                          "evict_first")
    dx = _fused_grad(_grad(y, dy, row_sum, LOG), outer, rows, row_mask, rows_per_outer, cols - lead[:, None], inside,
                     mask_ptr, scale_ptr, scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride,
                     mask_q_stride, mask_k_stride, scale_a_stride, scale_b_stride, scale_q_stride, SCALE, MASK, False)
    _window_store(dx_ptr, dx_base, cols, dx_col_stride, groups, dx, lead, n_cols, row_mask, 0, BLOCK_N, ALIGN, SHIFTED)
    _store(dx_ptr, dx_base, cols, dx_col_stride, edges, dx)


@_jit
def _window_masks(cols, lead, n_cols, row_mask, ALIGN: tl.constexpr):
    """A window row's masks over its block: its whole groups (``windows._chunk_mask``), its edges
    (its elements in groups it shares with a neighbouring row) and the two together."""
    groups = _chunk_mask(cols, lead, n_cols, row_mask, ALIGN)
    first = lead[:, None]
    inside = (cols >= first) & (cols < tl.where(row_mask[:, None], first + n_cols, 0))
    return groups, inside & (groups == 0), inside


@_jit
def _window_load(ptr, base, cols, col_stride, groups, edges, OTHER: tl.constexpr, CAST_TY: tl.constexpr,
                 EVICT: tl.constexpr):
    """A window row's block: its whole groups as vectors, its edges in place (each a load of its
    own, the rest of those loads predicated off), ``OTHER`` elsewhere."""
    bulk = _load(ptr, base, cols, col_stride, groups, OTHER, CAST_TY, False, EVICT)
    edge = _load(ptr, base, cols, col_stride, edges, OTHER, CAST_TY, False, EVICT)
    return tl.where(edges, edge, bulk)


@_jit
def _fused(x, at, valid, outer, rows, row_mask, rows_per_outer, n_cols, mask_ptr, scale_ptr, scale_value, n_heads,
           n_queries, mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride, scale_a_stride, scale_b_stride,
           scale_q_stride, SCALE: tl.constexpr, MASK: tl.constexpr):
    """The fused input ``x * scale + bias`` (``fused._fused_input``) of the window's columns that
    are the row's columns ``at``, -inf where not ``valid`` (the window's masks leave out what
    lies past the row: its ``end`` is past ``n_cols``); plain calls take x as loaded."""
    if SCALE != 0 or MASK != 0:
        scale, bias = _fused_terms(outer, rows, row_mask, rows_per_outer, at, valid, mask_ptr, scale_ptr,
                                   scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride,
                                   mask_k_stride, scale_a_stride, scale_b_stride, scale_q_stride, SCALE, MASK, False)
        x = _fused_input(x, scale, bias, valid, row_mask, n_cols + 1, n_cols, 1, SCALE, MASK, MASK != 0, False)
    return x
