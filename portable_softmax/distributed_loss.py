"""Cross-entropy over a vocabulary sharded across ranks (tensor parallelism): ``cross_entropy``
(``portable_softmax.distributed.cross_entropy``), which ``distributed_dtensor`` applies to DTensor
inputs of ``portable_softmax.cross_entropy`` sharded on the class dimension (torch's ``loss_parallel``).

Each rank of the group holds a contiguous slice of the classes, in rank order (slices may differ in
length; one may be empty). The targets (global class indices), the class weights (all C of them,
as torch's ``loss_parallel`` takes them: replicated) and the options are the same on every rank.
Every rank returns the loss of the whole; the backward writes the local slice's gradient. Only
per-row statistics cross ranks, float32 (float64 for float64 logits): two all-reduces in the
forward, none in the backward.

1. The cross-entropy forward kernel over the local slice (every position ignored: lse alone,
   ``loss_rows.lse_rows``'s use) gives each row's lse_r of the slice, after the softcap. With label
   smoothing, the same kernel with probability targets of 1 everywhere (one value, strides 0) gives
   lse_r and A lse_r - S_r, A = sum_c w_c, S_r = sum_c w_c z_c: the slice's smoothing sum (with
   class weights after step 2, which gives the slice's offset into them: one more read).
2. ``all_reduce(MAX)`` of [lse_r, the slices' sizes, -1]: each rank writes its own size in its own
   place among zeros, so every rank receives every size, on the device: the slice's offset and C
   with no collective of their own, no host synchronisation and no cache (a cache that one rank
   misses alone would leave it waiting in a collective the others never enter); the -1 every
   rank writes makes C - 1 one weighted sum of the received values, as the offset is.
3. ``all_reduce(SUM)`` of [exp(lse_r - M), z_t where the target falls in this slice (one logit a
   row, ``take``n), S_r], each written into its place of one buffer: M + log of the first is the
   whole row's LSE (0 for M where M is infinite, as torch's logsumexp: +inf for a row holding
   +inf), the second every rank's z_t (NaN where M is not finite: such a row's loss is NaN).
4. Each row's loss from ``kernels/loss_terms.py``' formulas with the whole row's LSE, z_t, S, W and C
   (torch operations on one value a row: few, each a GPU call's host microseconds; the constants
   kept per device, rank, slice and positions; what the options do not need left out).

The backward: with P_j = exp(z_j - LSE), s'_j the softcap's 1 - tanh^2 (1 without it), dl the
incoming gradient of the row and ce, zs the reduction's factors,

    d loss / d z_j = dl (a P_j - b w_j - c [j == t]) s'_j
    a = ((1 - eps) w_t + eps W / C) ce + 2 z_loss LSE zs,  b = eps ce / C,  c = (1 - eps) w_t ce

is the loss backward kernel's with eps' = 1 (which drops its target term: the target may lie on
another rank) and the whole row's LSE for its lse: per row it writes f (k P_j - u_j / C_l) s'_j,
f and k ours to choose through its incoming gradient and its stats. Without smoothing, zero
weights u (its uniform term silenced) and f = dl a; with unweighted smoothing, u = 1 and f, k
from b and a (``_kernel_call``); with weighted smoothing, the former and the term b w_j added by
torch operations. The target's own column, where this slice holds it, is then written from the
exchanged z_t (one value a row: ``take`` and ``put_``), rounded once as the kernel rounds. One read and
one write of the slice; with the forward's read, the floor of three passes.
"""
from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple, Optional, Union

import torch
import torch.distributed as dist

from portable_softmax import loss, loss_arguments, loss_reduction, loss_rows
from portable_softmax.loss_arguments import Options

_NAME = "portable_softmax.distributed.cross_entropy"
# Slice sizes cross the MAX all-reduce in the partials' dtype as two parts, each exact in float32.
_SIZE_SPLIT = 1 << 12


class Exchanged(NamedTuple):
    """What the forward keeps for the gradient: per row (the positions' shape), then the call's
    values on the device (0-d; None where its options need none)."""

    kernel_target: torch.Tensor  # the backward kernel's target (``_kernel_target``)
    counted: torch.Tensor  # the target is not ignore_index
    held: torch.Tensor  # counted, and this slice holds the target
    index: torch.Tensor  # the target's column in this slice (clamped into it where it holds none)
    target_logit: torch.Tensor  # z_t, after the softcap (0 where ignored, NaN where M is not finite): exchanged
    lse: torch.Tensor  # the whole row's
    target_weight: Optional[torch.Tensor]  # w_t (weighted calls)
    ce: torch.Tensor  # the reduction's factors (1 unless 'mean')
    zs: torch.Tensor
    classes: Optional[torch.Tensor]  # C and W = sum_c w_c (with smoothing)
    weight_sum: Optional[torch.Tensor]
    local_weight: Optional[torch.Tensor]  # this slice's class weights (weighted smoothing)

    def rows(self, start: int, stop: int) -> Exchanged:
        """The values of rows [start, stop) (of a 2-D call's)."""
        return Exchanged(*(None if t is None else t[start:stop] for t in self[:_PER_ROW]), *self[_PER_ROW:])

    @staticmethod
    def joined(parts: list[Exchanged]) -> Exchanged:
        """The values of consecutive blocks of rows (one call's, in chunks) as one."""
        return Exchanged(*(None if ts[0] is None else torch.cat(ts) for ts in zip(*(p[:_PER_ROW] for p in parts))),
                         *parts[0][_PER_ROW:])


# Exchanged's fields of one value per row come first.
_PER_ROW = 7


class _Kept(NamedTuple):
    """A call's constants on the device, made once per device, rank, slice and positions: every
    tensor op costs a GPU call some microseconds of host time, and the step is short enough that
    they are its time (issue 33)."""

    code: torch.Tensor  # this slice's size in its place among zeros (two parts), then -1: the MAX payload's tail
    bounds: torch.Tensor  # int64 (2, 2 ranks + 1): the reduced code's [offset, C - 1] as weighted sums
    base: torch.Tensor  # ``_base``
    ignored: torch.Tensor  # int32 -1 per position (strides 0): the forward kernel's lse alone
    zero_index: torch.Tensor  # 0-d int64


@functools.lru_cache(maxsize=64)
def _kept(device: torch.device, acc: torch.dtype, rank: int, ranks: int, n_local: int,
          positions: tuple[int, ...]) -> _Kept:
    code = [0.0] * (2 * ranks) + [-1.0]
    code[2 * rank], code[2 * rank + 1] = float(n_local // _SIZE_SPLIT), float(n_local % _SIZE_SPLIT)
    bounds = torch.zeros((2, 2 * ranks + 1), dtype=torch.int64)
    bounds[:, 0:2 * ranks:2], bounds[:, 1:2 * ranks:2], bounds[1, -1] = _SIZE_SPLIT, 1, 1
    bounds[0, 2 * rank:] = 0
    return _Kept(torch.tensor(code, dtype=acc, device=device), bounds.to(device), _base(device, positions, n_local),
                 torch.full((), -1, dtype=torch.int32, device=device).expand(positions),
                 torch.zeros((), dtype=torch.int64, device=device))


def _group_ranks(group: Optional[dist.ProcessGroup]) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{_NAME}: torch.distributed is not initialized (call init_process_group first)")
    return dist.get_rank(group), dist.get_world_size(group)


def _capped(x: torch.Tensor, softcap: Optional[float]) -> torch.Tensor:
    return x if softcap is None else softcap * torch.tanh(x / softcap)


def _local_lse(x: torch.Tensor, lse: torch.Tensor, scratch: torch.Tensor, kept: _Kept, options: Options) -> None:
    """The slice's lse per row into ``lse`` (module docstring, step 1; -inf for an empty slice);
    the kernel's loss rows, all 0, into ``scratch``."""
    if x.shape[1] == 0:
        lse.fill_(-math.inf)
        return
    kernel_options = Options(x.shape[1], False, "none", -1, 0.0, 0.0, options.softcap, False)
    stats = loss_reduction.stats(x, kept.ignored, None, kernel_options)  # a kept constant: no op
    if not loss_rows.launch_forward(x, kept.ignored, None, stats, scratch, lse, None, kernel_options):
        loss_rows.launch_forward(x.contiguous(), kept.ignored, None, stats, scratch, lse, None, kernel_options)


def _smoothing_sum(x: torch.Tensor, local_weight: Optional[torch.Tensor], out: torch.Tensor,
                   lse: torch.Tensor, options: Options) -> None:
    """S_r = sum_c w_c z_c of the slice into ``out`` and its lse into ``lse`` (module docstring,
    step 1): the kernel with probability targets of 1 gives A lse - S_r, A = sum_c w_c."""
    if x.shape[1] == 0:
        out.zero_()
        lse.fill_(-math.inf)
        return
    acc = out.dtype
    target = torch.ones((), dtype=acc, device=x.device).expand(x.shape)
    kernel_options = Options(x.shape[1], True, "none", -100, 0.0, 0.0, options.softcap, local_weight is not None)
    stats = loss_reduction.stats(x, target, local_weight, kernel_options)
    if not loss_rows.launch_forward(x, target, local_weight, stats, out, lse, None, kernel_options):
        loss_rows.launch_forward(x.contiguous(), target, local_weight, stats, out, lse, None, kernel_options)
    if local_weight is None:
        out.neg_().add_(lse, alpha=float(x.shape[1]))
    else:
        out.neg_().addcmul_(lse, local_weight.sum(dtype=acc))


def _target_weights(target: torch.Tensor, counted: torch.Tensor, weight: torch.Tensor,
                    acc: torch.dtype) -> torch.Tensor:
    """w_t of each counted position (0 ignored). A target outside the classes reads class 0's
    weight here: its loss is NaN anyway."""
    return weight.to(acc)[target.clamp(0, weight.shape[0] - 1)].masked_fill_(~counted, 0)


def _factors(target: torch.Tensor, counted: torch.Tensor, w_t: Optional[torch.Tensor], options: Options,
             acc: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    if options.reduction != "mean":
        one = loss_reduction.constant(target.device, acc, (1.0,))
        return one, one
    count = counted.sum(dtype=acc).reciprocal_()
    return (count if w_t is None else w_t.sum().reciprocal_()), count


def factors(target: torch.Tensor, weight: Optional[torch.Tensor], options: Options, acc: torch.dtype
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """The reduction's factors (ce, zs) of a batch of targets, on the device: 1 / the denominators
    of 'mean' (the summed weights of the counted targets, their count: ``loss_reduction.stats``'s),
    1 otherwise."""
    counted = target != options.ignore_index
    w_t = None if weight is None or options.reduction != "mean" else _target_weights(target, counted, weight, acc)
    return _factors(target, counted, w_t, options, acc)


def _check(target: torch.Tensor, valid: torch.Tensor, counted: torch.Tensor, last_class: torch.Tensor,
           weight: Optional[torch.Tensor]) -> None:
    """On CPU, where it costs no synchronisation (every rank raises alike: they hold the same
    targets): the slices add up to the class weights, every counted target names a class."""
    n_classes = int(last_class) + 1
    if weight is not None and weight.shape[0] != n_classes:
        raise ValueError(f"{_NAME}: weight has {weight.shape[0]} values but the slices hold {n_classes} classes; "
                         f"pass the whole class weight (C,) on every rank")
    bad = counted & ~valid
    if bad.any():
        raise IndexError(f"{_NAME}: target {int(target[bad].flatten()[0])} is out of bounds for {n_classes} classes "
                         f"(expected 0 to {n_classes - 1}, or ignore_index)")


def _kernel_ignore(options: Options) -> int:
    """The backward kernel's ignore_index: the call's where it names no class (a column of the
    slice is never it), else -1 (``_kernel_target``)."""
    return options.ignore_index if options.ignore_index < 0 else -1


def _kernel_target(target: torch.Tensor, counted: torch.Tensor, valid: torch.Tensor, index: torch.Tensor,
                   options: Options, n_local: int) -> torch.Tensor:
    """The backward kernel's target, whose value matters only through its tests (eps' = 1 drops its
    target term): a column of the slice where counted and valid, out of it where counted and
    invalid (NaN), the kernel's ignore_index where ignored. A negative ignore_index is the
    target itself there, and an invalid target out of the slice too: one ``where``."""
    if options.ignore_index < 0:
        return torch.where(valid, index, target)
    return torch.where(counted, torch.where(valid, index, n_local), -1)


def forward(x: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], options: Options,
            group: Optional[dist.ProcessGroup], scales: Optional[tuple[torch.Tensor, torch.Tensor]] = None
            ) -> tuple[torch.Tensor, Exchanged]:
    """The loss rows (scaled by the reduction's factors, in the accumulation dtype) of an (N, C_l,
    ...) slice and what the gradient needs (module docstring, steps 1 to 4). ``scales``: the
    reduction's factors (ce, zs) of a larger batch this is part of (formed here otherwise).

    The per-row arithmetic is a few large torch ops: the exchanged values are written into the
    all-reduces' buffers in place, the constants are kept (``_kept``), and what the default
    options do not need (target weights, smoothing sums, C as a float) is not formed."""
    rank, ranks = _group_ranks(group)
    acc = loss_arguments._acc(x.dtype)
    n_local, positions = x.shape[1], tuple(target.shape)
    n = target.numel()
    eps, weighted = options.smoothing, weight is not None
    kept = _kept(x.device, acc, rank, ranks, n_local, positions)
    zero, nan = _scalars(x.device, acc)
    counted = target != options.ignore_index
    w_t = _target_weights(target, counted, weight, acc) if weighted else None
    ce, zs = _factors(target, counted, w_t, options, acc) if scales is None else scales
    lse = torch.empty(positions, dtype=acc, device=x.device)
    # The SUM all-reduce's payload: exp(lse_r - M), z_t where held, S_r (with smoothing).
    summed = torch.empty((2 + (eps > 0), *positions), dtype=acc, device=x.device)
    parts = summed.unbind(0)
    if n and eps > 0 and not weighted:
        _smoothing_sum(x, None, parts[2], lse, options)  # and lse: one launch
    elif n:
        _local_lse(x, lse, parts[1], kept, options)
    peak = torch.cat([lse.view(-1) if lse.dim() != 1 else lse, kept.code])
    dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
    row_max, code = peak.split([n, kept.code.numel()])
    if len(positions) != 1:
        row_max = row_max.view(positions)
    # M, or 0 where M is infinite, as torch's logsumexp (``kernels/common._lse_reference``): a row
    # of -inf sums to 0 (lse -inf), one holding +inf to +inf (NaN with a NaN), not exp(inf - inf).
    reference = torch.nan_to_num(row_max, nan=math.nan, posinf=0.0, neginf=0.0)
    torch.sub(lse, reference, out=parts[0]).exp_()
    offset, last_class = (code.to(torch.int64) * kept.bounds).sum(1).unbind()
    valid = torch.clamp(target, kept.zero_index, last_class) == target
    if x.device.type == "cpu":
        _check(target, valid, counted, last_class, weight)
    local_weight = None
    if n_local:
        column = target - offset
        index = column.clamp(0, n_local - 1)
        held = index == column
        if options.ignore_index >= 0:
            held &= counted
        x_t = x.take(torch.add(kept.base, index, alpha=math.prod(positions[1:])))
        z_t = _capped(x_t.to(acc), options.softcap)
        torch.where(held, z_t, zero, out=parts[1])
    else:
        index = torch.zeros_like(target)
        held = torch.zeros_like(counted)
        parts[1].zero_()
    if weighted and eps > 0:
        # Weighted smoothing needs the slice's weights, which need its offset: S_r now.
        local_weight = weight.index_select(0, offset + torch.arange(n_local, device=x.device))
        if n:
            _smoothing_sum(x, local_weight, parts[2], lse, options)
    if summed.numel():
        dist.all_reduce(summed, group=group)
    lse = torch.log(parts[0]).add_(reference)
    # z_t NaN where M is not finite (z_t + M * 0, one op): a counted row holding +inf then has its
    # loss NaN, as torch's, not lse - z_t = +inf, and its gradient's target column (``gradient``)
    # NaN, not exp(z_t - lse) = 0 (the other columns are: ``loss_terms._grad_of``).
    z_t = parts[1].addcmul_(row_max, zero)
    classes = weight_sum = None
    if weighted:
        # A weight of another length than the slices' sum (raised on CPU) poisons the result.
        lse = torch.where(last_class + 1 == weight.shape[0], lse, nan)
    rows = lse - z_t
    if weighted:
        rows.mul_(w_t)
    if eps > 0:
        classes = (last_class + 1).to(acc)
        weight_sum = weight.sum(dtype=acc) if weighted else classes
        rows.mul_(1.0 - eps).add_((weight_sum * lse - parts[2]).mul_(eps / classes))
    # Ignored rows 0, then scaled: a 'mean' of no counted target is 0 / 0 = NaN, as torch's.
    rows = torch.where(counted, torch.where(valid, rows, nan), zero)
    if options.reduction == "mean":
        rows.mul_(ce)
    if options.z_loss:
        rows.add_(torch.where(counted, lse * lse, zero).mul_(zs * options.z_loss))
    kernel_target = _kernel_target(target, counted, valid, index, options, n_local)
    return rows, Exchanged(kernel_target, counted, held, index, z_t, lse, w_t, ce, zs, classes, weight_sum,
                           local_weight)


def _a(saved: Exchanged, options: Options) -> Optional[torch.Tensor]:
    """a of the module docstring's gradient, per row (or one value; None where it is 1), for the
    counted rows."""
    eps, w_t = options.smoothing, saved.target_weight
    a = w_t
    if eps > 0:
        a = (1.0 - eps) * (w_t if w_t is not None else 1.0) + eps * saved.weight_sum / saved.classes
    if options.reduction == "mean":
        a = saved.ce if a is None else a * saved.ce
    if options.z_loss:
        term = (2.0 * options.z_loss) * saved.zs * saved.lse
        a = term.add_(1.0) if a is None else term.add_(a)
    return a


def _kernel_call(x: torch.Tensor, saved: Exchanged, incoming: torch.Tensor, a: Optional[torch.Tensor],
                 options: Options) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor, Options]:
    """The loss backward kernel's per-row incoming gradient, weights, stats and options that make
    it write f (k P_j - u_j / C_l) s'_j as the module docstring's gradient needs."""
    n_local, acc = x.shape[1], saved.lse.dtype
    eps, zl = options.smoothing, options.z_loss
    zero, _ = _scalars(x.device, acc)
    ignore = _kernel_ignore(options)
    if eps > 0 and not options.weighted:
        # u = 1 (unweighted): f = dl b C_l, and k = a / (b C_l) = W' / C_l + 2 zl' LSE, b = eps ce / C.
        b_local = saved.ce * (eps * n_local) / saved.classes
        factor = torch.where(saved.counted, incoming * b_local, zero)
        one = loss_reduction.constant(x.device, acc, (1.0,))
        stats = torch.cat([one, one, saved.classes.reshape(1) / eps, one, (saved.zs * zl / b_local).reshape(1),
                           loss_reduction.constant(x.device, acc, (options.softcap or 1.0,))])
        return factor, None, stats, Options(n_local, False, "none", ignore, 1.0, zl, options.softcap, False)
    # u = 0 (the uniform term silenced), k = 1: f = dl a.
    factor = torch.where(saved.counted, incoming * a if a is not None else incoming, zero)
    stats = loss_reduction.constant(x.device, acc, (1.0, 1.0, float(n_local), 1.0, 0.0, options.softcap or 1.0))
    return factor, _zeros(x.device, acc, n_local), stats, Options(n_local, False, "none", ignore, 1.0, 0.0,
                                                                    options.softcap, True)


def _uniform_term(x: torch.Tensor, saved: Exchanged, incoming: torch.Tensor, options: Options) -> torch.Tensor:
    """dl b w_j s'_j over the slice (weighted smoothing: the zero weights left it out of the
    kernel's gradient), in the accumulation dtype."""
    acc = saved.lse.dtype
    shape = (1, x.shape[1]) + (1,) * (x.dim() - 2)
    b = options.smoothing * saved.ce / saved.classes
    term = (incoming * b * saved.counted).unsqueeze(1) * saved.local_weight.to(acc).view(shape)
    if options.softcap is not None:
        term = term * (1.0 - torch.tanh(x.to(acc) / options.softcap) ** 2)
    return term


def gradient(x: torch.Tensor, saved: Exchanged, dloss: torch.Tensor, options: Options,
             inplace: bool = False) -> torch.Tensor:
    """d loss / d x of the local slice from the forward's ``saved`` values and the incoming
    gradient (one value, or one per position for 'none'); into x's storage with ``inplace``."""
    n_local = x.shape[1]
    if n_local == 0 or x.numel() == 0:
        return torch.zeros_like(x)
    acc, eps = saved.lse.dtype, options.smoothing
    incoming = dloss.to(acc)
    if options.reduction != "none" and incoming.dim():
        incoming = incoming.reshape(())
    # The target's place in the slice (flattened: take, put_), and its logit as read where the
    # softcap's derivative needs it: before the kernel, which may write over x.
    flat = torch.add(_base(x.device, tuple(saved.index.shape), n_local), saved.index, alpha=math.prod(x.shape[2:]))
    x_t = x.take(flat).to(acc) if options.softcap is not None else None
    uniform = _uniform_term(x, saved, incoming, options) if eps > 0 and options.weighted else None
    a = _a(saved, options)
    factor, kernel_weight, stats, kernel_options = _kernel_call(x, saved, incoming, a, options)
    grad = loss_rows.backward(x, saved.kernel_target, kernel_weight, stats, saved.lse, factor, kernel_options, inplace)
    if uniform is not None:
        grad.copy_(grad.to(acc) - uniform)
    # The target's column, where this slice holds it, from its logit: rounded once.
    # dl (a P_t - b w_t - c), b = eps ce / C, c = (1 - eps) w_t ce.
    p_t = torch.sub(saved.target_logit, saved.lse).exp_()
    if eps == 0 and not options.z_loss:
        value = p_t.sub_(1.0).mul_(factor)  # a = c, b = 0: f (P_t - 1)
    else:
        w_t = saved.target_weight if saved.target_weight is not None else 1.0
        c = (1.0 - eps) * w_t * saved.ce
        if eps > 0:
            c = c + eps * saved.ce / saved.classes * w_t
        value = p_t.mul_(a if a is not None else 1.0).sub_(c).mul_(incoming)
    if x_t is not None:
        value.mul_(1.0 - torch.tanh(x_t / options.softcap) ** 2)
    current = grad.take(flat)
    grad.put_(flat, torch.where(saved.held, value.to(grad.dtype), current))
    return grad


@functools.lru_cache(maxsize=64)
def _scalars(device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """0 and NaN, kept on the device (a Python number in ``where`` is an op of its own)."""
    return torch.zeros((), dtype=dtype, device=device), torch.full((), math.nan, dtype=dtype, device=device)


@functools.lru_cache(maxsize=64)
def _zeros(device: torch.device, dtype: torch.dtype, n: int) -> torch.Tensor:
    """A kept zero vector (the silenced weights of the backward kernel)."""
    return torch.zeros(n, dtype=dtype, device=device)


@functools.lru_cache(maxsize=64)
def _base(device: torch.device, positions: tuple[int, ...], n_local: int) -> torch.Tensor:
    """Each position's (row, class 0) place in an (N, C_l, ...) slice flattened, int64: the
    target's is this plus its column times the positions past the rows (``take``, ``put_``)."""
    inner = math.prod(positions[1:])
    rows = torch.arange(positions[0]).view(-1, 1) * (n_local * inner)
    return (rows + torch.arange(inner)).view(positions).to(device)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], options: Options,
                group: Optional[dist.ProcessGroup]) -> tuple[torch.Tensor, torch.Tensor]:
        rows, saved = forward(x, target, weight, options, group)
        ctx.options = options
        ctx.set_materialize_grads(False)  # lse's gradient, never used: no zeros made for it
        ctx.save_for_backward(x, *saved)
        lse = saved.lse
        ctx.mark_non_differentiable(lse)
        return loss_reduction.reduced(rows, x.dtype, options), lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, dloss: torch.Tensor, _: Optional[torch.Tensor]):
        x, *saved = ctx.saved_tensors
        return gradient(x, Exchanged(*saved), dloss, ctx.options), None, None, None, None


def validate(logits: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], ignore_index: int,
             reduction: str, label_smoothing: float, z_loss: float, softcap: Optional[float]) -> Options:
    """The options of a call (``n_classes``: the local slice's), or one error naming the argument."""
    if isinstance(target, torch.Tensor) and target.is_floating_point():
        raise NotImplementedError(f"{_NAME}: class probabilities over a sharded vocabulary are not supported "
                                  f"(neither are they by torch's loss_parallel); pass class indices")
    options = loss_arguments.validate(logits, target, None, ignore_index, reduction, label_smoothing, z_loss, softcap)
    if weight is not None:
        if not isinstance(weight, torch.Tensor) or not weight.is_floating_point() or weight.dim() != 1:
            raise TypeError(f"{_NAME}: weight must be a 1-D floating tensor of one value per class (all C classes, "
                            f"as every rank holds it), got {getattr(weight, 'shape', type(weight).__name__)}")
        if weight.device != logits.device:
            raise ValueError(f"{_NAME}: weight is on {weight.device}, logits on {logits.device}; move it there")
    return options._replace(weighted=weight is not None)


def cross_entropy(logits_local: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor] = None, *,
                  group: Optional[dist.ProcessGroup] = None, ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0, z_loss: float = 0.0, softcap: Optional[float] = None,
                  return_lse: bool = False) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """The cross-entropy of logits whose classes the ranks of ``group`` hold in slices, as
    ``portable_softmax.cross_entropy`` of the whole logits (its options, torch's semantics).

    Args:
        logits_local: this rank's slice of the classes, (C_l,), (N, C_l) or (N, C_l, d1, ...);
            the slices are contiguous and in rank order, of any lengths (0 too).
        target: class indices into all C classes, the same on every rank, shape (), (N) or
            (N, d1, ...).
        weight: a weight per class, all C of them (as torch's ``loss_parallel`` takes a
            replicated weight), the same on every rank.
        group: the process group holding the slices (default: the world).
        ignore_index, reduction, label_smoothing, z_loss, softcap, return_lse: as
            ``portable_softmax.cross_entropy``'s.

    Returns:
        The loss of the whole on every rank (with ``return_lse``, also the whole row's lse per
        position, float32), differentiable once with respect to ``logits_local``: the backward
        writes this slice's gradient and takes no collective.

    Raises:
        RuntimeError: torch.distributed is not initialized.
        TypeError, ValueError: an argument of the wrong type, shape, device or range (named).
        NotImplementedError: class probabilities as the target.
        IndexError: on CPU, a counted target outside [0, C) (on an accelerator its loss is NaN), or
            (ValueError) a weight whose length is not the slices' sum.
    """
    options = validate(logits_local, target, weight, ignore_index, reduction, label_smoothing, z_loss, softcap)
    x = loss._after_autocast(logits_local)
    one_dim = x.dim() == 1
    if one_dim:
        x, target = x.unsqueeze(0), target.reshape(1)
    if torch.is_grad_enabled() and x.requires_grad:
        result, lse = _VocabParallelCrossEntropy.apply(x, target, weight, options, group)
    else:
        rows, saved = forward(x, target, weight, options, group)
        result, lse = loss_reduction.reduced(rows, x.dtype, options), saved.lse
    if one_dim:
        lse = lse.reshape(())
        result = result.reshape(()) if options.reduction == "none" else result
    return (result, lse) if return_lse else result


__all__ = ["cross_entropy", "factors", "forward", "gradient"]
