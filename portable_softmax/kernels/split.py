"""The split regime (``*_split``): a row is cut into ``CHUNKS`` chunks held by ``CHUNKS``
programs at once; they trade partial results through a small global scratch (``exchange.py``)
and then write what they hold: still one read, one write, for rows far larger than a program's
registers. Waiting on a peer is only safe when the peer runs too: either the whole grid is
resident at once (a persistent grid sized from the device's occupancy), or each program takes its
item by ticket as it starts (``_split_items``), which needs only a row's chunks resident at once.
Only on backends that can promise residency. A persistent program that steps through several
items may be software-pipelined (``STAGES`` > 1): its next chunks are copied into shared memory
while it waits on its current row. Rows off 16-byte boundaries are read through aligned windows
(``windows.py``).

Where programs cannot wait on each other at all (Triton's interpreter runs them one after
another), the same kernels run in two launches (``PHASE``, ``exchange.EXCHANGE_*``): the first
computes each chunk's partials and publishes them, the second computes them again, reads its
rows' from every chunk's slot and writes its chunk. Everything else (windows, fused terms,
tickets, tiles of several rows, pipelined stages) is the same code in every phase.

The two kernels, then how programs take their items."""
from .jit import _jit, _language, tl  # noqa: F401 (_language: see jit.py)
from .common import LOG2E, _grad, _grad_terms, _load, _normalized, _row_starts, _tile_rows
from .fused import _emptied, _fused_grad, _fused_input, _fused_load, _fused_terms
from .windows import (_chunk_mask, _edge_columns, _edge_load, _edge_store, _output_window, _split_window, _window_start,
    _window_store)
from .exchange import EXCHANGE_PUBLISH, _empty_last, _empty_previous, _exchange, _float_bits


@_jit
def softmax_forward_split(
    x_ptr, y_ptr, mask_ptr, scale_ptr, slot_ptr, done_ptr, n_items, tiles_per_outer, rows_per_outer, n_cols,
    x_outer_stride, x_row_stride, x_col_stride, y_outer_stride, y_row_stride, y_col_stride,
    scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride,
    scale_a_stride, scale_b_stride, scale_q_stride,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr,
    LOG: tl.constexpr, ALIGN: tl.constexpr, TICKETED: tl.constexpr, STAGES: tl.constexpr,
    WAIT_ATOMIC: tl.constexpr, SHIFTED: tl.constexpr, SCALE: tl.constexpr, MASK: tl.constexpr,
    CAUSAL: tl.constexpr, PHASE: tl.constexpr,
):
    # Aligned windows take a chunk of one row; tiles of several rows are rows adjacent in memory.
    # SCALE, MASK, CAUSAL: the fused variants (_fused_terms), at the row's own columns (a
    # window's less its lead); unpipelined, what CAUSAL masks is not read.
    tl.static_assert(BLOCK_M == 1 or ALIGN == 1, "windows take one row at a time")
    fused: tl.constexpr = (SCALE != 0 or MASK != 0) or CAUSAL
    chunk_cols = tl.arange(0, BLOCK_N)
    first, stop, step = _split_items(n_items, done_ptr, TICKETED)
    for item in tl.range(first, stop, step, num_stages=STAGES):
        tile, chunk, outer, rows, row_mask, cols = _split_item(
            item, tiles_per_outer, rows_per_outer, chunk_cols, BLOCK_M, BLOCK_N, CHUNKS)
        x_base, lead, mask = _split_window(outer, rows, row_mask, cols, n_cols, x_outer_stride, x_row_stride, ALIGN)
        y_base = _output_window(_row_starts(outer, rows, y_outer_stride, y_row_stride, False), lead, ALIGN, SHIFTED)
        # One past the chunk's last column (_fused_input); windows' masks leave their edges out.
        if ALIGN > 1:
            chunk_end = n_cols + 1
        else:
            chunk_end = (chunk + 1) * BLOCK_N
        if STAGES > 1:
            # Zero-filled, as the pipelined copy fills; padded with -inf under the later mask, or
            # the load's would be carried.
            x = _load(x_ptr, x_base, cols, x_col_stride, mask, 0.0, y_ptr.dtype.element_ty, False, "")
            cols, mask = _staged_columns(item, cols, mask, lead, n_cols, row_mask, chunk_cols, BLOCK_N, CHUNKS,
                                         ALIGN, STAGES)
            x = tl.where(mask, x, -float("inf"))
            if fused:
                scale, bias = _fused_terms(outer, rows, row_mask, rows_per_outer, cols - lead[:, None], mask, mask_ptr,
                                           scale_ptr, scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride,
                                           mask_q_stride, mask_k_stride, scale_a_stride, scale_b_stride,
                                           scale_q_stride, SCALE, MASK, CAUSAL)
                x = _fused_input(x, scale, bias, mask, row_mask, chunk_end, n_cols, BLOCK_M, SCALE, MASK,
                                 MASK != 0 or CAUSAL, CAUSAL)
        else:
            x = _fused_load(x_ptr, x_base, cols, cols - lead[:, None], x_col_stride, mask, chunk_end, n_cols,
                            y_ptr.dtype.element_ty, False, outer, rows, row_mask, rows_per_outer, mask_ptr, scale_ptr,
                            scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride,
                            mask_k_stride, scale_a_stride, scale_b_stride, scale_q_stride, BLOCK_M, SCALE,
                            MASK, CAUSAL)
        chunk_max = tl.max(x, 1)
        if ALIGN > 1:
            edge, edge_mask = _edge_columns(lead, n_cols, row_mask, chunk * BLOCK_N, BLOCK_N, ALIGN)
            x_edge = _edge_load(x_ptr, x_base, edge, edge_mask, -float("inf"), y_ptr.dtype.element_ty)
            if fused:
                scale, bias = _fused_terms(outer, rows, row_mask, rows_per_outer, (edge - tl.sum(lead, 0))[None, :],
                                           edge_mask[None, :], mask_ptr, scale_ptr, scale_value, n_heads, n_queries,
                                           mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride,
                                           scale_a_stride, scale_b_stride, scale_q_stride, SCALE, MASK, CAUSAL)
                x_edge = tl.sum(_fused_input(x_edge[None, :], scale, bias, edge_mask[None, :], row_mask, n_cols + 1,
                                             n_cols, BLOCK_M, SCALE, MASK, MASK != 0 or CAUSAL, CAUSAL), 0)
            chunk_max = tl.maximum(chunk_max, tl.max(x_edge, 0))
        # A chunk with no finite value must not turn its exponentials into NaN: -inf - -inf.
        ref = tl.where(chunk_max == -float("inf"), 0.0, chunk_max)
        z = x - ref[:, None]
        # One exponential per element: kept and rescaled once the row's maximum is known.
        e = tl.exp2(z * LOG2E)
        total = tl.sum(e, 1)
        if ALIGN > 1:
            z_edge = x_edge - tl.sum(ref, 0)
            e_edge = tl.exp2(z_edge * LOG2E)
            total += tl.sum(e_edge, 0)
        packed = (_float_bits(chunk_max) << 32) | _float_bits(total)
        row_max, row_total = _exchange(slot_ptr, done_ptr, tile, chunk, row_mask, packed, BLOCK_M, CHUNKS,
                                       CHUNKS_P2, True, STAGES, WAIT_ATOMIC, PHASE)
        # A publishing launch writes nothing: the next one writes every chunk.
        if PHASE != EXCHANGE_PUBLISH:
            # From the published maximum, not ref: a chunk of -inf only scales its zeros by 0.
            scale = tl.exp2((chunk_max - row_max) * LOG2E) / row_total
            shift = chunk_max - row_max - tl.log(row_total)
            out = _normalized(z, e, scale[:, None], shift[:, None], LOG)
            # A tile's maxima are [BLOCK_M]; a row's, a scalar.
            if BLOCK_M > 1:
                out = _emptied(out, row_max[:, None], LOG, MASK)
            else:
                out = _emptied(out, row_max, LOG, MASK)
            _window_store(y_ptr, y_base, cols, y_col_stride, mask, out, lead, n_cols, row_mask, chunk * BLOCK_N,
                          BLOCK_N, ALIGN, SHIFTED)
            if ALIGN > 1:
                _edge_store(y_ptr, y_base, edge, edge_mask,
                            _emptied(_normalized(z_edge, e_edge, tl.sum(scale, 0), tl.sum(shift, 0), LOG), row_max,
                                     LOG, MASK))
        _empty_previous(slot_ptr, tile, chunk, tiles_per_outer, rows_per_outer, BLOCK_M, CHUNKS, CHUNKS_P2, TICKETED,
                        PHASE)
    _empty_last(slot_ptr, done_ptr, n_items, tiles_per_outer, rows_per_outer, BLOCK_M, CHUNKS, CHUNKS_P2, TICKETED,
                PHASE)


@_jit
def softmax_backward_split(
    y_ptr, dy_ptr, dx_ptr, mask_ptr, scale_ptr, slot_ptr, done_ptr, n_items, tiles_per_outer, rows_per_outer, n_cols,
    y_outer_stride, y_row_stride, y_col_stride, dy_outer_stride, dy_row_stride, dy_col_stride,
    dx_outer_stride, dx_row_stride, dx_col_stride,
    scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride,
    scale_a_stride, scale_b_stride, scale_q_stride,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr,
    LOG: tl.constexpr, ALIGN: tl.constexpr, TICKETED: tl.constexpr, STAGES: tl.constexpr,
    WAIT_ATOMIC: tl.constexpr, SHIFTED: tl.constexpr, SCALE: tl.constexpr, MASK: tl.constexpr,
    CAUSAL: tl.constexpr, PHASE: tl.constexpr,
):
    # Aligned windows take a chunk of one row; tiles of several rows are rows adjacent in memory.
    tl.static_assert(BLOCK_M == 1 or ALIGN == 1, "windows take one row at a time")
    chunk_cols = tl.arange(0, BLOCK_N)
    first, stop, step = _split_items(n_items, done_ptr, TICKETED)
    for item in tl.range(first, stop, step, num_stages=STAGES):
        tile, chunk, outer, rows, row_mask, cols = _split_item(
            item, tiles_per_outer, rows_per_outer, chunk_cols, BLOCK_M, BLOCK_N, CHUNKS)
        y_base, lead, mask = _split_window(outer, rows, row_mask, cols, n_cols, y_outer_stride, y_row_stride, ALIGN)
        dy_base = _window_start(_row_starts(outer, rows, dy_outer_stride, dy_row_stride, False), ALIGN)
        dx_base = _output_window(_row_starts(outer, rows, dx_outer_stride, dx_row_stride, False), lead, ALIGN,
                                 SHIFTED)
        y = _load(y_ptr, y_base, cols, y_col_stride, mask, 0.0, y_ptr.dtype.element_ty, False, "")
        dy = _load(dy_ptr, dy_base, cols, dy_col_stride, mask, 0.0, dy_ptr.dtype.element_ty, False, "")
        cols, mask = _staged_columns(item, cols, mask, lead, n_cols, row_mask, chunk_cols, BLOCK_N, CHUNKS, ALIGN,
                                     STAGES)
        partial = tl.sum(_grad_terms(y, dy, LOG), 1)
        if ALIGN > 1:
            edge, edge_mask = _edge_columns(lead, n_cols, row_mask, chunk * BLOCK_N, BLOCK_N, ALIGN)
            y_edge = _edge_load(y_ptr, y_base, edge, edge_mask, 0.0, y_ptr.dtype.element_ty)
            dy_edge = _edge_load(dy_ptr, dy_base, edge, edge_mask, 0.0, dy_ptr.dtype.element_ty)
            partial += tl.sum(_grad_terms(y_edge, dy_edge, LOG), 0)
        _, row_sum = _exchange(slot_ptr, done_ptr, tile, chunk, row_mask, _float_bits(partial), BLOCK_M, CHUNKS,
                               CHUNKS_P2, False, STAGES, WAIT_ATOMIC, PHASE)
        # A publishing launch writes nothing: the next one writes every chunk.
        if PHASE != EXCHANGE_PUBLISH:
            if BLOCK_M > 1:
                row_sum = row_sum[:, None]
            dx = _fused_grad(_grad(y, dy, row_sum, LOG), outer, rows, row_mask, rows_per_outer, cols - lead[:, None],
                             mask, mask_ptr, scale_ptr, scale_value, n_heads, n_queries, mask_a_stride,
                             mask_b_stride, mask_q_stride, mask_k_stride, scale_a_stride, scale_b_stride,
                             scale_q_stride, SCALE, MASK, CAUSAL)
            _window_store(dx_ptr, dx_base, cols, dx_col_stride, mask, dx, lead, n_cols, row_mask, chunk * BLOCK_N,
                          BLOCK_N, ALIGN, SHIFTED)
            if ALIGN > 1:
                dx_edge = _fused_grad(_grad(y_edge, dy_edge, row_sum, LOG)[None, :], outer, rows, row_mask,
                                      rows_per_outer, (edge - tl.sum(lead, 0))[None, :], edge_mask[None, :], mask_ptr,
                                      scale_ptr, scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride,
                                      mask_q_stride, mask_k_stride, scale_a_stride, scale_b_stride, scale_q_stride,
                                      SCALE, MASK, CAUSAL)
                _edge_store(dx_ptr, dx_base, edge, edge_mask, tl.sum(dx_edge, 0))
        _empty_previous(slot_ptr, tile, chunk, tiles_per_outer, rows_per_outer, BLOCK_M, CHUNKS, CHUNKS_P2, TICKETED,
                        PHASE)
    _empty_last(slot_ptr, done_ptr, n_items, tiles_per_outer, rows_per_outer, BLOCK_M, CHUNKS, CHUNKS_P2, TICKETED,
                PHASE)


@_jit
def _split_items(n_items, done_ptr, TICKETED: tl.constexpr):
    """The items a split program takes, as ``tl.range(first, stop, step)``.

    Persistent (the grid is resident at once): every grid-th item from the program's id.
    Ticketed (a program per item): the one item numbered by the order in which programs start,
    drawn from the counter at ``done_ptr``. Every lower item then belongs to a program that has
    started, so a row's programs wait only on started peers or on peers that start as soon as a
    complete row ends: the grid need not be resident, only a row's chunks at once. The last to
    draw resets the counter for the next launch (every draw is then done).
    """
    if TICKETED:
        first = tl.atomic_add(done_ptr, 1, sem="relaxed")
        tl.store(done_ptr, 0, mask=first == n_items - 1)
        stop = first + 1
    else:
        first = tl.program_id(0)
        stop = n_items
    return first, stop, 1 if TICKETED else tl.num_programs(0)


@_jit
def _split_item(item, tiles_per_outer, rows_per_outer, chunk_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                CHUNKS: tl.constexpr):
    """The tile and chunk of a split-path work item, with its rows and columns ([1, BLOCK_N])."""
    # The grid is a multiple of CHUNKS, so the CHUNKS programs of a tile run in one wave.
    tile = item // CHUNKS
    chunk = item - tile * CHUNKS
    outer, rows, row_mask = _tile_rows(tile, tiles_per_outer, rows_per_outer, BLOCK_M, False)
    return tile, chunk, outer, rows, row_mask, (chunk * BLOCK_N + chunk_cols)[None, :]


@_jit
def _staged_columns(item, cols, mask, lead, n_cols, row_mask, chunk_cols, BLOCK_N: tl.constexpr,
                    CHUNKS: tl.constexpr, ALIGN: tl.constexpr, STAGES: tl.constexpr):
    """The columns ([1, BLOCK_N]) of ``item``'s chunk and their ``_chunk_mask``, for what follows
    the loads. A pipelined loop (``STAGES`` > 1) runs the loads stages ahead and would carry the
    values they share with the rest from stage to stage, a register per element each: there
    they are computed again from the item, in a form (a remainder) that common-subexpression
    elimination keeps apart."""
    if STAGES > 1:
        cols = ((item % CHUNKS) * BLOCK_N + chunk_cols)[None, :]
        mask = _chunk_mask(cols, lead, n_cols, row_mask, ALIGN)
    return cols, mask
