"""The fused variants' terms (``variants.FUSED_SCALARS``): the input is ``x * scale + bias``, a
scale (none, a number, a tensor per row) and a bias (a bool or additive mask, causal), read in
their own dtypes through their broadcast strides; what they mask carries no gradient, and a row
a bool mask leaves empty gives 0 (log: -inf)."""
from .jit import _jit, _language, tl  # noqa: F401 (_language: see jit.py)
from .common import _load


@_jit
def _fused_load(x_ptr, x_base, cols, at, x_col_stride, valid, end, n_cols, CAST_TY: tl.constexpr,
                ACC_FP64: tl.constexpr, outer, rows, row_mask, rows_per_outer, mask_ptr, scale_ptr, scale_value,
                n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride, scale_a_stride,
                scale_b_stride, scale_q_stride, BLOCK_M: tl.constexpr, SCALE: tl.constexpr, MASK: tl.constexpr,
                CAUSAL: tl.constexpr):
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
                               scale_a_stride, scale_b_stride, scale_q_stride, SCALE, MASK, CAUSAL)
    return _fused_input(x, scale, bias, reads, row_mask, end, n_cols, BLOCK_M, SCALE, MASK, MASK != 0, CAUSAL)


@_jit
def _fused_load_rows(x_ptr, x_base, cols, x_col_stride, valid, end, n_cols, CAST_TY: tl.constexpr,
                     ACC_FP64: tl.constexpr, row_mask, scale, where, q, mask_ptr, mask_k_stride, BLOCK_M: tl.constexpr,
                     SCALE: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, REDUCED: tl.constexpr):
    """``_fused_load`` at a row's own columns ``cols`` from its terms computed once
    (``_fused_row_terms``: ``scale``, ``where``, ``q``, which may be 32-bit): a streamed row's
    blocks. Every row quantity (``x_base``, ``row_mask`` and the terms) is taken per row with
    ``[:, None]``, so that a block laid out in lane rows (``common._lane_columns``: ``cols``
    [1, LANE_ROWS, lanes]) passes them as [BLOCK_M, 1].

    ``REDUCED``: the block is reduced (a maximum, a sum), so that what was not read must be
    -inf. Else (the output pass) only what is stored counts, all of it read: a scale alone is
    applied without the select, or its branch (``_fused_input``)."""
    reads = valid
    if CAUSAL:
        reads = valid & (cols <= q[:, None])
    x = _load(x_ptr, x_base, cols, x_col_stride, reads, -float("inf"), CAST_TY, ACC_FP64, "")
    if REDUCED or (MASK != 0 or CAUSAL):
        # Without its causal term: what causal masks was not read, and the input is -inf where
        # not read (one compare an element, not two).
        bias = _fused_bias(where, q, row_mask, cols, valid, mask_ptr, mask_k_stride, MASK, False)
        x = _fused_input(x, scale[:, None], bias, reads, row_mask, end, n_cols, BLOCK_M, SCALE, MASK, MASK != 0,
                         CAUSAL)
    elif SCALE != 0:
        x = x * scale[:, None].to(x.dtype)
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
def _fused_terms(outer, rows, row_mask, rows_per_outer, cols, valid, mask_ptr, scale_ptr, scale_value, n_heads,
                 n_queries, mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride, scale_a_stride,
                 scale_b_stride, scale_q_stride, SCALE: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr):
    """The scale ([BLOCK_M, 1]: 1, ``scale_value``, or the row's value of the scale tensor) and
    the bias (-inf where the bool mask is False or ``CAUSAL`` masks j > i, the additive mask's
    value, else 0: a zero a row where nothing sets it, which broadcasts) of the fused variants
    (``SCALE``: 0 none, 1 a number, 2 a tensor; ``MASK``: 0 none, 1 bool, 2 additive): the input
    is ``x * scale + bias``, and no gradient flows where the bias is -inf. Masks and scales are
    read in their own dtypes through their broadcast strides."""
    scale, where, q = _fused_row_terms(outer, rows, row_mask, rows_per_outer, scale_ptr, scale_value, n_heads,
                                       n_queries, mask_a_stride, mask_b_stride, mask_q_stride, scale_a_stride,
                                       scale_b_stride, scale_q_stride, SCALE, MASK, CAUSAL)
    return scale[:, None], _fused_bias(where, q, row_mask, cols, valid, mask_ptr, mask_k_stride, MASK, CAUSAL)


@_jit
def _fused_row_terms(outer, rows, row_mask, rows_per_outer, scale_ptr, scale_value, n_heads, n_queries,
                     mask_a_stride, mask_b_stride, mask_q_stride, scale_a_stride, scale_b_stride, scale_q_stride,
                     SCALE: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr):
    """What the fused terms take of each row (``rows``' shape each): its scale, its offset in the
    mask and its query index (``_fused_rows``; 0 where neither a mask nor ``CAUSAL`` reads them).
    A streamed row computes them once (``_fused_load_rows``), not once a block: their 64-bit
    divisions cost about 20 instructions each on sm_90, and where ptxas does not hoist them
    (NOTES v36) a block pays them again."""
    scale = tl.full(row_mask.shape, 1.0, tl.float32)
    if SCALE == 1:
        scale = scale * scale_value
    if SCALE == 2:
        at, _ = _fused_rows(outer, rows, rows_per_outer, n_heads, n_queries, scale_a_stride, scale_b_stride,
                            scale_q_stride)
        # Unmasked, at the first value for rows past the end: Triton 3.2's software pipeliner
        # gave a masked load of one value per row a layout its select refused (split kernels).
        scale = tl.load(scale_ptr + tl.where(row_mask, at, 0)).to(tl.float32)
    where = tl.zeros(row_mask.shape, tl.int64)
    q = where
    if MASK != 0 or CAUSAL:
        where, q = _fused_rows(outer, rows, rows_per_outer, n_heads, n_queries, mask_a_stride, mask_b_stride,
                               mask_q_stride)
    return scale, where, q


@_jit
def _fused_bias(where, q, row_mask, cols, valid, mask_ptr, mask_k_stride, MASK: tl.constexpr, CAUSAL: tl.constexpr):
    """``_fused_terms``' bias at ``cols`` from the rows' mask offsets and query indices
    (``_fused_row_terms``), shaped to broadcast over ``cols`` (``row_mask[:, None]``'s shape where
    nothing sets it)."""
    bias = tl.zeros(row_mask[:, None].shape, tl.float32)
    if MASK == 1:
        kept = tl.load(mask_ptr + where[:, None] + cols * mask_k_stride, mask=valid, other=1) != 0
        bias = tl.where(kept, bias, -float("inf"))
    if MASK == 2:
        bias = tl.load(mask_ptr + where[:, None] + cols * mask_k_stride, mask=valid, other=0.0).to(tl.float32)
    if CAUSAL:
        bias = tl.where(cols > q[:, None], -float("inf"), bias)
    return bias


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
            if (end <= n_cols) & (tl.sum(row_mask.to(tl.int32)) > 0):
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
def _fused_grad(dx, outer, rows, row_mask, rows_per_outer, cols, valid, mask_ptr, scale_ptr, scale_value, n_heads,
                n_queries, mask_a_stride, mask_b_stride, mask_q_stride, mask_k_stride, scale_a_stride, scale_b_stride,
                scale_q_stride, SCALE: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr):
    """The gradient with respect to x from ``dx`` with respect to the fused input: the scale's
    factor, and none where masked (a constant)."""
    if (SCALE != 0 or MASK != 0) or CAUSAL:
        scale, bias = _fused_terms(outer, rows, row_mask, rows_per_outer, cols, valid, mask_ptr, scale_ptr,
                                   scale_value, n_heads, n_queries, mask_a_stride, mask_b_stride, mask_q_stride,
                                   mask_k_stride, scale_a_stride, scale_b_stride, scale_q_stride, SCALE, MASK, CAUSAL)
        dx = tl.where(bias == -float("inf"), 0.0, dx * scale.to(dx.dtype))
    return dx


@_jit
def _emptied(out, row_max, LOG: tl.constexpr, MASK: tl.constexpr):
    """A row the bool mask (``MASK`` 1) leaves empty (``row_max``, shaped to broadcast over
    ``out``, is -inf) gives 0 (log: -inf), as ``torch._masked_softmax``; elsewhere ``out``."""
    if MASK == 1:
        out = tl.where(row_max == -float("inf"), -float("inf") if LOG else 0.0, out)
    return out
