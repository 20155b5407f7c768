"""A tile of one row off 16-byte boundaries, read through its aligned window (``windows.py``): the
tile kernels' ``ALIGN`` > 1 (``rows.py``). A bf16 row of 4095 columns held as one tile was read
and written an element an instruction: 0.75 of copy forward and 0.68 backward on the H200 where
4096 columns read 0.94 and 1.11 (NOTES v52). Through the window, the row's whole ALIGN-element
groups move as vectors under a mask constant over each group, and its at most 2 * (ALIGN - 1)
edge elements (``windows._row_edges``) travel in a small block of their own that joins the row's
maximum and sums and is stored apart: a split row's single chunk, without the exchange.

The window's bulk fits the tile's block: its last whole group ends at or before
``ceil(n_cols / ALIGN) * ALIGN``, which is no wider than the block (a power of two, at least
ALIGN, at least ``n_cols``). One row a tile (``BLOCK_M`` 1), float32 accumulation (the edges are
float32), no causal ladder: the planner offers windows to those tiles alone
(``planner.select_config``)."""
from .jit import _jit, _language, tl  # noqa: F401 (_language: see jit.py)
from .common import LOG2E, _grad, _grad_terms, _load, _normalized
from .fused import _emptied, _fused_grad, _fused_input, _fused_terms
from .windows import _chunk_mask, _edge_load, _edge_store, _output_window, _row_edges, _window_start, _window_store


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
    mask = _chunk_mask(cols, lead, n_cols, row_mask, ALIGN)
    y_base = _output_window(y_row, lead, ALIGN, SHIFTED)
    keep: tl.constexpr = "evict_last" if REREAD else ""
    x = _load(x_ptr, x_base, cols, x_col_stride, mask, -float("inf"), y_ptr.dtype.element_ty, False, keep)
    x = _fused(x, cols - lead[:, None], mask, outer, rows, row_mask, rows_per_outer, n_cols, mask_ptr, scale_ptr,
               scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride,
               scale_a_stride, scale_b_stride, scale_q_stride, SCALE, MASK)
    first = tl.sum(lead, 0)
    edge, edge_mask = _row_edges(lead, n_cols, row_mask, ALIGN)
    x_edge = _edge_load(x_ptr, x_base, edge, edge_mask, -float("inf"), y_ptr.dtype.element_ty)[None, :]
    x_edge = _fused(x_edge, (edge - first)[None, :], edge_mask[None, :], outer, rows, row_mask, rows_per_outer,
                    n_cols, mask_ptr, scale_ptr, scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride,
                    mask_q_stride, mask_k_stride, scale_a_stride, scale_b_stride, scale_q_stride, SCALE, MASK)
    row_max = tl.maximum(tl.max(x, 1), tl.max(x_edge, 1))
    z = x - row_max[:, None]
    z_edge = x_edge - row_max[:, None]
    e_edge = tl.exp2(z_edge * LOG2E)
    total = tl.sum(tl.exp2(z * LOG2E), 1) + tl.sum(e_edge, 1)
    if REREAD:
        # As the held tile's twice-read form: the bulk read again (from L2) rather than held
        # across the row's sum; the edges are a few registers, held.
        x = _load(x_ptr, x_base, cols, x_col_stride, mask, -float("inf"), y_ptr.dtype.element_ty, False,
                  "evict_first")
        x = _fused(x, cols - lead[:, None], mask, outer, rows, row_mask, rows_per_outer, n_cols, mask_ptr, scale_ptr,
                   scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride,
                   scale_a_stride, scale_b_stride, scale_q_stride, SCALE, MASK)
        z = x - row_max[:, None]
    scale = (1.0 / total)[:, None]
    shift = -tl.log(total)[:, None]
    out = _emptied(_normalized(z, tl.exp2(z * LOG2E), scale, shift, LOG), row_max[:, None], LOG, MASK)
    _window_store(y_ptr, y_base, cols, y_col_stride, mask, out, lead, n_cols, row_mask, 0, BLOCK_N, ALIGN, SHIFTED)
    out_edge = _emptied(_normalized(z_edge, e_edge, scale, shift, LOG), row_max[:, None], LOG, MASK)
    _edge_store(y_ptr, y_base, edge, edge_mask, tl.sum(out_edge, 0))


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
    mask = _chunk_mask(cols, lead, n_cols, row_mask, ALIGN)
    dy_base = _window_start(dy_row, ALIGN)
    dx_base = _output_window(dx_row, lead, ALIGN, SHIFTED)
    keep: tl.constexpr = "evict_last" if REREAD else ""
    y = _load(y_ptr, y_base, cols, y_col_stride, mask, 0.0, y_ptr.dtype.element_ty, False, keep)
    dy = _load(dy_ptr, dy_base, cols, dy_col_stride, mask, 0.0, dy_ptr.dtype.element_ty, False, keep)
    edge, edge_mask = _row_edges(lead, n_cols, row_mask, ALIGN)
    y_edge = _edge_load(y_ptr, y_base, edge, edge_mask, 0.0, y_ptr.dtype.element_ty)[None, :]
    dy_edge = _edge_load(dy_ptr, dy_base, edge, edge_mask, 0.0, dy_ptr.dtype.element_ty)[None, :]
    row_sum = (tl.sum(_grad_terms(y, dy, LOG), 1) + tl.sum(_grad_terms(y_edge, dy_edge, LOG), 1))[:, None]
    if REREAD:
        y = _load(y_ptr, y_base, cols, y_col_stride, mask, 0.0, y_ptr.dtype.element_ty, False, "evict_first")
        dy = _load(dy_ptr, dy_base, cols, dy_col_stride, mask, 0.0, dy_ptr.dtype.element_ty, False, "evict_first")
    at = cols - lead[:, None]
    dx = _fused_grad(_grad(y, dy, row_sum, LOG), outer, rows, row_mask, rows_per_outer, at, mask, mask_ptr,
                     scale_ptr, scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride,
                     mask_k_stride, scale_a_stride, scale_b_stride, scale_q_stride, SCALE, MASK, False)
    _window_store(dx_ptr, dx_base, cols, dx_col_stride, mask, dx, lead, n_cols, row_mask, 0, BLOCK_N, ALIGN, SHIFTED)
    dx_edge = _fused_grad(_grad(y_edge, dy_edge, row_sum, LOG), outer, rows, row_mask, rows_per_outer,
                          (edge - tl.sum(lead, 0))[None, :], edge_mask[None, :], mask_ptr, scale_ptr, scale_value,
                          n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride,
                          scale_a_stride, scale_b_stride, scale_q_stride, SCALE, MASK, False)
    _edge_store(dx_ptr, dx_base, edge, edge_mask, tl.sum(dx_edge, 0))


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
