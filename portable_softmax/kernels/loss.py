"""The cross-entropy kernels: the loss of ``loss.cross_entropy`` and its gradient, one Triton source
for every backend (CPU tensors run it through the interpreter, as the rest of the package).

Rows are the package's row view (``__init__``) (``n_outer`` groups of ``rows_per_outer`` rows of
``n_cols`` classes, (outer, row, column) strides per tensor): classes on dim 1 of an
(N, C, d1, ...) input need no copy. Tensors of one value per position (the class targets, the
loss rows, lse, a per-position incoming gradient) are walked through the same view with a column
stride of 0; probability targets have the input's shape.

Per row, with z the logits (``SOFTCAP``: ``softcap * tanh(x / softcap)``), lse = log sum exp z,
w the class weights (1 without ``WEIGHT``), W = sum w, t the target, eps the smoothing, C the
classes and q' = q (1 - eps) + eps / C the smoothed probability targets:

    class targets:  ce = (1 - eps) w_t (lse - z_t) + eps / C (W lse - sum_c w_c z_c)
    prob. targets:  ce = A lse - sum_c w_c q'_c z_c,  A = sum_c w_c q'_c
    loss row = ce * ce_scale + z_loss * lse^2 * z_scale   (0 where t is ignore_index)

and d loss row / d z_j = (p_j [(1 - eps) w_t + eps / C W] - (1 - eps) w_t [j == t] - eps / C w_j)
* ce_scale + 2 z_loss lse p_j z_scale (prob. targets: (p_j A - w_j q'_j) * ce_scale + ...), times
the softcap's 1 - tanh^2. ce_scale and z_scale are 1 / the denominators the caller formed on the
device (``stats``: for 'mean' the summed weights of the counted targets and their count, else 1;
then W, eps, the z-loss factor and the softcap: ``_constants``), applied to ignored rows too, so
that a 'mean' over a batch with every target ignored is 0 / 0 = NaN, as torch's.

The gradient is formed in float32 (float64 for float64 input) and rounded once: p - 1 of a
confident true class is exp(z_t - lse) - 1 in float32, never a difference of rounded values.

Kernels (``variants.LOSS_KERNELS``):

* ``cross_entropy_forward_tile``: a tile of rows held whole in registers: one read; the loss
  rows and lse, and with ``WRITE_GRAD`` the gradient in the same pass (the backward then only
  rescales it, ``cross_entropy_grad_scale``).
* ``cross_entropy_forward_loop``: rows streamed once in chunks (online maximum and sum kept per
  lane, reduced across threads once a row; the target's logit one load a row): loss
  rows and lse; with ``WRITE_GRAD`` streamed a second time for the gradient, a read that the
  first pass asks L2 to serve, which it does only while the rows in flight fit there.
* ``cross_entropy_forward_split`` (``loss_split.py``): a row's chunks held by co-resident
  programs that exchange their (maximum, sum), then write the gradient from their registers
  and their shares of the loss: one read, one write, for class targets.
* ``cross_entropy_backward``: the gradient streamed from the saved lse and the incoming gradient
  (one value, or one per position for ``reduction='none'``): one read, one write.
* ``cross_entropy_grad_scale``: a held gradient times the incoming one, unless that is 1 (read on
  the device: no host synchronisation).

A target outside [0, C) that is not ``ignore_index`` gives NaN at its row (loss and gradient);
it is never used as an address. Column offsets are 32-bit (the row view makes a strided row
spanning 2**31 elements contiguous first), except in rows of 2**31 columns or more, whose loop
counter Triton types as 64-bit.
"""
from .common import LOG2E, _cast, _load, _row_starts, _store, _tile_rows
from .jit import _jit, _language, tl  # noqa: F401 (_language: see jit.py)

TWO_LOG2E = tl.constexpr(2.8853900817779268)


@_jit
def _wide(v, ACC_FP64: tl.constexpr):
    """``v`` in the accumulation type: float32, or float64 for float64 input."""
    if ACC_FP64:
        v = v.to(tl.float64)
    else:
        v = v.to(tl.float32)
    return v


@_jit
def _capped(x, mask, softcap, SOFTCAP: tl.constexpr):
    """The logits: ``softcap * tanh(x / softcap)`` with ``SOFTCAP`` (and tanh, for the derivative),
    -inf where not ``mask``. tanh from one exponential of -2|u|, which never overflows."""
    if SOFTCAP:
        u = x / softcap
        e = tl.exp2(tl.where(u < 0, u, -u) * TWO_LOG2E)
        t = (1.0 - e) / (1.0 + e)
        t = tl.where(u < 0, -t, t)
        z = tl.where(mask, softcap * t, -float("inf"))
    else:
        t = x
        z = x
    return z, t


@_jit
def _class_terms(target_ptr, target_base, row_mask, cols, weight_ptr, ignore_index, n_cols,
                 WEIGHT: tl.constexpr, ACC_FP64: tl.constexpr):
    """Each row's target (int32, -1 where it names no class), whether it is ignored, whether it
    names a class, where the block's columns hold it ([rows, cols]), and its weight (no address
    from an invalid target)."""
    wide = tl.load(target_ptr + target_base, mask=row_mask, other=ignore_index).to(tl.int64)
    ignored = wide == ignore_index
    valid = (wide >= 0) & (wide < n_cols)
    # Compared with the columns in 32 bits (a class index is below n_cols): -1 where none.
    target = tl.where(valid, wide, -1).to(tl.int32)
    hit = cols == target[:, None]
    if WEIGHT:
        w_t = _wide(tl.load(weight_ptr + tl.where(valid, target, 0), mask=row_mask & valid, other=0.0), ACC_FP64)
    else:
        w_t = _wide(tl.where(valid, 1.0, 0.0), ACC_FP64)
    return target, ignored, valid, hit, w_t


@_jit
def _constants(stats_ptr, ACC_FP64: tl.constexpr):
    """The call's values, from ``stats`` (the caller forms them on the device: no host
    synchronisation, and float64 for float64 input): the reduction's factors ce_scale and
    z_scale (1 / the denominators of 'mean'; 1 otherwise), the summed class weights W, the
    smoothing, the z-loss factor and the softcap."""
    ce_scale = 1.0 / _wide(tl.load(stats_ptr), ACC_FP64)
    z_scale = 1.0 / _wide(tl.load(stats_ptr + 1), ACC_FP64)
    weight_sum = _wide(tl.load(stats_ptr + 2), ACC_FP64)
    smoothing = _wide(tl.load(stats_ptr + 3), ACC_FP64)
    z_loss = _wide(tl.load(stats_ptr + 4), ACC_FP64)
    softcap = _wide(tl.load(stats_ptr + 5), ACC_FP64)
    return ce_scale, z_scale, weight_sum, smoothing, z_loss, softcap


@_jit
def _weights(weight_ptr, cols, col_mask, WEIGHT: tl.constexpr, ACC_FP64: tl.constexpr):
    """The class weights of block columns ``cols`` ([1, N]; 1 without ``WEIGHT``, 0 past the row)."""
    if WEIGHT:
        w = _wide(tl.load(weight_ptr + cols, mask=col_mask, other=0.0), ACC_FP64)
    else:
        w = _wide(tl.where(col_mask, 1.0, 0.0), ACC_FP64)
    return w


@_jit
def _smoothed(q, mask, smoothing, n_cols, SMOOTHING: tl.constexpr):
    """Probability targets smoothed as torch: q (1 - eps) + eps / C, 0 past the row."""
    if SMOOTHING:
        q = q * (1.0 - smoothing) + smoothing / n_cols
    return tl.where(mask, q, 0.0)


@_jit
def _row_loss(lse, row_max, z_t, w_t, smooth_sum, prob_sum, prob_dot, ignored, valid, ce_scale, z_scale,
              weight_sum, smoothing, z_loss, n_cols, PROB_TARGET: tl.constexpr, SMOOTHING: tl.constexpr,
              Z_LOSS: tl.constexpr):
    """A row's loss from its sums (module docstring)."""
    ce = _cross_entropy(lse, z_t, w_t, smooth_sum, prob_sum, prob_dot, weight_sum, smoothing, n_cols, PROB_TARGET,
                        SMOOTHING)
    return _scaled_loss(ce, lse, row_max, ignored, valid, ce_scale, z_scale, z_loss, Z_LOSS)


@_jit
def _cross_entropy(lse, z_t, w_t, smooth_sum, prob_sum, prob_dot, weight_sum, smoothing, n_cols,
                   PROB_TARGET: tl.constexpr, SMOOTHING: tl.constexpr):
    """A row's cross-entropy term ce (module docstring), unscaled."""
    if PROB_TARGET:
        ce = prob_sum * lse - prob_dot
    else:
        ce = w_t * (lse - z_t)
        if SMOOTHING:
            ce = (1.0 - smoothing) * ce + smoothing / n_cols * (weight_sum * lse - smooth_sum)
    return ce


@_jit
def _scaled_loss(ce, z_lse, row_max, ignored, valid, ce_scale, z_scale, z_loss, Z_LOSS: tl.constexpr):
    """ce times the reduction's scale, plus the z-loss of ``z_lse`` (the row's lse): 0 (times the
    scales) where ignored, NaN for a target outside the classes or a +inf logit (torch's
    log_softmax gives NaN there)."""
    loss = tl.where(ignored, 0.0, ce) * ce_scale
    if Z_LOSS:
        loss += tl.where(ignored, 0.0, z_loss * z_lse * z_lse) * z_scale
    return tl.where((valid | ignored) & (row_max != float("inf")), loss, float("nan"))


@_jit
def _store_rows(loss_ptr, lse_ptr, outer, rows, row_mask, loss_outer_stride, loss_row_stride, lse_outer_stride,
                lse_row_stride, loss, lse, lse_mask):
    """Store each row's loss (its rows' value, or a split chunk's share of it: the caller's
    ``loss_ptr`` points at its slab) and, where ``lse_mask``, its lse."""
    tl.store(loss_ptr + _row_starts(outer, rows, loss_outer_stride, loss_row_stride, False), loss, mask=row_mask)
    tl.store(lse_ptr + _row_starts(outer, rows, lse_outer_stride, lse_row_stride, False), lse, mask=lse_mask)


@_jit
def _row_lse(row_max, total):
    """log sum exp from the maximum and the sum of exponentials taken against it (against 0 for a
    row of -inf, whose lse is then -inf)."""
    ref = tl.where(row_max == -float("inf"), 0.0, row_max)
    return ref + tl.log(total)


@_jit
def _grad(z, t, lse, hit, w_t, w, q, prob_sum, ignored, valid, ce_scale, z_scale, weight_sum, smoothing, z_loss,
          n_cols, PROB_TARGET: tl.constexpr, SMOOTHING: tl.constexpr, Z_LOSS: tl.constexpr, SOFTCAP: tl.constexpr):
    """d loss row / d x of a block ([rows, cols]; module docstring) from its logits z (padding
    -inf), in the accumulation type. exp2's argument z log2(e) - lse log2(e): one fused
    multiply-add an element (its rounding of lse log2(e) is of the order of lse's own)."""
    return _grad_of(tl.exp2(z * LOG2E - (lse * LOG2E)[:, None]), 1.0, t, lse, hit, w_t, w, q, prob_sum, ignored,
                    valid, ce_scale, z_scale, weight_sum, smoothing, z_loss, n_cols, PROB_TARGET, SMOOTHING, Z_LOSS,
                    SOFTCAP, True)


@_jit
def _grad_of(e, e_scale, t, lse, hit, w_t, w, q, prob_sum, ignored, valid, ce_scale, z_scale, weight_sum, smoothing,
             z_loss, n_cols, PROB_TARGET: tl.constexpr, SMOOTHING: tl.constexpr, Z_LOSS: tl.constexpr,
             SOFTCAP: tl.constexpr, ZERO_IGNORED: tl.constexpr):
    """``_grad`` from the block's exponentials e (0 past the row) and each row's ``e_scale``, its
    probabilities p = e * e_scale: p = exp(z - lse) itself with ``e_scale`` 1, or a split chunk's
    exponentials against its own maximum (``loss_split``).

    Every factor of a row (p's scale, the true class's weight or A, the reduction's scale, the
    z-loss term, and NaN where the target names no class) is folded into one coefficient a row,
    so that an element costs one multiply, e * a, where it cost three and a select (sm_90, the bf16
    split gradient: issue-bound on the H200, NOTES v31). An ignored row's gradient is 0 whatever
    its logits (a +inf or NaN logit makes its exponentials NaN, which no coefficient zeroes): with
    ``ZERO_IGNORED`` selected here, else the caller stores its zeros apart."""
    if PROB_TARGET:
        a = prob_sum * ce_scale
    else:
        true = w_t
        coef = w_t
        if SMOOTHING:
            true = (1.0 - smoothing) * w_t
            coef = true + smoothing / n_cols * weight_sum
        a = coef * ce_scale
    if Z_LOSS:
        a += 2.0 * z_loss * lse * z_scale
    a = tl.where(valid | ignored, a, float("nan")) * e_scale
    g = e * a[:, None]
    if PROB_TARGET:
        g -= w * q * ce_scale
    else:
        # p_t - 1 of a confident true class: p_t a - true ce_scale, formed here, once, in the
        # accumulation type.
        g -= tl.where(hit, (true * ce_scale)[:, None], 0.0)
        if SMOOTHING:
            g -= (smoothing / n_cols * ce_scale) * w
    if SOFTCAP:
        g = g * (1.0 - t * t)
    if ZERO_IGNORED:
        g = tl.where(ignored[:, None], 0.0, g)
    return g


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
    WRITE_GRAD: tl.constexpr,
):
    cols = tl.arange(0, BLOCK_N)[None, :]
    col_mask = cols < n_cols
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
        ref = tl.where(row_max == -float("inf"), 0.0, row_max)
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
def _stream_gradient(x_ptr, x_base, x_col_stride, target_ptr, target_base, target_col_stride, weight_ptr, grad_ptr,
                     grad_base, grad_col_stride, row_mask, chunk_cols, n_cols, lse, target, w_t, prob_sum, ignored,
                     valid, factor, ce_scale, z_scale, weight_sum, smoothing, z_loss, softcap, BLOCK_N: tl.constexpr,
                     ACC_FP64: tl.constexpr, WEIGHT: tl.constexpr, PROB_TARGET: tl.constexpr,
                     SMOOTHING: tl.constexpr, Z_LOSS: tl.constexpr, SOFTCAP: tl.constexpr, EVICT: tl.constexpr):
    """Stream rows once more, writing their gradient (``_grad``) times ``factor`` per row: x read
    again (``EVICT``: its cache policy), the gradient written once."""
    for start in tl.range(0, n_cols, BLOCK_N):
        cols = start + chunk_cols
        col_mask = cols < n_cols
        mask = row_mask[:, None] & col_mask
        x = _load(x_ptr, x_base, cols, x_col_stride, mask, -float("inf"), x_ptr.dtype.element_ty, ACC_FP64, EVICT)
        z, t = _capped(x, mask, softcap, SOFTCAP)
        w = _weights(weight_ptr, cols, col_mask, WEIGHT, ACC_FP64)
        if PROB_TARGET:
            q = _smoothed(_load(target_ptr, target_base, cols, target_col_stride, mask, 0.0,
                                target_ptr.dtype.element_ty, ACC_FP64, ""), mask, smoothing, n_cols, SMOOTHING)
        else:
            q = w
        g = _grad(z, t, lse, cols == target[:, None], w_t, w, q, prob_sum, ignored, valid, ce_scale, z_scale,
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
def _lane_update(lane_max, lane_sum, z):
    """One step of the online maximum and sum of exponentials kept per lane (per element of the
    streamed block): no cross-thread reduction while a row streams, one exponential a step. The
    larger of the lane's maximum and z becomes its maximum and the smaller's exponential against
    it is added (or, where z is larger, scales the sum). Against 0 while both are -inf (padding,
    masked rows): the sum stays 0, never 0 * inf; a NaN logit makes the lane's sum NaN."""
    rises = z > lane_max
    high = tl.where(rises, z, lane_max)
    low = tl.where(rises, lane_max, z)
    e = tl.exp2((low - tl.where(high == -float("inf"), 0.0, high)) * LOG2E)
    lane_sum = tl.where(rises, lane_sum * e + 1.0, lane_sum + e)
    return high, lane_sum


@_jit
def _lane_combine(lane_max, lane_sum):
    """Each row's maximum and its sum of exponentials against it (against 0 for a row of -inf)
    from its lanes': the one cross-thread reduction of a streamed row. A lane still at -inf has
    sum 0 and contributes 0."""
    row_max = tl.max(lane_max, 1)
    ref = tl.where(row_max == -float("inf"), 0.0, row_max)
    return row_max, tl.sum(lane_sum * tl.exp2((lane_max - ref[:, None]) * LOG2E), 1)


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
    WRITE_GRAD: tl.constexpr,
):
    # WRITE_GRAD: a second streamed pass writes the gradient. Its reads find the row in L2 (the
    # first pass asks to keep it there; the planner sizes the grid so that the rows streamed at
    # once fit: loss_planner.plan_loss), so memory sees one read and one write, as a held tile's.
    # The streamed pass keeps every running quantity per lane ([BLOCK_M, BLOCK_N]) and reduces
    # across threads once per row, after it: a block-wide reduction (shuffles and barriers) per
    # chunk would stall the loads of a memory-bound stream.
    keep: tl.constexpr = "evict_last" if WRITE_GRAD else ""
    chunk_cols = tl.arange(0, BLOCK_N)[None, :]
    ce_scale, z_scale, weight_sum, smoothing, z_loss, softcap = _constants(stats_ptr, ACC_FP64)
    for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        outer, rows, row_mask = _tile_rows(tile, tiles_per_outer, rows_per_outer, BLOCK_M, False)
        x_base = _row_starts(outer, rows, x_outer_stride, x_row_stride, False)
        target_base = _row_starts(outer, rows, target_outer_stride, target_row_stride, False)
        if not PROB_TARGET:
            target, ignored, valid, no_hit, w_t = _class_terms(target_ptr, target_base, row_mask, chunk_cols,
                                                               weight_ptr, ignore_index, n_cols, WEIGHT, ACC_FP64)
            z_t = _target_logit(x_ptr, x_base, x_col_stride, target, valid, row_mask, softcap, ACC_FP64, SOFTCAP)
        else:
            target = rows
            ignored = rows < 0
            valid = row_mask
        lane_max = _wide(tl.full([BLOCK_M, BLOCK_N], -float("inf"), tl.float32), ACC_FP64)
        lane_sum = _wide(tl.zeros([BLOCK_M, BLOCK_N], tl.float32), ACC_FP64)
        # The smoothing's sum_c w_c z_c, or a probability target's sum_c w_c q'_c and
        # sum_c w_c q'_c z_c, per lane likewise.
        lane_dot = lane_sum
        lane_prob = lane_sum
        for start in tl.range(0, n_cols, BLOCK_N):
            cols = start + chunk_cols
            col_mask = cols < n_cols
            mask = row_mask[:, None] & col_mask
            x = _load(x_ptr, x_base, cols, x_col_stride, mask, -float("inf"), x_ptr.dtype.element_ty, ACC_FP64, keep)
            z, tanh = _capped(x, mask, softcap, SOFTCAP)
            lane_max, lane_sum = _lane_update(lane_max, lane_sum, z)
            if PROB_TARGET or SMOOTHING:
                # Padding is -inf: kept out of every sum that multiplies it.
                finite_z = tl.where(mask, z, 0.0)
                w = _weights(weight_ptr, cols, col_mask, WEIGHT, ACC_FP64)
                if PROB_TARGET:
                    wq = w * _smoothed(_load(target_ptr, target_base, cols, target_col_stride, mask, 0.0,
                                             target_ptr.dtype.element_ty, ACC_FP64, keep), mask, smoothing, n_cols,
                                       SMOOTHING)
                    lane_prob += wq
                    lane_dot += wq * finite_z
                else:
                    lane_dot += w * finite_z
        row_max, total = _lane_combine(lane_max, lane_sum)
        if PROB_TARGET:
            prob_sum = tl.sum(lane_prob, 1)
            prob_dot = tl.sum(lane_dot, 1)
            w_t = prob_sum
            z_t = prob_sum
            smooth_sum = prob_sum
        else:
            smooth_sum = tl.sum(lane_dot, 1) if SMOOTHING else z_t
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
                             z_scale, weight_sum, smoothing, z_loss, softcap, BLOCK_N, ACC_FP64, WEIGHT, PROB_TARGET,
                             SMOOTHING, Z_LOSS, SOFTCAP, "evict_first")


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
):
    # dloss: the incoming gradient, one value (strides 0) or one per position ('none').
    chunk_cols = tl.arange(0, BLOCK_N)[None, :]
    ce_scale, z_scale, weight_sum, smoothing, z_loss, softcap = _constants(stats_ptr, ACC_FP64)
    for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        outer, rows, row_mask = _tile_rows(tile, tiles_per_outer, rows_per_outer, BLOCK_M, False)
        x_base = _row_starts(outer, rows, x_outer_stride, x_row_stride, False)
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
        _stream_gradient(x_ptr, x_base, x_col_stride, target_ptr, target_base, target_col_stride, weight_ptr, grad_ptr,
                         _row_starts(outer, rows, grad_outer_stride, grad_row_stride, False), grad_col_stride, row_mask,
                         chunk_cols, n_cols, lse, target, w_t, prob_sum, ignored, valid, dloss, ce_scale, z_scale,
                         weight_sum, smoothing, z_loss, softcap, BLOCK_N, ACC_FP64, WEIGHT, PROB_TARGET, SMOOTHING,
                         Z_LOSS, SOFTCAP, "")


@_jit
def cross_entropy_grad_scale(grad_ptr, dloss_ptr, n_elements, BLOCK: tl.constexpr, ACC_FP64: tl.constexpr):
    """``grad *= dloss`` over a dense buffer of ``n_elements``, unless dloss is 1: every program
    reads it and returns at once then (the usual ``loss.backward()``)."""
    dloss = _wide(tl.load(dloss_ptr), ACC_FP64)
    if dloss != 1.0:
        offsets = tl.arange(0, BLOCK)
        step = tl.num_programs(0).to(tl.int64) * BLOCK
        for start in tl.range(tl.program_id(0).to(tl.int64) * BLOCK, n_elements, step):
            where = start + offsets
            mask = where < n_elements
            g = _wide(tl.load(grad_ptr + where, mask=mask, other=0.0), ACC_FP64)
            tl.store(grad_ptr + where, _cast(g * dloss, grad_ptr.dtype.element_ty), mask=mask)
