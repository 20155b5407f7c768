"""The pieces every regime shares: which rows a tile holds and where they start, their elements
in and out (loads widen, stores round as torch rounds), a streamed row's maximum and sum kept per
lane, and the softmax's formulas, forward and backward (every kernel sees its tensors through the
row view that ``__init__`` describes)."""
from .jit import _jit, _language, tl  # noqa: F401 (_language: see jit.py)

LOG2E = tl.constexpr(1.4426950408889634)

# The lanes of a streamed block laid out in lane rows (``_lane_columns``): a program's threads (8
# warps of 32, 4 of 64) times their 16-byte vectors of 16-bit elements.
LANE_WIDTH = tl.constexpr(2048)


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
def _tile_rows(tile, tiles_per_outer, rows_per_outer, BLOCK_M: tl.constexpr, DENSE: tl.constexpr):
    """The group of ``tile`` and the in-group indices of its rows, with their validity mask.
    ``DENSE`` (one group: True, or 2 for the flat form, ``variants.FLAT``): the group is 0, with
    no division."""
    if DENSE:
        outer = tile * 0
    else:
        outer = tile // tiles_per_outer
    rows = (tile - outer * tiles_per_outer) * BLOCK_M + tl.arange(0, BLOCK_M)
    return tl.cast(outer, tl.int64), rows, rows < rows_per_outer


@_jit
def _row_starts(outer, rows, outer_stride, row_stride, DENSE: tl.constexpr):
    """The element offset of each row's first element: 64-bit, or with ``DENSE`` (True or 2: one
    group, every offset of the tensor below 2**31) 32-bit."""
    if DENSE:
        start = rows * row_stride
    else:
        start = outer * outer_stride + rows.to(tl.int64) * row_stride
    return start


@_jit
def _tile_mask(row_mask, cols, n_cols, BLOCK_N: tl.constexpr, DENSE: tl.constexpr):
    """Which elements of a tile ([BLOCK_M or 1, BLOCK_N]) exist. With ``DENSE`` True (rows as long
    as the block, as many as the tiles hold) all: a constant, which Triton drops with the masks;
    the flat form (2) keeps them."""
    if DENSE == 1:
        mask = cols < BLOCK_N
    else:
        mask = row_mask[:, None] & (cols < n_cols)
    return mask


@_jit
def _load(ptr, base, cols, col_stride, mask, OTHER: tl.constexpr, CAST_TY: tl.constexpr, ACC_FP64: tl.constexpr,
          EVICT: tl.constexpr):
    """Load block columns ``cols`` ([1 or BLOCK_M, N]) of rows starting at ``base``; round to
    ``CAST_TY`` (torch's ``dtype=`` cast), then widen. ``EVICT``: the cache eviction policy."""
    v = _cast(tl.load(ptr + base[:, None] + cols * col_stride, mask=mask, other=OTHER, eviction_policy=EVICT), CAST_TY)
    return _wide(v, ACC_FP64)


@_jit
def _wide(v, ACC_FP64: tl.constexpr):
    """``v`` in the accumulation type: float32, or float64 for float64 input."""
    # One return: Triton 3.6 rejects returns of different types from a function's branches.
    if ACC_FP64:
        v = v.to(tl.float64)
    else:
        v = v.to(tl.float32)
    return v


@_jit
def _store(ptr, base, cols, col_stride, mask, value):
    tl.store(ptr + base[:, None] + cols * col_stride, _cast(value, ptr.dtype.element_ty), mask=mask)


@_jit
def _cast(v, TY: tl.constexpr):
    """``v`` as ``TY``, rounded as torch rounds: torch narrows float64 to float16 and bfloat16
    through float32 (c10's Half and BFloat16 are built from a float), which can differ from one
    direct rounding; Triton 3.9's interpreter also turns float64 into bfloat16 wrongly."""
    if v.dtype == tl.float64:
        if TY != tl.float64:
            v = v.to(tl.float32)
    return v.to(TY)


# Streamed rows: a block's maximum and sum of exponentials kept per lane, reduced across threads
# once a row (the loss's and the softmax's streamed forward; NOTES v34, v36).


@_jit
def _lane_columns(BLOCK_N: tl.constexpr, WIDTH: tl.constexpr):
    """A streamed block's column offsets as [1, LANE_ROWS, lanes]: row r of the middle axis is the
    block's r-th run of ``lanes`` columns (at most ``WIDTH``). Triton lays the last axis across
    threads and warps first, so while the lanes are as many as a program's threads times their
    widest vector (16 bytes of the widest load's elements: ``LANE_WIDTH`` for 16-bit elements on
    8 warps), each thread holds the whole middle axis and the block reduces over it in registers;
    wider programs, or narrower elements loaded beside (a bool mask's bytes, 16 a thread), reduce
    it across threads: correct, with barriers."""
    LANES: tl.constexpr = BLOCK_N if BLOCK_N < WIDTH else WIDTH
    LANE_ROWS: tl.constexpr = BLOCK_N // LANES
    return (tl.arange(0, LANE_ROWS)[:, None] * LANES + tl.arange(0, LANES)[None, :])[None, :, :]


@_jit
def _lane_update(lane_max, lane_sum, z):
    """One streamed block's step of the maximum and sum of exponentials kept per lane (the
    softmax's): ``z`` is [rows, LANE_ROWS, lanes], its middle axis held by each thread
    (``_lane_columns``), so that the block's maximum and sum over it are a thread's own
    instructions, no shuffle or barrier. An element costs its maximum, one exponential and an add;
    a lane's rescale by its new maximum is paid once a block. While a lane is -inf (padding,
    masked rows) its reference is finite (``_finite_floor``) and its sum stays 0, never 0 * inf
    (the rescale is from the lane's previous maximum, not its reference); a NaN makes the lane's
    sum NaN (its exponential is NaN), as does a +inf (inf - inf). The exponentials are of z - ref
    (exact near the maximum; a subtract and a multiply an element): the output pass takes them so
    and divides by this sum."""
    high = tl.maximum(lane_max, tl.max(z, 1))
    ref = _finite_floor(high)
    lane_sum = lane_sum * tl.exp2((lane_max - ref) * LOG2E) + tl.sum(tl.exp2((z - ref[:, None, :]) * LOG2E), 1)
    return high, lane_sum


@_jit
def _vector_update(lane_max, lane_sum, z, VEC: tl.constexpr):
    """The loss's step of a streamed block: ``_lane_update``'s, with one running maximum and sum a
    run of ``VEC`` adjacent lanes (a thread's 16-byte vector) rather than one a lane. ``z`` is
    [rows, LANE_ROWS, lanes] (``_lane_columns``), seen as [rows, LANE_ROWS, runs, VEC] and reduced
    over its lane rows and vector within each thread; ``lane_max`` and ``lane_sum`` are [rows,
    runs]. A run's rescale, an exponential, comes once a block, where a lane's came once per
    element of the vector: sm_90, bf16 blocks of 8192 on 8 warps, 222 instructions a block where
    lanes took 264 (33 exponentials a thread, not 40; NOTES v45). (A reshape of the lane axis, not
    a fourth axis of columns: with one, Triton laid the lane rows across threads.)

    The exponentials are of z * log2(e) - ref * log2(e), one fused multiply-add whose rounding
    grows with |z| (about |z| * 2**-24 relative), which the loss's lse, an absolute quantity,
    tolerates. The reference is the run's maximum, or 0 where that is infinite
    (``_lse_reference``'s: a run of -inf sums 0; a +inf maximum's exponentials are taken against
    0, so the run's sum is +inf, NaN with a NaN, and its rescales, exp(inf) or exp(m), keep it so)
    -- not ``_finite_floor``, which times log2(e) would overflow to -inf. Written as two compares
    that LLVM folds into one of |high|: with ``_lse_reference``'s own form here as well as after
    the loop, ptxas took 76 registers where the -inf test took 64 (sm_90, the fp32 forward alone
    in blocks of 8192)."""
    z = tl.reshape(z, [z.shape[0], z.shape[1], z.shape[2] // VEC, VEC])
    high = tl.maximum(lane_max, tl.max(tl.max(z, 3), 1))
    ref = tl.where((high == -float("inf")) | (high == float("inf")), 0.0, high)
    scaled_ref = ref * LOG2E
    lane_sum = lane_sum * tl.exp2(lane_max * LOG2E - scaled_ref) + tl.sum(
        tl.sum(tl.exp2(z * LOG2E - scaled_ref[:, None, :, None]), 3), 1)
    return high, lane_sum


@_jit
def _vector_sum(v, VEC: tl.constexpr):
    """A block's [rows, LANE_ROWS, lanes] summed over its lane rows and each run of ``VEC`` lanes
    (``_vector_update``): [rows, runs]."""
    return tl.sum(tl.reshape(tl.sum(v, 1), [v.shape[0], v.shape[2] // VEC, VEC]), 2)


@_jit
def _finite_floor(v):
    """``v``, or the most negative finite value of its type where it is -inf: a reference that
    exponentials of -inf (0) and of a lane's own maximum (1) take alike, in one instruction (a
    maximum), not a compare and a select a lane. No finite ``v`` is below it, so none moves; a
    NaN stays NaN or becomes the floor (``maximum``'s rule on the backend), and the lane's sum is
    NaN either way (its exponential is)."""
    if v.dtype == tl.float64:
        floor = -1.7976931348623157e308
    else:
        floor = -3.4028234663852886e38
    return tl.maximum(v, floor)


@_jit
def _lse_reference(v):
    """The reference a loss row's (or lane's) exponentials are taken against: its maximum ``v``, or
    0 where that is infinite, as torch's logsumexp takes it. A row of -inf only then sums to 0
    (lse -inf, never -inf - -inf); a row holding +inf to +inf, its lse +inf (torch's), or NaN
    with a NaN there too, where against the maximum, inf - inf, its sum was NaN. One compare
    (|v|, a source modifier) and one select a row or lane, never an element's. (``_vector_update``
    writes its own the other way: see there.)"""
    return tl.where(tl.abs(v) == float("inf"), 0.0, v)


@_jit
def _lane_combine(lane_max, lane_sum):
    """Each row's maximum and its sum of exponentials against it (``_lse_reference``: against 0
    for a row of -inf, or of the loss's, holding +inf) from its lanes': the one cross-thread
    reduction of a streamed row. A lane still at -inf has sum 0 and contributes 0; one holding
    +inf, summed against 0 (the loss's lanes), inf times exp(inf): inf, or NaN with a NaN. The
    softmax's lanes of +inf summed NaN (``_finite_floor``): their row's total stays NaN."""
    row_max = tl.max(lane_max, 1)
    ref = _lse_reference(row_max)
    return row_max, tl.sum(lane_sum * tl.exp2((lane_max - ref[:, None]) * LOG2E), 1)


# Forward: y = softmax(x) or log_softmax(x) from z = x - ref and e = exp(z).


@_jit
def _normalized(z, e, scale, shift, LOG: tl.constexpr):
    """The output from z = x - ref and e = exp(z): ``e * scale`` (softmax) or ``z + shift`` (log)."""
    if LOG:
        return z + shift
    return e * scale


# Backward: dx from the saved output y and the incoming gradient dy.
#   softmax:     dx = y * (dy - sum(dy * y))
#   log_softmax: dx = dy - exp(y) * sum(dy)


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
