"""The softmax and log-softmax kernels: the one Triton source that every backend runs.

Every kernel sees its tensors through the same row view: a row is one softmax vector of ``n_cols``
elements ``col_stride`` apart; rows come in ``n_outer`` groups of ``rows_per_outer``, the group at
``outer_stride`` and the row inside it at ``row_stride``. A softmax over the last dimension is one
group (``outer_stride`` unused); a softmax over a middle dimension of a contiguous tensor is
``n_outer`` groups whose rows are adjacent (``row_stride == 1``), which keeps tiles coalesced
without a transposing copy. A *tile* is ``BLOCK_M`` adjacent rows of one group.

Three ways to hold a row, chosen by the launch planner (``planner.py``). The file reads in this
order: the row helpers, the forward and backward tile and loop kernels, then the split regime with
its exchange (``variants.py`` declares every kernel's arguments and constexprs):

* ``*_tile``: each program keeps a whole tile in registers: one read, one write. A program takes
  one tile (``PER_TILE``) or loops over tiles. Used whenever a row fits a program. Rows may be read
  twice instead (``REREAD``): the second read finds them in L2. ``DENSE``: one group of rows, each
  as wide as the block, with int32 offsets: no group division and no masks (torch.compile's form).
* ``*_split``: a row is cut into ``CHUNKS`` chunks held by ``CHUNKS`` programs at once; they trade
  partial results through a small global scratch and then write what they hold: still one read,
  one write, for rows far larger than a program's registers. Waiting on a peer is only safe when
  the peer runs too: either the whole grid is resident at once (a persistent grid sized from the
  device's occupancy), or each program takes its item by ticket as it starts (``_split_items``),
  which needs only a row's chunks resident at once. Only on backends that can promise residency.
  A persistent program that steps through several items may be software-pipelined (``STAGES``
  > 1): its next chunks are copied into shared memory while it waits on its current row.
* ``*_loop``: a row is streamed in chunks twice (online max/sum, then normalise): 1.5x the
  traffic of the others, but no program ever waits on another, so it is the path for backends
  that cannot promise residency (the CPU interpreter, Ascend, unknown plugins).

Split rows whose starts are not 16-byte aligned (bf16 rows of 50257) would be read one element
per instruction. The split kernels then take ``ALIGN`` > 1 (the elements in 16 bytes): a row is
read through a *window* that starts at the aligned element at or before it. Each chunk moves the
window's whole ALIGN-element groups that lie inside the row as vectors, with no per-element
mask; the at most 2 * (ALIGN - 1) elements that share a group with a neighbouring row travel in a
small separate block (``_edge_columns``) that joins the chunk's partial and is stored alone.

The same file is loaded twice: as ``portable_softmax.kernels`` for GPU compilation and as
``portable_softmax.kernels_interpreted`` (see ``interpreter.py``) to run CPU tensors through
Triton's interpreter; the lines under ``if __name__...`` pick the decorator for each.
"""
import triton
import triton.language as tl

if __name__.endswith("_interpreted"):
    from portable_softmax.interpreter import interpreted_language, kernel_decorator as _jit

    # The interpreter looks for triton.language itself among a kernel's globals.
    _language = tl
    tl = interpreted_language()
    _jit_call = _jit
else:
    _jit = triton.jit
    # For a function that the caller calls rather than inlines (its arguments must be scalars).
    _jit_call = triton.jit(noinline=True)

LOG2E = tl.constexpr(1.4426950408889634)
# An empty scratch slot. Packed partials can never equal it: NaN halves are canonicalised first.
EMPTY_SLOT = tl.constexpr(-1)
# The narrowest warp of any target: a reduction over this many exchange slots stays in one warp.
PEER_GROUP = tl.constexpr(32)
CANONICAL_NAN_BITS = tl.constexpr(0x7FC00000)


# --------------------------------------------------------------------------------------------
# Rows: which rows a tile holds, where they start, and their elements in and out.
# --------------------------------------------------------------------------------------------


@_jit
def _tile_rows(tile, tiles_per_outer, rows_per_outer, BLOCK_M: tl.constexpr, DENSE: tl.constexpr):
    """The group of ``tile`` and the in-group indices of its rows, with their validity mask.
    ``DENSE`` (one group): the group is 0, with no division."""
    if DENSE:
        outer = tile * 0
    else:
        outer = tile // tiles_per_outer
    rows = (tile - outer * tiles_per_outer) * BLOCK_M + tl.arange(0, BLOCK_M)
    return tl.cast(outer, tl.int64), rows, rows < rows_per_outer


@_jit
def _row_starts(outer, rows, outer_stride, row_stride, DENSE: tl.constexpr):
    """The element offset of each row's first element: 64-bit, or with ``DENSE`` (one group,
    every offset of the tensor below 2**31) 32-bit."""
    if DENSE:
        start = rows * row_stride
    else:
        start = outer * outer_stride + rows.to(tl.int64) * row_stride
    return start


@_jit
def _tile_mask(row_mask, cols, n_cols, BLOCK_N: tl.constexpr, DENSE: tl.constexpr):
    """Which elements of a tile ([BLOCK_M or 1, BLOCK_N]) exist. With ``DENSE`` (rows as long as
    the block, as many as the tiles hold) all: a constant, which Triton drops with the masks."""
    if DENSE:
        mask = cols < BLOCK_N
    else:
        mask = row_mask[:, None] & (cols < n_cols)
    return mask


@_jit
def _tile_items(n_tiles, PER_TILE: tl.constexpr):
    """The tiles a tile-kernel program takes: ``offset + i`` for ``i`` in ``tl.range(start, stop,
    step)``; every grid-th tile from the program's id, or with ``PER_TILE`` (a grid of a program
    per tile) its own alone. That loop has constant bounds, one trip, and folds away before
    Triton places its barriers and ptxas its loads: inside a loop, a bf16 backward row of 16384
    in 32 registers (sm_90) was read in two rounds, the second waiting on the first, and its
    sum waited at a barrier that guards the shared memory of a previous trip."""
    if PER_TILE:
        start, stop, step, offset = 0, 1, 1, tl.program_id(0)
    else:
        start, stop, step, offset = tl.program_id(0), n_tiles, tl.num_programs(0), 0
    return start, stop, step, offset


@_jit
def _cast(v, TY: tl.constexpr):
    """``v`` as ``TY``, rounded as torch rounds: torch narrows float64 to float16 and bfloat16
    through float32 (c10's Half and BFloat16 are built from a float), which can differ from one
    direct rounding; Triton 3.9's interpreter also turns float64 into bfloat16 wrongly."""
    if v.dtype == tl.float64:
        if TY != tl.float64:
            v = v.to(tl.float32)
    return v.to(TY)


@_jit
def _load(ptr, base, cols, col_stride, mask, OTHER: tl.constexpr, CAST_TY: tl.constexpr, ACC_FP64: tl.constexpr,
          EVICT: tl.constexpr):
    """Load block columns ``cols`` ([1 or BLOCK_M, N]) of rows starting at ``base``; round to
    ``CAST_TY`` (torch's ``dtype=`` cast), then widen. ``EVICT``: the cache eviction policy."""
    v = _cast(tl.load(ptr + base[:, None] + cols * col_stride, mask=mask, other=OTHER, eviction_policy=EVICT), CAST_TY)
    # One return: Triton 3.6 rejects returns of different types from a function's branches.
    if ACC_FP64:
        v = v.to(tl.float64)
    else:
        v = v.to(tl.float32)
    return v


@_jit
def _store(ptr, base, cols, col_stride, mask, value):
    tl.store(ptr + base[:, None] + cols * col_stride, _cast(value, ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------------------------
# Forward: y = softmax(x) or log_softmax(x) along a row, a row held by one program (tile) or
# streamed twice (loop).
# --------------------------------------------------------------------------------------------


@_jit
def _normalized(z, e, scale, shift, LOG: tl.constexpr):
    """The output from z = x - ref and e = exp(z): ``e * scale`` (softmax) or ``z + shift`` (log)."""
    if LOG:
        return z + shift
    return e * scale


@_jit
def _fused_rows(outer, rows, rows_per_outer, n_heads, n_queries, a_stride, b_stride, q_stride):
    """For the fused variants (``variants.FUSED_SCALARS``): each row's offset in a tensor that
    broadcasts over the input's leading dimensions, seen as (A, n_heads, n_queries) with the
    given strides, and the row's query index (its index along the input's dimension -2)."""
    # Remainders by multiplication: a 64-bit division is a called routine on NVIDIA (sm_90 SASS),
    # and each division saved shortens the chain before a ticketed program's first load.
    r = outer * rows_per_outer + rows.to(tl.int64)
    rest = r // n_queries
    q = r - rest * n_queries
    a = rest // n_heads
    return a * a_stride + (rest - a * n_heads) * b_stride + q * q_stride, q


@_jit
def _fused_terms(outer, rows, row_mask, rows_per_outer, cols, valid, mask_ptr, scale_ptr, scale_value, n_heads,
                 n_queries, mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride, scale_a_stride,
                 scale_b_stride, scale_q_stride, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 SCALE: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr):
    """The scale ([BLOCK_M, 1]: 1, ``scale_value``, or the row's value of the scale tensor) and
    the bias ([BLOCK_M, BLOCK_N]: -inf where the bool mask is False or ``CAUSAL`` masks j > i,
    the additive mask's value, else 0) of the fused variants (``SCALE``: 0 none, 1 a number,
    2 a tensor; ``MASK``: 0 none, 1 bool, 2 additive): the input is ``x * scale + bias``, and no
    gradient flows where the bias is -inf. Masks and scales are read in their own dtypes through
    their broadcast strides."""
    scale = tl.full([BLOCK_M, 1], 1.0, tl.float32)
    if SCALE == 1:
        scale = scale * scale_value
    if SCALE == 2:
        where, _ = _fused_rows(outer, rows, rows_per_outer, n_heads, n_queries, scale_a_stride, scale_b_stride,
                               scale_q_stride)
        # Unmasked, at the first value for rows past the end: Triton 3.2's software pipeliner
        # gave a masked load of one value per row a layout its select refused (split kernels).
        scale = tl.load(scale_ptr + tl.where(row_mask, where, 0)).to(tl.float32)[:, None]
    bias = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    if MASK != 0 or CAUSAL:
        where, q = _fused_rows(outer, rows, rows_per_outer, n_heads, n_queries, mask_a_stride, mask_b_stride,
                               mask_q_stride)
        if MASK == 1:
            kept = tl.load(mask_ptr + where[:, None] + cols * mask_k_stride, mask=valid, other=1) != 0
            bias = tl.where(kept, bias, -float("inf"))
        if MASK == 2:
            bias = tl.load(mask_ptr + where[:, None] + cols * mask_k_stride, mask=valid, other=0.0).to(tl.float32)
        if CAUSAL:
            bias = tl.where(cols > q[:, None], -float("inf"), bias)
    return scale, bias


@_jit
def _fused_input(x, scale, bias, reads, row_mask, end, n_cols, BLOCK_M: tl.constexpr, SCALE: tl.constexpr,
                 MASK: tl.constexpr, BIASED: tl.constexpr, CAUSAL: tl.constexpr):
    """``x * scale + bias`` where ``x`` was read (``reads``), -inf elsewhere: padding must stay
    -inf after a negative scale. ``BIASED``: the bias holds -inf that the load did not apply (a
    mask, or ``CAUSAL`` where its elements were read); there the result is -inf whatever x is
    (x = +inf too, as ``masked_fill``). Without a scale or such a bias, x is as loaded (-inf
    where not read): a causal forward is bound by its arithmetic on the H200 (NOTES v19).

    A block of one row that holds no column past the row's ``end`` (``end``: one past the block's
    last column; reads are then every element) skips the select: its per-element masks cost 5
    instructions an element, and a scaled split chunk ran at 0.82 of copy against 0.88 plain on
    the H200, bound by instruction issue (NOTES v20)."""
    if (SCALE != 0 or MASK != 0) or BIASED:
        v = x
        if SCALE != 0:
            v = v * scale.to(x.dtype)
        if MASK == 2:
            v = v + bias.to(x.dtype)
        if BIASED:
            x = tl.where(reads & (bias != -float("inf")), v, -float("inf"))
        elif BLOCK_M == 1 and not CAUSAL:
            if (end <= n_cols) & (tl.sum(row_mask.to(tl.int32), 0) > 0):
                x = v
            else:
                # A barrier (the condition is the program's own) keeps LLVM from speculating
                # this branch into a select of both, which would cost every block the masks.
                tl.debug_barrier()
                x = tl.where(reads, v, -float("inf"))
        else:
            x = tl.where(reads, v, -float("inf"))
    return x


@_jit
def _causal_reads(valid, at, outer, rows, rows_per_outer, n_heads, n_queries, CAUSAL: tl.constexpr):
    """Which of the ``valid`` elements at the rows' columns ``at`` to read: with ``CAUSAL`` those
    it keeps (j <= i), a predicate of indices alone. A bool mask's values do not skip: every load
    of x would wait on the mask's, and a sector is read whole whatever a few of its elements are
    (skipping them, a padding mask keeping 90% read 0.89 of copy forward on the H100)."""
    reads = valid
    if CAUSAL:
        _, q = _fused_rows(outer, rows, rows_per_outer, n_heads, n_queries, 0, 0, 0)
        reads = valid & (at <= q[:, None])
    return reads


@_jit
def _fused_load(x_ptr, x_base, cols, at, x_col_stride, valid, end, n_cols, CAST_TY: tl.constexpr,
                ACC_FP64: tl.constexpr, outer, rows, row_mask, rows_per_outer, mask_ptr, scale_ptr, scale_value,
                n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride, scale_a_stride,
                scale_b_stride, scale_q_stride, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SCALE: tl.constexpr,
                MASK: tl.constexpr, CAUSAL: tl.constexpr):
    """The fused input ``x * scale + bias`` at block columns ``cols`` ([1, BLOCK_N]) of the rows
    at ``x_base``, which are the rows' columns ``at`` (``_fused_terms``; they differ in a split
    window), -inf where masked or not ``valid``; what ``CAUSAL`` masks is not read. Plain calls
    (no fusion) load x alone. ``end`` and ``n_cols``: ``_fused_input``'s."""
    # x's loads first, then the terms: their row indices take 64-bit divisions, which the loads
    # would otherwise wait behind (only a causal read needs them first).
    reads = _causal_reads(valid, at, outer, rows, rows_per_outer, n_heads, n_queries, CAUSAL)
    x = _load(x_ptr, x_base, cols, x_col_stride, reads, -float("inf"), CAST_TY, ACC_FP64, "")
    scale, bias = _fused_terms(outer, rows, row_mask, rows_per_outer, at, valid, mask_ptr, scale_ptr, scale_value,
                               n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride,
                               scale_a_stride, scale_b_stride, scale_q_stride, BLOCK_M, BLOCK_N, SCALE, MASK, CAUSAL)
    return _fused_input(x, scale, bias, reads, row_mask, end, n_cols, BLOCK_M, SCALE, MASK, MASK != 0, CAUSAL)


@_jit
def _fused_grad(dx, outer, rows, row_mask, rows_per_outer, cols, valid, mask_ptr, scale_ptr, scale_value, n_heads,
                n_queries, mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride, scale_a_stride, scale_b_stride,
                scale_q_stride, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SCALE: tl.constexpr,
                MASK: tl.constexpr, CAUSAL: tl.constexpr):
    """The gradient with respect to x from ``dx`` with respect to the fused input: the scale's
    factor, and none where masked (a constant)."""
    if (SCALE != 0 or MASK != 0) or CAUSAL:
        scale, bias = _fused_terms(outer, rows, row_mask, rows_per_outer, cols, valid, mask_ptr, scale_ptr,
                                   scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride,
                                   mask_k_stride, scale_a_stride, scale_b_stride, scale_q_stride, BLOCK_M, BLOCK_N,
                                   SCALE, MASK, CAUSAL)
        dx = tl.where(bias == -float("inf"), 0.0, dx * scale.to(dx.dtype))
    return dx


@_jit
def _emptied(out, row_max, LOG: tl.constexpr, MASK: tl.constexpr):
    """A row the bool mask (``MASK`` 1) leaves empty (``row_max``, shaped to broadcast over
    ``out``, is -inf) gives 0 (log: -inf), as ``torch._masked_softmax``; elsewhere ``out``."""
    if MASK == 1:
        out = tl.where(row_max == -float("inf"), -float("inf") if LOG else 0.0, out)
    return out


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
                               scale_a_stride, scale_b_stride, scale_q_stride, BLOCK_M, WIDTH, SCALE, MASK, CAUSAL)
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
def softmax_forward_tile(
    x_ptr, y_ptr, mask_ptr, scale_ptr, n_tiles, tiles_per_outer, rows_per_outer, n_cols,
    x_outer_stride, x_row_stride, x_col_stride, y_outer_stride, y_row_stride, y_col_stride,
    scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride,
    scale_a_stride, scale_b_stride, scale_q_stride,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOG: tl.constexpr, ACC_FP64: tl.constexpr, REREAD: tl.constexpr,
    PER_TILE: tl.constexpr, DENSE: tl.constexpr, SCALE: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
):
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
        if LADDER:
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
def _online_stats(x_ptr, x_base, outer, rows, row_mask, rows_per_outer, n_cols, x_col_stride, chunk_cols,
                  mask_ptr, scale_ptr, scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride,
                  mask_k_stride, scale_a_stride, scale_b_stride, scale_q_stride, CAST_TY: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACC_FP64: tl.constexpr, SCALE: tl.constexpr,
                  MASK: tl.constexpr, CAUSAL: tl.constexpr):
    """One streamed pass over rows (chunks of ``BLOCK_N`` columns) of the fused input
    (``_fused_load``): each row's maximum, the reference its exponentials are taken against (the
    maximum, or 0 for a row of -inf only), and their sum."""
    if ACC_FP64:
        row_max = tl.full([BLOCK_M], -float("inf"), tl.float64)
        total = tl.zeros([BLOCK_M], tl.float64)
        ref = tl.zeros([BLOCK_M], tl.float64)
    else:
        row_max = tl.full([BLOCK_M], -float("inf"), tl.float32)
        total = tl.zeros([BLOCK_M], tl.float32)
        ref = tl.zeros([BLOCK_M], tl.float32)
    for start in tl.range(0, n_cols, BLOCK_N):
        cols = start + chunk_cols
        mask = row_mask[:, None] & (cols < n_cols)[None, :]
        x = _fused_load(x_ptr, x_base, cols[None, :], cols[None, :], x_col_stride, mask, start + BLOCK_N, n_cols,
                        CAST_TY, ACC_FP64, outer, rows, row_mask, rows_per_outer, mask_ptr, scale_ptr, scale_value,
                        n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride, scale_a_stride,
                        scale_b_stride, scale_q_stride, BLOCK_M, BLOCK_N, SCALE, MASK, CAUSAL)
        new_max = tl.maximum(row_max, tl.max(x, 1))
        new_ref = tl.where(new_max == -float("inf"), 0.0, new_max)
        # Rescaled from the previous maximum, not its reference: while that maximum is -inf the
        # sum is 0, and 0 * exp(0 - new_ref) is 0 * inf = NaN once new_ref is below about -88.
        total = total * tl.exp2((row_max - new_ref) * LOG2E) + tl.sum(tl.exp2((x - new_ref[:, None]) * LOG2E), 1)
        row_max = new_max
        ref = new_ref
    return row_max, ref, total


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
        x_base = _row_starts(outer, rows, x_outer_stride, x_row_stride, False)
        y_base = _row_starts(outer, rows, y_outer_stride, y_row_stride, False)
        row_max, ref, total = _online_stats(x_ptr, x_base, outer, rows, row_mask, rows_per_outer, n_cols, x_col_stride,
                                            chunk_cols, mask_ptr, scale_ptr, scale_value, n_heads, n_queries,
                                            mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride,
                                            scale_a_stride, scale_b_stride, scale_q_stride, y_ptr.dtype.element_ty,
                                            BLOCK_M, BLOCK_N, ACC_FP64, SCALE, MASK, CAUSAL)
        scale = 1.0 / total
        shift = -tl.log(total)
        for start in tl.range(0, n_cols, BLOCK_N):
            cols = start + chunk_cols
            mask = row_mask[:, None] & (cols < n_cols)[None, :]
            x = _fused_load(x_ptr, x_base, cols[None, :], cols[None, :], x_col_stride, mask, start + BLOCK_N,
                            n_cols, y_ptr.dtype.element_ty, ACC_FP64, outer, rows, row_mask, rows_per_outer, mask_ptr,
                            scale_ptr, scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride,
                            mask_k_stride, scale_a_stride, scale_b_stride, scale_q_stride, BLOCK_M, BLOCK_N, SCALE,
                            MASK, CAUSAL)
            z = x - ref[:, None]
            out = _normalized(z, tl.exp2(z * LOG2E), scale[:, None], shift[:, None], LOG)
            _store(y_ptr, y_base, cols[None, :], y_col_stride, mask, _emptied(out, row_max[:, None], LOG, MASK))


# --------------------------------------------------------------------------------------------
# Backward: dx from the saved output y and the incoming gradient dy.
#   softmax:     dx = y * (dy - sum(dy * y))
#   log_softmax: dx = dy - exp(y) * sum(dy)
# --------------------------------------------------------------------------------------------


@_jit
def _grad_terms(y, dy, LOG: tl.constexpr):
    """The per-element term whose row sum the gradient needs."""
    if LOG:
        return dy
    return dy * y


@_jit
def _grad(y, dy, row_sum, LOG: tl.constexpr):
    if LOG:
        return dy - tl.exp2(y * LOG2E) * row_sum
    return y * (dy - row_sum)


@_jit
def _grad_block(y_ptr, dy_ptr, dx_ptr, y_base, dy_base, dx_base, cols, mask, row_sum,
                y_col_stride, dy_col_stride, dx_col_stride, LOG: tl.constexpr, ACC_FP64: tl.constexpr,
                EVICT: tl.constexpr):
    """Write dx at block columns ``cols`` from y and dy read there."""
    y = _load(y_ptr, y_base, cols, y_col_stride, mask, 0.0, y_ptr.dtype.element_ty, ACC_FP64, EVICT)
    dy = _load(dy_ptr, dy_base, cols, dy_col_stride, mask, 0.0, dy_ptr.dtype.element_ty, ACC_FP64, EVICT)
    _store(dx_ptr, dx_base, cols, dx_col_stride, mask, _grad(y, dy, row_sum[:, None], LOG))


@_jit
def softmax_backward_tile(
    y_ptr, dy_ptr, dx_ptr, mask_ptr, scale_ptr, n_tiles, tiles_per_outer, rows_per_outer, n_cols,
    y_outer_stride, y_row_stride, y_col_stride, dy_outer_stride, dy_row_stride, dy_col_stride,
    dx_outer_stride, dx_row_stride, dx_col_stride,
    scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride,
    scale_a_stride, scale_b_stride, scale_q_stride,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOG: tl.constexpr, ACC_FP64: tl.constexpr, REREAD: tl.constexpr,
    PER_TILE: tl.constexpr, DENSE: tl.constexpr, SCALE: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
):
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
                         mask_q_stride, mask_k_stride, scale_a_stride, scale_b_stride, scale_q_stride, BLOCK_M,
                         BLOCK_N, SCALE, MASK, CAUSAL)
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
                             mask_q_stride, mask_k_stride, scale_a_stride, scale_b_stride, scale_q_stride, BLOCK_M,
                             BLOCK_N, SCALE, MASK, CAUSAL)
            _store(dx_ptr, dx_base, cols, dx_col_stride, mask, dx)


# --------------------------------------------------------------------------------------------
# The split regime: a row cut into chunks held by co-resident programs, which trade packed
# (max, sum) partials through 64-bit slots. Items, aligned windows, the exchange and its wait,
# the slots emptied for the next launch, then the two split kernels.
# --------------------------------------------------------------------------------------------


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
def _window_start(base, ALIGN: tl.constexpr):
    """The element offset at or before each row start ``base`` that is a multiple of ``ALIGN``."""
    if ALIGN > 1:
        base = base // ALIGN * ALIGN
    return base


@_jit
def _output_window(row, lead, ALIGN: tl.constexpr, SHIFTED: tl.constexpr):
    """Where the output's window of a row starts (``row``: the row's first element): its own
    aligned window, or with ``SHIFTED`` (its rows lie at another offset from 16-byte boundaries
    than the inputs') ``lead`` columns before the row, so that the inputs' window columns
    address it; its stores are then unaligned, one element each, and the loads stay vectors."""
    if SHIFTED:
        base = row - lead
    else:
        base = _window_start(row, ALIGN)
    return base


@_jit
def _chunk_mask(cols, lead, n_cols, row_mask, ALIGN: tl.constexpr):
    """Which columns of a chunk ([1, BLOCK_N]) to load and store as the block. With windows
    (``lead``: the row's first column in its window, int32 so that compares take one
    instruction) only whole ALIGN-column groups inside the row: the mask is constant over each
    group, so the accesses stay vectors, and needs no per-element test."""
    if ALIGN > 1:
        first = lead[:, None]
        inside = (cols >= (first + ALIGN - 1) // ALIGN * ALIGN) & (cols < (first + n_cols) // ALIGN * ALIGN)
        mask = row_mask[:, None] & inside
    else:
        mask = row_mask[:, None] & (cols < n_cols)
    return mask


@_jit
def _split_window(outer, rows, row_mask, cols, n_cols, outer_stride, row_stride, ALIGN: tl.constexpr):
    """For the tensor whose strides are given (its rows fix the offsets of every tensor's): where
    each row's window starts, the row's first column in it (int32), and ``_chunk_mask``."""
    row = _row_starts(outer, rows, outer_stride, row_stride, False)
    base = _window_start(row, ALIGN)
    lead = (row - base).to(tl.int32)
    return base, lead, _chunk_mask(cols, lead, n_cols, row_mask, ALIGN)


@_jit
def _edge_columns(lead, n_cols, row_mask, first_col, BLOCK_N: tl.constexpr, ALIGN: tl.constexpr):
    """The window columns ([2 * ALIGN]) of the row's elements in its first and last group that
    ``_chunk_mask`` leaves out, and their mask, restricted to the chunk's own columns
    [first_col, first_col + BLOCK_N). One row per item (BLOCK_M = 1): the row's values are
    scalars here, so the block keeps Triton's one-element-per-thread layout."""
    lead = tl.sum(lead, 0)
    exists = tl.sum(row_mask.to(tl.int32), 0) > 0
    end = lead + n_cols
    inner = (lead + ALIGN - 1) // ALIGN * ALIGN
    tail = end // ALIGN * ALIGN
    j = tl.arange(0, 2 * ALIGN)
    # Descending columns, so that Triton sees no contiguity and gives no thread a vector of them.
    cols = tl.where(j < ALIGN, ALIGN - 1 - j, tail + 2 * ALIGN - 1 - j)
    # A row inside one group has no separate last group.
    distinct = (j < ALIGN) | (tail >= ALIGN)
    mask = exists & (cols >= lead) & (cols < end) & ((cols < inner) | (cols >= tail)) & distinct
    return cols, mask & (cols >= first_col) & (cols < first_col + BLOCK_N)


@_jit
def _edge_load(ptr, base, cols, mask, OTHER: tl.constexpr, CAST_TY: tl.constexpr):
    """``_load`` of ``_edge_columns`` from the window at ``base`` ([1])."""
    return _cast(tl.load(ptr + tl.sum(base, 0) + cols, mask=mask, other=OTHER), CAST_TY).to(tl.float32)


@_jit
def _edge_store(ptr, base, cols, mask, value):
    tl.store(ptr + tl.sum(base, 0) + cols, _cast(value, ptr.dtype.element_ty), mask=mask)


@_jit
def _window_store(ptr, base, cols, col_stride, mask, value, lead, n_cols, row_mask, first_col,
                  BLOCK_N: tl.constexpr, ALIGN: tl.constexpr, SHIFTED: tl.constexpr):
    """``_store`` of a window chunk (columns [first_col, first_col + BLOCK_N); one row: windows
    take one at a time). A shifted output is stored one element an instruction, and under a mask
    each of those needs its own predicate, made and unpacked per element: rows of 50257 bf16
    sliced from 50304 ran 1422 instructions a chunk in the sm_90 loop against 831 aligned, and
    the forward was issue-bound. So chunks wholly inside their row's aligned groups (a long
    row's every chunk but its ends) store with no mask: 924 instructions."""
    if SHIFTED:
        first = tl.sum(lead, 0)
        inner = (first + ALIGN - 1) // ALIGN * ALIGN
        tail = (first + n_cols) // ALIGN * ALIGN
        exists = tl.sum(row_mask.to(tl.int32), 0) > 0
        if exists & (first_col >= inner) & (first_col + BLOCK_N <= tail):
            tl.store(ptr + base[:, None] + cols * col_stride, _cast(value, ptr.dtype.element_ty))
        else:
            # ``mask`` made again here from the chunk's own columns, a form that common-subexpression
            # elimination keeps apart: else its per-element copy in the store's layout is made
            # before the branch, for every chunk.
            column = tl.arange(0, BLOCK_N)[None, :]
            inside = (column >= inner - first_col) & (column < tl.where(exists, tail - first_col, 0))
            _store(ptr, base, cols, col_stride, inside, value)
    else:
        _store(ptr, base, cols, col_stride, mask, value)


@_jit
def _float_bits(v):
    """The bits of fp32 ``v`` as int64 in [0, 2**32), NaN canonicalised."""
    bits = tl.where(v != v, CANONICAL_NAN_BITS, v.to(tl.int32, bitcast=True))
    return bits.to(tl.uint32).to(tl.int64)


@_jit
def _bits_float(bits):
    """The fp32 held in the low 32 bits of int64 ``bits``."""
    return bits.to(tl.int32).to(tl.float32, bitcast=True)


@_jit
def _row_slots(slot_ptr, tile, BLOCK_M: tl.constexpr, CHUNKS: tl.constexpr):
    """The first exchange slot of each row of ``tile`` ([BLOCK_M]): a row owns CHUNKS slots."""
    return slot_ptr + (tile * BLOCK_M + tl.arange(0, BLOCK_M)) * CHUNKS


@_jit
def _peer_values(v):
    """The maxima (high halves; -inf where ``EMPTY_SLOT``) and sums (low halves; 0 there) of a
    row's packed partials ``v``."""
    present = v != EMPTY_SLOT
    return tl.where(present, _bits_float(v >> 32), -float("inf")), tl.where(present, _bits_float(v), 0.0)


@_jit
def _peer_total(peer_max, peer_sum, row_max, MAXIMA: tl.constexpr):
    """What partials contribute to their row's total. With ``MAXIMA`` (the forward) a partial
    is a chunk's maximum and its sum of exp(x - that maximum) (0 for a chunk of -inf only),
    rescaled here to the row's maximum; without, a partial is a sum."""
    if MAXIMA:
        # A row of -inf only gives -inf - -inf = NaN here, and NaN outputs, as torch does.
        peer_sum = peer_sum * tl.exp2((peer_max - row_max) * LOG2E)
    return tl.sum(peer_sum, 0)


@_jit
def _exchange(slot_ptr, done_ptr, tile, chunk, row_mask, packed, BLOCK_M: tl.constexpr, CHUNKS: tl.constexpr,
              CHUNKS_P2: tl.constexpr, MAXIMA: tl.constexpr, STAGES: tl.constexpr, WAIT_ATOMIC: tl.constexpr):
    """Publish this chunk's partials of the item's rows (``packed``: a [BLOCK_M] int64 block of
    ``_float_bits``, with ``MAXIMA`` the chunk maximum's over its sum's), wait for every chunk of
    the rows, and return the rows' maxima and totals from them all (``_gather_row``; for a tile
    of several rows ``_gather_tile``, [BLOCK_M] each, where one row gives scalars; its counters
    follow the ticket counter at ``done_ptr``).

    Each (row, chunk) owns one 64-bit slot written with a relaxed exchange and read back with a
    relaxed atomic (``_read_slots``): the slot is the only datum exchanged, and a reader needs
    nothing written before it, so no acquire or release (whose fence would drain this program's
    output stores) is needed. (Ticketed rows counting arrivals as tiles do, which would spare
    the fill of their slots before each launch, ran long fp32 rows at 0.80 of copy against 0.90
    on the H200: NOTES v19.)
    """
    slots = _row_slots(slot_ptr, tile, BLOCK_M, CHUNKS)
    if BLOCK_M > 1:
        tl.store(slots + chunk, packed, mask=row_mask)
    else:
        tl.atomic_xchg(slots + chunk, packed, mask=row_mask, sem="relaxed")
    # Triton does not software-pipeline a loop that holds another loop, but one that calls a
    # function holding it. The call costs registers (the calling convention), so only pipelined
    # kernels make it; its arguments are scalars, so it takes chunks of one row.
    # Unpacked before returning: Triton 3.2 loses a returned tuple that was held in one name
    # (the caller's unpacking then fails: "row_total is not defined").
    if BLOCK_M > 1:
        tl.static_assert(STAGES == 1, "split tiles of several rows are not pipelined")
        row_max, total = _gather_tile(slots, done_ptr + 1 + 2 * tile, row_mask, CHUNKS, CHUNKS_P2, MAXIMA)
    elif STAGES > 1:
        row_max, total = _gathered_row_called(slot_ptr + tile * CHUNKS, tl.sum(row_mask.to(tl.int32), 0) > 0,
                                              CHUNKS, CHUNKS_P2, MAXIMA, PEER_GROUP, WAIT_ATOMIC)
    else:
        row_max, total = _gathered_row(slot_ptr + tile * CHUNKS, tl.sum(row_mask.to(tl.int32), 0) > 0,
                                       CHUNKS, CHUNKS_P2, MAXIMA, CHUNKS_P2, WAIT_ATOMIC)
    return row_max, total


@_jit
def _read_slots(slots, present, ATOMIC: tl.constexpr):
    """The current values of exchange ``slots`` (0 where not ``present``), read so that every
    trip of a wait loop reads memory again. A relaxed atomic that adds 0 (``ATOMIC``) stays in
    the loop on every target: Triton 3.6+ turns AMD's volatile loads into buffer loads without
    the volatile bit, which LLVM hoists out of the loop (a program then spins forever on the
    empty slot it read first), and 3.3-3.5 keep them in the loop but without cache bits, so
    they may hit a stale L1. The volatile load is NVIDIA's ``ld.volatile``, kept by ptxas."""
    if ATOMIC:
        v = tl.atomic_add(slots, 0, mask=present, sem="relaxed")
        # A masked lane's result is undefined: it must not look empty.
        v = tl.where(present, v, 0)
    else:
        v = tl.load(slots, mask=present, other=0, volatile=True)
    return v


@_jit
def _awaited_slots(first_slot, exists, start, CHUNKS: tl.constexpr, GROUP: tl.constexpr, ATOMIC: tl.constexpr):
    """Slots [start, start + GROUP) of a row, once those of its CHUNKS chunks are all full
    (``EMPTY_SLOT`` past them)."""
    peers = start + tl.arange(0, GROUP)
    present = (peers < CHUNKS) & exists
    v = _read_slots(first_slot + peers, present, ATOMIC)
    while tl.sum((v == EMPTY_SLOT).to(tl.int32)) > 0:
        v = _read_slots(first_slot + peers, present, ATOMIC)
    return tl.where(present, v, EMPTY_SLOT)


def _gather_row(first_slot, exists, CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr, MAXIMA: tl.constexpr,
                GROUP: tl.constexpr, ATOMIC: tl.constexpr):
    """Wait until the CHUNKS slots from ``first_slot`` are full; the row's maximum (with
    ``MAXIMA``, else 0) and total (``_peer_total``). Read ``GROUP`` slots at a time: called (not
    inlined), a function's shared memory overlaps the caller's pipeline buffers (Triton 3.6 passes
    it none of its own; rows of 38 and 64 chunks came out NaN on the H200), and a reduction over
    at most ``PEER_GROUP`` slots stays within a warp, needing none. Groups start below CHUNKS: one
    wholly past the row's chunks would wait on nothing (a dead loop in the machine code)."""
    if GROUP >= CHUNKS_P2:
        peer_max, peer_sum = _peer_values(_awaited_slots(first_slot, exists, 0, CHUNKS, CHUNKS_P2, ATOMIC))
        row_max = tl.max(peer_max, 0) if MAXIMA else 0.0
        total = _peer_total(peer_max, peer_sum, row_max, MAXIMA)
    else:
        row_max = -float("inf") if MAXIMA else 0.0
        if MAXIMA:
            for start in tl.static_range(0, CHUNKS, GROUP):
                peer_max, _ = _peer_values(_awaited_slots(first_slot, exists, start, CHUNKS, GROUP, ATOMIC))
                row_max = tl.maximum(row_max, tl.max(peer_max, 0))
        total = 0.0
        for start in tl.static_range(0, CHUNKS, GROUP):
            # In the forward the slots are full by now: one read each.
            peer_max, peer_sum = _peer_values(_awaited_slots(first_slot, exists, start, CHUNKS, GROUP, ATOMIC))
            total += _peer_total(peer_max, peer_sum, row_max, MAXIMA)
    return row_max, total


_gathered_row = _jit(_gather_row)
_gathered_row_called = _jit_call(_gather_row)


@_jit
def _gather_tile(slots, counters, row_mask, CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr, MAXIMA: tl.constexpr):
    """``_gather_row`` for a tile of rows (``slots``: each row's first slot, [BLOCK_M]; this
    program's chunk has stored its partials there): the rows' maxima and totals ([BLOCK_M] each).

    A tile's rows lie side by side in memory (a reduction along a strided dimension), and a wait
    that re-read all their slots ([BLOCK_M, CHUNKS]) on every trip would flood the cache that
    its peers publish through (a 64-row tile of 256 chunks ran 50 times slower than a copy).
    So the tile's chunks count their arrivals at ``counters`` (arrivals, departures): each adds
    itself with release semantics once its partials are stored, waits for all CHUNKS (one word
    per trip, ``_awaited_count``), then reads the slots once. Slots are never emptied; the last
    chunk to leave resets the counters for the next launch."""
    # One thread counts for the program: the barrier first makes every thread's stores its own,
    # which its release then publishes (the grid-wide barrier's pattern).
    tl.debug_barrier()
    tl.atomic_add(counters, 1, sem="release")
    _awaited_count(counters, CHUNKS)
    tl.debug_barrier()
    peers = tl.arange(0, CHUNKS_P2)
    present = row_mask[:, None] & (peers < CHUNKS)[None, :]
    # From L2, where the peers' stores are: never a line this unit's L1 kept.
    v = tl.load(slots[:, None] + peers[None, :], mask=present, other=EMPTY_SLOT, cache_modifier=".cg")
    peer_max, peer_sum = _peer_values(v)
    row_max = tl.max(peer_max, 1)
    if MAXIMA:
        peer_sum = peer_sum * tl.exp2((peer_max - row_max[:, None]) * LOG2E)
    last = tl.atomic_add(counters + 1, 1, sem="relaxed") == CHUNKS - 1
    tl.store(counters, 0, mask=last)
    tl.store(counters + 1, 0, mask=last)
    return row_max, tl.sum(peer_sum, 1)


@_jit
def _awaited_count(counter, COUNT: tl.constexpr):
    """Wait until the int32 ``counter`` reaches ``COUNT``. Each trip is one atomic read with
    acquire semantics, made by one thread for the program: what the programs that counted
    stored before counting is seen after. (A volatile read would be made by every thread, and
    ran a 16-row bf16 column split at 0.37 of copy against 0.49 on the H100.)"""
    seen = tl.atomic_add(counter, 0, sem="acquire")
    while seen < COUNT:
        seen = tl.atomic_add(counter, 0, sem="acquire")


@_jit
def _tile_slots(slot_ptr, tile, tiles_per_outer, rows_per_outer, BLOCK_M: tl.constexpr, CHUNKS: tl.constexpr):
    """The first slot of each row of ``tile`` ([BLOCK_M]), and which rows exist."""
    _, _, row_mask = _tile_rows(tile, tiles_per_outer, rows_per_outer, BLOCK_M, False)
    return _row_slots(slot_ptr, tile, BLOCK_M, CHUNKS), row_mask


@_jit
def _empty_previous(slot_ptr, tile, chunk, tiles_per_outer, rows_per_outer, BLOCK_M: tl.constexpr,
                    CHUNKS: tl.constexpr, TICKETED: tl.constexpr):
    """Empty this program's slots of the tile it held before ``tile`` (none on its first). Called
    once every chunk of ``tile`` has published: a peer publishes only after it has read all of
    the previous tile's slots, and the peers of every tile are the same programs (the grid is a
    multiple of CHUNKS). A plain store: no program waits on a round trip to clean up. Ticketed
    grids leave their slots full (the launch fills them before the next); tiles of several rows
    count arrivals instead (``_gather_tile``) and leave theirs full."""
    if not TICKETED and BLOCK_M == 1:
        # Programs step through items a grid apart, CHUNKS items to a tile: a first tile gives < 0.
        previous = tile - tl.num_programs(0) // CHUNKS
        slots, row_mask = _tile_slots(slot_ptr, previous, tiles_per_outer, rows_per_outer, BLOCK_M, CHUNKS)
        tl.store(slots + chunk, tl.full([BLOCK_M], EMPTY_SLOT, tl.int64), mask=row_mask & (previous >= 0))


@_jit
def _empty_last(slot_ptr, done_ptr, n_items, tiles_per_outer, rows_per_outer, BLOCK_M: tl.constexpr,
                CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr, TICKETED: tl.constexpr):
    """Empty the slots of a program's last tile, which no later publication vouches for: the last
    of its chunks to arrive at the tile's counter empties them all and resets the counter, leaving
    the scratch clean for the next launch (kernel boundaries order the resets before any later
    read). Nothing for ticketed grids, whose counter is their ticket (``_split_items``), nor for
    tiles of several rows (``_gather_tile``)."""
    if not TICKETED and BLOCK_M == 1:
        first, step = tl.program_id(0), tl.num_programs(0)
        tile = (first + (n_items - 1 - first) // step * step) // CHUNKS
        last = tl.atomic_add(done_ptr + tile, 1, sem="relaxed") == CHUNKS - 1
        slots, row_mask = _tile_slots(slot_ptr, tile, tiles_per_outer, rows_per_outer, BLOCK_M, CHUNKS)
        peers = tl.arange(0, CHUNKS_P2)
        tl.store(slots[:, None] + peers[None, :], tl.full([BLOCK_M, CHUNKS_P2], EMPTY_SLOT, tl.int64),
                 mask=row_mask[:, None] & (peers < CHUNKS)[None, :] & last)
        tl.store(done_ptr + tile, 0, mask=last)


@_jit
def softmax_forward_split(
    x_ptr, y_ptr, mask_ptr, scale_ptr, slot_ptr, done_ptr, n_items, tiles_per_outer, rows_per_outer, n_cols,
    x_outer_stride, x_row_stride, x_col_stride, y_outer_stride, y_row_stride, y_col_stride,
    scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride,
    scale_a_stride, scale_b_stride, scale_q_stride,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr, CHUNKS_P2: tl.constexpr,
    LOG: tl.constexpr, ALIGN: tl.constexpr, TICKETED: tl.constexpr, STAGES: tl.constexpr,
    WAIT_ATOMIC: tl.constexpr, SHIFTED: tl.constexpr, SCALE: tl.constexpr, MASK: tl.constexpr,
    CAUSAL: tl.constexpr,
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
                                           scale_q_stride, BLOCK_M, BLOCK_N, SCALE, MASK, CAUSAL)
                x = _fused_input(x, scale, bias, mask, row_mask, chunk_end, n_cols, BLOCK_M, SCALE, MASK,
                                 MASK != 0 or CAUSAL, CAUSAL)
        else:
            x = _fused_load(x_ptr, x_base, cols, cols - lead[:, None], x_col_stride, mask, chunk_end, n_cols,
                            y_ptr.dtype.element_ty, False, outer, rows, row_mask, rows_per_outer, mask_ptr, scale_ptr,
                            scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride,
                            mask_k_stride, scale_a_stride, scale_b_stride, scale_q_stride, BLOCK_M, BLOCK_N, SCALE,
                            MASK, CAUSAL)
        chunk_max = tl.max(x, 1)
        if ALIGN > 1:
            edge, edge_mask = _edge_columns(lead, n_cols, row_mask, chunk * BLOCK_N, BLOCK_N, ALIGN)
            x_edge = _edge_load(x_ptr, x_base, edge, edge_mask, -float("inf"), y_ptr.dtype.element_ty)
            if fused:
                scale, bias = _fused_terms(outer, rows, row_mask, rows_per_outer, (edge - tl.sum(lead, 0))[None, :],
                                           edge_mask[None, :], mask_ptr, scale_ptr, scale_value, n_heads, n_queries,
                                           mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride,
                                           scale_a_stride, scale_b_stride, scale_q_stride, BLOCK_M, 2 * ALIGN,
                                           SCALE, MASK, CAUSAL)
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
                                       CHUNKS_P2, True, STAGES, WAIT_ATOMIC)
        # From the published maximum, not ref: a chunk of -inf only scales its zeros by 0.
        scale = tl.exp2((chunk_max - row_max) * LOG2E) / row_total
        shift = chunk_max - row_max - tl.log(row_total)
        out = _normalized(z, e, scale[:, None], shift[:, None], LOG)
        # A tile's maxima are [BLOCK_M]; a row's, a scalar.
        if BLOCK_M > 1:
            out = _emptied(out, row_max[:, None], LOG, MASK)
        else:
            out = _emptied(out, row_max, LOG, MASK)
        _window_store(y_ptr, y_base, cols, y_col_stride, mask, out, lead, n_cols, row_mask, chunk * BLOCK_N, BLOCK_N,
                      ALIGN, SHIFTED)
        if ALIGN > 1:
            _edge_store(y_ptr, y_base, edge, edge_mask,
                        _emptied(_normalized(z_edge, e_edge, tl.sum(scale, 0), tl.sum(shift, 0), LOG), row_max, LOG,
                                 MASK))
        _empty_previous(slot_ptr, tile, chunk, tiles_per_outer, rows_per_outer, BLOCK_M, CHUNKS, TICKETED)
    _empty_last(slot_ptr, done_ptr, n_items, tiles_per_outer, rows_per_outer, BLOCK_M, CHUNKS, CHUNKS_P2, TICKETED)


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
    CAUSAL: tl.constexpr,
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
                               CHUNKS_P2, False, STAGES, WAIT_ATOMIC)
        if BLOCK_M > 1:
            row_sum = row_sum[:, None]
        dx = _fused_grad(_grad(y, dy, row_sum, LOG), outer, rows, row_mask, rows_per_outer, cols - lead[:, None],
                         mask, mask_ptr, scale_ptr, scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride,
                         mask_q_stride, mask_k_stride, scale_a_stride, scale_b_stride, scale_q_stride, BLOCK_M,
                         BLOCK_N, SCALE, MASK, CAUSAL)
        _window_store(dx_ptr, dx_base, cols, dx_col_stride, mask, dx, lead, n_cols, row_mask, chunk * BLOCK_N,
                      BLOCK_N, ALIGN, SHIFTED)
        if ALIGN > 1:
            dx_edge = _fused_grad(_grad(y_edge, dy_edge, row_sum, LOG)[None, :], outer, rows, row_mask,
                                  rows_per_outer, (edge - tl.sum(lead, 0))[None, :], edge_mask[None, :], mask_ptr,
                                  scale_ptr, scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride,
                                  mask_q_stride, mask_k_stride, scale_a_stride, scale_b_stride, scale_q_stride,
                                  BLOCK_M, 2 * ALIGN, SCALE, MASK, CAUSAL)
            _edge_store(dx_ptr, dx_base, edge, edge_mask, tl.sum(dx_edge, 0))
        _empty_previous(slot_ptr, tile, chunk, tiles_per_outer, rows_per_outer, BLOCK_M, CHUNKS, TICKETED)
    _empty_last(slot_ptr, done_ptr, n_items, tiles_per_outer, rows_per_outer, BLOCK_M, CHUNKS, CHUNKS_P2, TICKETED)


# --------------------------------------------------------------------------------------------
# Streamed kernels of rows cut into parts, in two launches, no program waiting on another: rows
# sharded across ranks (``distributed.py``: each rank holds a slice of every row, a collective
# between the launches), and long rows cut into ``n_slices`` slices of ``slice_cols`` columns
# (the ``sliced`` regime, ``planner._strided_config``: long reductions along a strided
# dimension). The first launch writes each part's partials in one read (forward: maximum and sum
# of exponentials; backward: the sum the gradient needs); the second combines the ``n_ranks``
# parts' partials of its rows (the ranks' after a gather, or the slices') in a fixed order and
# writes its part of the output. Items are (tile, slice), tiles fastest, so that programs running
# together read adjacent rows. Rows are streamed in chunks (long vocabulary slices) or held in
# tiles of several rows, as the loop kernels stream them. Partials are float32 (float64 where the
# call accumulates in float64): ``stats_ptr`` holds [parts, rows] of two (maximum, sum) forward,
# of one (sum) backward, by the part, then the row's index in the view.
# --------------------------------------------------------------------------------------------


@_jit
def _stat_rows(outer, rows, rows_per_outer):
    """The index of each row of a tile among all rows of the view: its partials' row."""
    return outer * rows_per_outer + rows


@_jit
def _part_rows(part, outer, rows, n_tiles, tiles_per_outer, rows_per_outer):
    """Where part ``part``'s partials of ``rows`` lie among all parts' ([parts, rows of the view],
    in partials, int64)."""
    all_rows = n_tiles // tiles_per_outer * rows_per_outer
    return part.to(tl.int64) * all_rows + _stat_rows(outer, rows, rows_per_outer)


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
def softmax_forward_partials(
    x_ptr, stats_ptr, n_tiles, tiles_per_outer, rows_per_outer, n_cols, n_slices, slice_cols,
    x_outer_stride, x_row_stride, x_col_stride,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACC_FP64: tl.constexpr,
):
    chunk_cols = tl.arange(0, BLOCK_N)
    for item in tl.range(tl.program_id(0), n_tiles * n_slices, tl.num_programs(0)):
        outer, rows, row_mask, first, length, stat_rows = _part_item(item, n_tiles, tiles_per_outer, rows_per_outer,
                                                                     n_cols, slice_cols, BLOCK_M)
        x_base = _part_start(outer, rows, first, x_outer_stride, x_row_stride, x_col_stride)
        # x in its own dtype: ``distributed`` casts first where ``dtype=`` asks for another.
        # No fusion: x stands in for the mask and scale tensors, never read.
        row_max, _, total = _online_stats(x_ptr, x_base, outer, rows, row_mask, rows_per_outer, length, x_col_stride,
                                          chunk_cols, x_ptr, x_ptr, 1.0, 1, 1, 0, 0, 0, 0, 0, 0, 0,
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
