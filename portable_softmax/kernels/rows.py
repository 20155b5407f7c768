"""The tile and loop kernels, forward and backward: a row held by one program (``*_tile``: one
read, one write) or streamed twice in chunks (``*_loop``: an online maximum and sum, then the
output; no program waits on another, so every backend runs it)."""
from .jit import _jit, _language, tl  # noqa: F401 (_language: see jit.py)
from .common import (LOG2E, _grad, _grad_terms, _lane_columns, _lane_combine, _lane_update, _load,
    _normalized, _row_starts, _store, _tile_items, _tile_mask, _tile_rows, _wide)
from .fused import (_causal_reads, _emptied, _fused_grad, _fused_input, _fused_load_rows, _fused_row_terms,
    _fused_rows, _fused_terms)
from .tile_windows import _backward_window, _forward_window


@_jit
def softmax_forward_tile(
    x_ptr, y_ptr, mask_ptr, scale_ptr, n_tiles, tiles_per_outer, rows_per_outer, n_cols,
    x_outer_stride, x_row_stride, x_col_stride, y_outer_stride, y_row_stride, y_col_stride,
    scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride,
    scale_a_stride, scale_b_stride, scale_q_stride,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOG: tl.constexpr, ACC_FP64: tl.constexpr, REREAD: tl.constexpr,
    PER_TILE: tl.constexpr, DENSE: tl.constexpr, SCALE: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
    ALIGN: tl.constexpr = 1, SHIFTED: tl.constexpr = False,
):
    # ALIGN > 1: a row off 16-byte boundaries read through its aligned window (``tile_windows.py``;
    # SHIFTED: its output written at the input's window columns). A default, which leaves the
    # other tiles' compiled variants (``kernel_resources``' keys) as they were.
    tl.static_assert(ALIGN == 1 or ((BLOCK_M == 1 and not CAUSAL) and not ACC_FP64),
                     "windows take one row at a time, not causal, float32 accumulation")
    # REREAD: x is read again (from L2) for the output, and its exponentials computed again,
    # rather than held across the row's sum (see softmax_backward_tile). SCALE, MASK, CAUSAL: the
    # fused variants (_fused_terms); a row the bool mask leaves empty gives 0 (log: -inf).
    # A causal tile computes only as wide as its rows reach (a quarter, a half or the whole
    # block): skipping the loads of the masked half alone left the kernel bound by its
    # arithmetic on the H200 (a minimal causal softmax of (4, 32, 4096, 4096) bf16 read 0.84 of
    # copy whole-width, 0.92 so; its traffic alone, 0.94: NOTES v19).
    LADDER: tl.constexpr = (CAUSAL and not REREAD) and BLOCK_N >= 256
    start, stop, step, offset = _tile_items(n_tiles, PER_TILE)
    for item in tl.range(start, stop, step):
        tile = offset + item
        outer, rows, row_mask = _tile_rows(tile, tiles_per_outer, rows_per_outer, BLOCK_M, DENSE)
        x_base = _row_starts(outer, rows, x_outer_stride, x_row_stride, DENSE)
        y_base = _row_starts(outer, rows, y_outer_stride, y_row_stride, DENSE)
        if ALIGN > 1:
            _forward_window(x_ptr, y_ptr, mask_ptr, scale_ptr, outer, rows, row_mask, rows_per_outer, n_cols, x_base,
                            y_base, x_col_stride, y_col_stride, scale_value, n_heads, n_queries, mask_a_stride,
                            mask_b_stride, mask_q_stride, mask_k_stride, scale_a_stride, scale_b_stride,
                            scale_q_stride, BLOCK_N, LOG, REREAD, SCALE, MASK, ALIGN, SHIFTED)
        elif LADDER:
            _, query = _fused_rows(outer, rows, rows_per_outer, n_heads, n_queries, 0, 0, 0)
            reach = tl.max(tl.where(row_mask, query, 0), 0) + 1
            if reach <= BLOCK_N // 4:
                _forward_tile(x_ptr, y_ptr, mask_ptr, scale_ptr, outer, rows, row_mask, rows_per_outer, n_cols,
                              x_base, y_base, x_col_stride, y_col_stride, scale_value, n_heads, n_queries,
                              mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride, scale_a_stride,
                              scale_b_stride, scale_q_stride, BLOCK_M, BLOCK_N // 4, LOG, ACC_FP64, REREAD, DENSE,
                              SCALE, MASK, CAUSAL, True)
            elif reach <= BLOCK_N // 2:
                _forward_tile(x_ptr, y_ptr, mask_ptr, scale_ptr, outer, rows, row_mask, rows_per_outer, n_cols,
                              x_base, y_base, x_col_stride, y_col_stride, scale_value, n_heads, n_queries,
                              mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride, scale_a_stride,
                              scale_b_stride, scale_q_stride, BLOCK_M, BLOCK_N // 2, LOG, ACC_FP64, REREAD, DENSE,
                              SCALE, MASK, CAUSAL, True)
            else:
                _forward_tile(x_ptr, y_ptr, mask_ptr, scale_ptr, outer, rows, row_mask, rows_per_outer, n_cols,
                              x_base, y_base, x_col_stride, y_col_stride, scale_value, n_heads, n_queries,
                              mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride, scale_a_stride,
                              scale_b_stride, scale_q_stride, BLOCK_M, BLOCK_N, LOG, ACC_FP64, REREAD, DENSE,
                              SCALE, MASK, CAUSAL, False)
        else:
            _forward_tile(x_ptr, y_ptr, mask_ptr, scale_ptr, outer, rows, row_mask, rows_per_outer, n_cols, x_base,
                          y_base, x_col_stride, y_col_stride, scale_value, n_heads, n_queries, mask_a_stride,
                          mask_b_stride, mask_q_stride, mask_k_stride, scale_a_stride, scale_b_stride,
                          scale_q_stride, BLOCK_M, BLOCK_N, LOG, ACC_FP64, REREAD, DENSE, SCALE, MASK, CAUSAL, False)


@_jit
def _forward_tile(x_ptr, y_ptr, mask_ptr, scale_ptr, outer, rows, row_mask, rows_per_outer, n_cols, x_base, y_base,
                  x_col_stride, y_col_stride, scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride,
                  mask_q_stride, mask_k_stride, scale_a_stride, scale_b_stride, scale_q_stride,
                  BLOCK_M: tl.constexpr, WIDTH: tl.constexpr, LOG: tl.constexpr, ACC_FP64: tl.constexpr,
                  REREAD: tl.constexpr, DENSE: tl.constexpr, SCALE: tl.constexpr, MASK: tl.constexpr,
                  CAUSAL: tl.constexpr, TAIL: tl.constexpr):
    """A tile's output over its first ``WIDTH`` columns. With ``TAIL`` these hold every column
    its rows keep (causal rows that end early), and the rest of each row gets what a masked
    element gives: 0 (log: -inf), or NaN where the row's maximum makes it NaN (a row of -inf or
    NaN), as the whole-width tile and torch's composite give."""
    cols = tl.arange(0, WIDTH)[None, :]
    keep: tl.constexpr = "evict_last" if REREAD else ""
    mask = _tile_mask(row_mask, cols, n_cols, WIDTH, DENSE)
    # -inf padding adds exp(-inf) = 0 to the sum and cannot win the max. What causal masks is
    # not read (a causal row reads half of what it holds). The loads go before the fused terms
    # (_fused_load).
    reads = _causal_reads(mask, cols, outer, rows, rows_per_outer, n_heads, n_queries, CAUSAL)
    x = _load(x_ptr, x_base, cols, x_col_stride, reads, -float("inf"), y_ptr.dtype.element_ty, ACC_FP64, keep)
    scale, bias = _fused_terms(outer, rows, row_mask, rows_per_outer, cols, mask, mask_ptr, scale_ptr, scale_value,
                               n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride,
                               scale_a_stride, scale_b_stride, scale_q_stride, SCALE, MASK, CAUSAL)
    x = _fused_input(x, scale, bias, reads, row_mask, WIDTH, n_cols, BLOCK_M, SCALE, MASK, MASK != 0, CAUSAL)
    row_max = tl.max(x, 1)
    z = x - row_max[:, None]
    e = tl.exp2(z * LOG2E)
    total = tl.sum(e, 1)
    if REREAD:
        x = _load(x_ptr, x_base, cols, x_col_stride, reads, -float("inf"), y_ptr.dtype.element_ty, ACC_FP64,
                  "evict_first")
        x = _fused_input(x, scale, bias, reads, row_mask, WIDTH, n_cols, BLOCK_M, SCALE, MASK, MASK != 0, CAUSAL)
        z = x - row_max[:, None]
        e = tl.exp2(z * LOG2E)
    out = _normalized(z, e, (1.0 / total)[:, None], -tl.log(total)[:, None], LOG)
    _store(y_ptr, y_base, cols, y_col_stride, mask, _emptied(out, row_max[:, None], LOG, MASK))
    if TAIL:
        z_tail = -float("inf") - row_max[:, None]
        tail = _normalized(z_tail, tl.exp2(z_tail * LOG2E), (1.0 / total)[:, None], -tl.log(total)[:, None], LOG)
        tail = _emptied(tail, row_max[:, None], LOG, MASK) + tl.zeros([BLOCK_M, WIDTH], tail.dtype)
        for start in tl.range(WIDTH, n_cols, WIDTH):
            _store(y_ptr, y_base, start + cols, y_col_stride, row_mask[:, None] & (start + cols < n_cols), tail)


@_jit
def softmax_forward_loop(
    x_ptr, y_ptr, mask_ptr, scale_ptr, n_tiles, tiles_per_outer, rows_per_outer, n_cols,
    x_outer_stride, x_row_stride, x_col_stride, y_outer_stride, y_row_stride, y_col_stride,
    scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride,
    scale_a_stride, scale_b_stride, scale_q_stride,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOG: tl.constexpr, ACC_FP64: tl.constexpr,
    SCALE: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
):
    chunk_cols = tl.arange(0, BLOCK_N)
    for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        outer, rows, row_mask = _tile_rows(tile, tiles_per_outer, rows_per_outer, BLOCK_M, False)
        if BLOCK_M == 1:
            # A tile of one row is a row (a group's tiles are its rows: variants.counts): no mask.
            row_mask = tl.full([BLOCK_M], 1, tl.int1)
        x_base = _row_starts(outer, rows, x_outer_stride, x_row_stride, False)
        y_base = _row_starts(outer, rows, y_outer_stride, y_row_stride, False)
        # The fused terms' row quantities once a row, for both passes (_fused_row_terms).
        x_scale, where, q = _fused_row_terms(outer, rows, row_mask, rows_per_outer, scale_ptr, scale_value, n_heads,
                                             n_queries, mask_a_stride, mask_b_stride, mask_q_stride, scale_a_stride,
                                             scale_b_stride, scale_q_stride, SCALE, MASK, CAUSAL)
        # Causal compares q with 32-bit columns: as 32 bits, one compare an element, not two (q
        # past the row's end keeps every column either way).
        q = tl.minimum(q, n_cols).to(tl.int32)
        row_max, ref, total = _online_stats(x_ptr, x_base, row_mask, n_cols, x_col_stride, x_scale, where, q, mask_ptr,
                                            mask_k_stride, y_ptr.dtype.element_ty, BLOCK_M, BLOCK_N, ACC_FP64, SCALE,
                                            MASK, CAUSAL)
        scale = 1.0 / total
        shift = -tl.log(total)
        for start in tl.range(0, n_cols, BLOCK_N):
            cols = start + chunk_cols
            mask = row_mask[:, None] & (cols < n_cols)[None, :]
            x = _fused_load_rows(x_ptr, x_base, cols[None, :], x_col_stride, mask, start + BLOCK_N, n_cols,
                                 y_ptr.dtype.element_ty, ACC_FP64, row_mask, x_scale, where, q, mask_ptr,
                                 mask_k_stride, BLOCK_M, SCALE, MASK, CAUSAL, False)
            z = x - ref[:, None]
            out = _normalized(z, tl.exp2(z * LOG2E), scale[:, None], shift[:, None], LOG)
            _store(y_ptr, y_base, cols[None, :], y_col_stride, mask, _emptied(out, row_max[:, None], LOG, MASK))


@_jit
def _online_stats(x_ptr, x_base, row_mask, n_cols, x_col_stride, x_scale, where, q, mask_ptr, mask_k_stride,
                  CAST_TY: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACC_FP64: tl.constexpr,
                  SCALE: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr):
    """One streamed pass over rows (chunks of ``BLOCK_N`` columns) of the fused input
    (``_fused_load_rows``, from the rows' terms ``x_scale``, ``where`` and ``q``): each row's
    maximum, the reference its exponentials are taken against (the maximum, or 0 for a row of
    -inf only), and their sum.

    A row streamed alone (``BLOCK_M`` 1) keeps a maximum and sum per lane of blocks laid out in
    lane rows (``_lane_columns``), each block reduced within a thread, and reduces across threads
    once (``_lane_combine``): a block-wide reduction (shuffles, shared memory, barriers) per block
    would stall the loads of a memory-bound stream. Its threads take 16 columns of a block each
    (the tuning's ``elements_per_thread``), a 16-byte vector of the narrowest element read a
    column (x's, or a mask's) is 16 / bytes of them, so that as many lane rows as that element
    has bytes keep the middle axis within every thread (bf16: 2, float32: 4). With one (a bool
    mask's bytes), for tiles of rows, or for blocks narrower than a warp of 64 threads' 16
    columns (a short row held in one block), a lane's rescale, an exponential, would come with
    every element, or the layout's premise fails: the block is reduced across threads instead."""
    # Wrapped: Triton 3.2 adds a constexpr literal to a plain int as NotImplemented.
    X_BYTES: tl.constexpr = tl.constexpr(x_ptr.dtype.element_ty.primitive_bitwidth) // 8
    MASK_BYTES: tl.constexpr = ((tl.constexpr(mask_ptr.dtype.element_ty.primitive_bitwidth) + 7) // 8 if MASK != 0
                                else X_BYTES)
    LANE_ROWS: tl.constexpr = X_BYTES if X_BYTES < MASK_BYTES else MASK_BYTES
    if (BLOCK_M == 1 and LANE_ROWS > 1) and BLOCK_N >= 1024:
        LANES: tl.constexpr = BLOCK_N // LANE_ROWS
        block_cols = _lane_columns(BLOCK_N, LANES)
        lane_max = _wide(tl.full([BLOCK_M, LANES], -float("inf"), tl.float32), ACC_FP64)
        lane_sum = _wide(tl.zeros([BLOCK_M, LANES], tl.float32), ACC_FP64)
        for start in tl.range(0, n_cols, BLOCK_N):
            # [BLOCK_M, LANE_ROWS, LANES]: the row quantities as [BLOCK_M, 1] (_fused_load_rows).
            cols = start + block_cols
            mask = row_mask[:, None, None] & (cols < n_cols)
            x = _fused_load_rows(x_ptr, x_base[:, None], cols, x_col_stride, mask, start + BLOCK_N, n_cols, CAST_TY,
                                 ACC_FP64, row_mask[:, None], x_scale[:, None], where[:, None], q[:, None], mask_ptr,
                                 mask_k_stride, BLOCK_M, SCALE, MASK, CAUSAL, True)
            lane_max, lane_sum = _lane_update(lane_max, lane_sum, x)
        row_max, total = _lane_combine(lane_max, lane_sum)
        ref = tl.where(row_max == -float("inf"), 0.0, row_max)
    else:
        chunk_cols = tl.arange(0, BLOCK_N)
        row_max = _wide(tl.full([BLOCK_M], -float("inf"), tl.float32), ACC_FP64)
        total = _wide(tl.zeros([BLOCK_M], tl.float32), ACC_FP64)
        ref = _wide(tl.zeros([BLOCK_M], tl.float32), ACC_FP64)
        for start in tl.range(0, n_cols, BLOCK_N):
            cols = start + chunk_cols
            mask = row_mask[:, None] & (cols < n_cols)[None, :]
            x = _fused_load_rows(x_ptr, x_base, cols[None, :], x_col_stride, mask, start + BLOCK_N, n_cols, CAST_TY,
                                 ACC_FP64, row_mask, x_scale, where, q, mask_ptr, mask_k_stride, BLOCK_M, SCALE, MASK,
                                 CAUSAL, True)
            new_max = tl.maximum(row_max, tl.max(x, 1))
            new_ref = tl.where(new_max == -float("inf"), 0.0, new_max)
            # Rescaled from the previous maximum, not its reference: while that maximum is -inf the
            # sum is 0, and 0 * exp(0 - new_ref) is 0 * inf = NaN once new_ref is below about -88.
            total = total * tl.exp2((row_max - new_ref) * LOG2E) + tl.sum(tl.exp2((x - new_ref[:, None]) * LOG2E), 1)
            row_max = new_max
            ref = new_ref
    return row_max, ref, total


@_jit
def softmax_backward_tile(
    y_ptr, dy_ptr, dx_ptr, mask_ptr, scale_ptr, n_tiles, tiles_per_outer, rows_per_outer, n_cols,
    y_outer_stride, y_row_stride, y_col_stride, dy_outer_stride, dy_row_stride, dy_col_stride,
    dx_outer_stride, dx_row_stride, dx_col_stride,
    scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride,
    scale_a_stride, scale_b_stride, scale_q_stride,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOG: tl.constexpr, ACC_FP64: tl.constexpr, REREAD: tl.constexpr,
    PER_TILE: tl.constexpr, DENSE: tl.constexpr, SCALE: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
    ALIGN: tl.constexpr = 1, SHIFTED: tl.constexpr = False,
):
    # ALIGN, SHIFTED: as softmax_forward_tile's.
    tl.static_assert(ALIGN == 1 or ((BLOCK_M == 1 and not CAUSAL) and not ACC_FP64),
                     "windows take one row at a time, not causal, float32 accumulation")
    # REREAD: y and dy are read again for dx rather than held across the row's sum. The second
    # read finds them in L2 (the first asked it to keep them), and the tile's registers hold one
    # use at a time: half as many, so that wide programs stay resident in numbers (torch.compile's
    # backward does this).
    cols = tl.arange(0, BLOCK_N)[None, :]
    keep: tl.constexpr = "evict_last" if REREAD else ""
    start, stop, step, offset = _tile_items(n_tiles, PER_TILE)
    for item in tl.range(start, stop, step):
        tile = offset + item
        outer, rows, row_mask = _tile_rows(tile, tiles_per_outer, rows_per_outer, BLOCK_M, DENSE)
        y_base = _row_starts(outer, rows, y_outer_stride, y_row_stride, DENSE)
        dy_base = _row_starts(outer, rows, dy_outer_stride, dy_row_stride, DENSE)
        dx_base = _row_starts(outer, rows, dx_outer_stride, dx_row_stride, DENSE)
        if ALIGN > 1:
            _backward_window(y_ptr, dy_ptr, dx_ptr, mask_ptr, scale_ptr, outer, rows, row_mask, rows_per_outer, n_cols,
                             y_base, dy_base, dx_base, y_col_stride, dy_col_stride, dx_col_stride, scale_value,
                             n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride,
                             scale_a_stride, scale_b_stride, scale_q_stride, BLOCK_N, LOG, REREAD, SCALE, MASK, ALIGN,
                             SHIFTED)
        else:
            mask = _tile_mask(row_mask, cols, n_cols, BLOCK_N, DENSE)
            y = _load(y_ptr, y_base, cols, y_col_stride, mask, 0.0, y_ptr.dtype.element_ty, ACC_FP64, keep)
            dy = _load(dy_ptr, dy_base, cols, dy_col_stride, mask, 0.0, dy_ptr.dtype.element_ty, ACC_FP64, keep)
            row_sum = tl.sum(_grad_terms(y, dy, LOG), 1)
            if REREAD:
                y = _load(y_ptr, y_base, cols, y_col_stride, mask, 0.0, y_ptr.dtype.element_ty, ACC_FP64, "evict_first")
                dy = _load(dy_ptr, dy_base, cols, dy_col_stride, mask, 0.0, dy_ptr.dtype.element_ty, ACC_FP64,
                           "evict_first")
            dx = _fused_grad(_grad(y, dy, row_sum[:, None], LOG), outer, rows, row_mask, rows_per_outer, cols, mask,
                             mask_ptr, scale_ptr, scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride,
                             mask_q_stride, mask_k_stride, scale_a_stride, scale_b_stride, scale_q_stride,
                             SCALE, MASK, CAUSAL)
            _store(dx_ptr, dx_base, cols, dx_col_stride, mask, dx)


@_jit
def softmax_backward_loop(
    y_ptr, dy_ptr, dx_ptr, mask_ptr, scale_ptr, n_tiles, tiles_per_outer, rows_per_outer, n_cols,
    y_outer_stride, y_row_stride, y_col_stride, dy_outer_stride, dy_row_stride, dy_col_stride,
    dx_outer_stride, dx_row_stride, dx_col_stride,
    scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride,
    scale_a_stride, scale_b_stride, scale_q_stride,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOG: tl.constexpr, ACC_FP64: tl.constexpr,
    SCALE: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
):
    chunk_cols = tl.arange(0, BLOCK_N)
    for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        outer, rows, row_mask = _tile_rows(tile, tiles_per_outer, rows_per_outer, BLOCK_M, False)
        y_base = _row_starts(outer, rows, y_outer_stride, y_row_stride, False)
        dy_base = _row_starts(outer, rows, dy_outer_stride, dy_row_stride, False)
        dx_base = _row_starts(outer, rows, dx_outer_stride, dx_row_stride, False)
        row_sum = _grad_sums(y_ptr, dy_ptr, y_base, dy_base, row_mask, n_cols, y_col_stride, dy_col_stride,
                             chunk_cols, BLOCK_M, BLOCK_N, LOG, ACC_FP64, False)
        for start in tl.range(0, n_cols, BLOCK_N):
            cols = (start + chunk_cols)[None, :]
            mask = row_mask[:, None] & (cols < n_cols)
            y = _load(y_ptr, y_base, cols, y_col_stride, mask, 0.0, y_ptr.dtype.element_ty, ACC_FP64, "")
            dy = _load(dy_ptr, dy_base, cols, dy_col_stride, mask, 0.0, dy_ptr.dtype.element_ty, ACC_FP64, "")
            dx = _fused_grad(_grad(y, dy, row_sum[:, None], LOG), outer, rows, row_mask, rows_per_outer, cols, mask,
                             mask_ptr, scale_ptr, scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride,
                             mask_q_stride, mask_k_stride, scale_a_stride, scale_b_stride, scale_q_stride,
                             SCALE, MASK, CAUSAL)
            _store(dx_ptr, dx_base, cols, dx_col_stride, mask, dx)


@_jit
def _grad_sums(y_ptr, dy_ptr, y_base, dy_base, row_mask, n_cols, y_col_stride, dy_col_stride, chunk_cols,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOG: tl.constexpr, ACC_FP64: tl.constexpr,
               PER_ELEMENT: tl.constexpr):
    """One streamed pass over rows: the row sums of ``_grad_terms``. ``PER_ELEMENT``: summed per
    element of the block and across it once at the end, so that the loop holds no reduction
    across threads (the sliced backward's partials: the bf16 column of (32768, 1024) 0.53 -> 0.57 of
    copy on the H200)."""
    if PER_ELEMENT:
        if ACC_FP64:
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float64)
        else:
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    elif ACC_FP64:
        acc = tl.zeros([BLOCK_M], tl.float64)
    else:
        acc = tl.zeros([BLOCK_M], tl.float32)
    for start in tl.range(0, n_cols, BLOCK_N):
        cols = (start + chunk_cols)[None, :]
        mask = row_mask[:, None] & (cols < n_cols)
        y = _load(y_ptr, y_base, cols, y_col_stride, mask, 0.0, y_ptr.dtype.element_ty, ACC_FP64, "")
        dy = _load(dy_ptr, dy_base, cols, dy_col_stride, mask, 0.0, dy_ptr.dtype.element_ty, ACC_FP64, "")
        if PER_ELEMENT:
            acc += _grad_terms(y, dy, LOG)
        else:
            acc += tl.sum(_grad_terms(y, dy, LOG), 1)
    if PER_ELEMENT:
        acc = tl.sum(acc, 1)
    return acc
