"""The cross-entropy kernels' per-row terms (``loss.py``, ``loss_split.py``): the loss row and
lse, the gradient, the class weights and targets, and the constants the caller formed on the device.

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

A target outside [0, C) that is not ``ignore_index`` gives NaN at its row (loss and gradient);
it is never used as an address. Column offsets are 32-bit (the row view makes a strided row
spanning 2**31 elements contiguous first), except in rows of 2**31 columns or more, whose loop
counter Triton types as 64-bit.
"""
from .common import LOG2E, _lse_reference, _row_starts, _wide
from .jit import _jit, _language, tl  # noqa: F401 (_language: see jit.py)

TWO_LOG2E = tl.constexpr(2.8853900817779268)


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
    return _class_terms_of(_target_index(target_ptr, target_base, row_mask, ignore_index), cols, weight_ptr,
                           ignore_index, n_cols, row_mask, WEIGHT, ACC_FP64)


@_jit
def _target_index(target_ptr, target_base, row_mask, ignore_index):
    """Each row's class target as given (int64; ``ignore_index`` for a missing row)."""
    return tl.load(target_ptr + target_base, mask=row_mask, other=ignore_index).to(tl.int64)


@_jit
def _class_terms_of(wide, cols, weight_ptr, ignore_index, n_cols, row_mask, WEIGHT: tl.constexpr,
                    ACC_FP64: tl.constexpr):
    """``_class_terms`` from the rows' targets ``wide`` (``_target_index``)."""
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
    scales) where ignored, whatever its logits (torch's nll_loss skips the row); NaN for a target
    outside the classes or a +inf logit in a counted row (torch's log_softmax gives NaN there)."""
    loss = tl.where(ignored, 0.0, ce) * ce_scale
    if Z_LOSS:
        loss += tl.where(ignored, 0.0, z_loss * z_lse * z_lse) * z_scale
    return tl.where(ignored | (valid & (row_max != float("inf"))), loss, float("nan"))


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
    row of -inf, whose lse is then -inf, or one holding +inf, whose lse is then +inf, or NaN with
    a NaN: torch's; ``_lse_reference``)."""
    ref = _lse_reference(row_max)
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
    # A counted row holding +inf (lse +inf) is NaN throughout, as torch's: its p = exp(z - lse)
    # would be 0 but at the +inf (NaN).
    a = tl.where(ignored | (valid & (lse != float("inf"))), a, float("nan")) * e_scale
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
