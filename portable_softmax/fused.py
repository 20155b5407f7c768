"""The fused variants of ``softmax`` and ``log_softmax``: ``scale=`` (a temperature), ``mask=``
(bool: keep where True; floating: added after the scaling) and ``causal=`` (SDPA's ``is_causal``,
top-left aligned), as ``softmax(x * scale + mask)`` with the masked positions constants.

Every regime's kernels have the fused variants (``kernels.fused._fused_terms``: the mask read in its own
dtype through its broadcast strides, the scale per row), over the last dimension or any other: one
read of x and of the mask, one write. A mask or scale whose leading strides do not merge is
composed from torch operations and the plain kernels, with the same results. A row the bool mask
leaves empty gives 0 (log_softmax: -inf), as ``torch._masked_softmax``; a row an additive mask
makes all -inf gives NaN, as the composite does.

Gradients reach x, a scale tensor that requires one and a floating mask that requires one (a
learnable position bias, as ``torch.softmax(x * scale + mask)`` trains it: d mask is the gradient
with respect to the scaled and masked input, summed over the dimensions the mask broadcasts
along); none flows where the bias is -inf. A bool mask is a constant.

Calls are kept by signature (``_signature``), as ``op_calls`` keeps plain ones: a repeated call is a
lookup, an allocation and a launch on the call's own tensors.

Under ``torch.compile`` a call is one custom operator, ``portable_softmax::fused_softmax`` (its
backward ``fused_softmax_backward``), with fake and autograd registrations as ``torch_ops``'
(torch 2.4+).
"""
from __future__ import annotations

import math
from numbers import Real
from typing import Any, Optional, Union

import torch

from portable_softmax import launch, row_layout, op_arguments, op_calls, ops
from portable_softmax.backend import on_registry_change
from portable_softmax.launch_plan import Fusion
from portable_softmax.tuning import TUNING
from portable_softmax.torch_ops import HAS_CUSTOM_OP, NAMESPACE

Scale = Union[float, torch.Tensor, None]


def _check(x: torch.Tensor, dim: int, scale: Scale, mask: Optional[torch.Tensor], causal: bool, name: str) -> None:
    where = f"portable_softmax.{name}"
    if causal and (x.dim() < 2 or dim != x.dim() - 1):
        raise ValueError(f"{where}: causal=True needs the last dimension of a tensor of 2 or more dimensions "
                         f"(dim {dim} of {x.dim()})")
    if mask is not None:
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"{where}: mask must be a tensor, got {type(mask).__name__}")
        op_arguments._check_served(mask, name, "mask")
        if mask.dtype != torch.bool and not mask.is_floating_point():
            raise TypeError(f"{where}: mask must be bool (keep where True) or floating (added), got {mask.dtype}")
        if not _broadcasts(mask.shape, x.shape):
            raise ValueError(f"{where}: mask of shape {tuple(mask.shape)} does not broadcast to {tuple(x.shape)}")
    if isinstance(scale, torch.Tensor):
        op_arguments._check_served(scale, name, "scale")
        if not scale.is_floating_point():
            raise TypeError(f"{where}: a scale tensor must be floating, got {scale.dtype}")
        if not _broadcasts(scale.shape, x.shape):
            raise ValueError(f"{where}: scale of shape {tuple(scale.shape)} does not broadcast to {tuple(x.shape)}")
        offset = x.dim() - scale.dim()
        if dim >= offset and scale.shape[dim - offset] != 1:
            raise ValueError(f"{where}: a scale tensor must have size 1 along dim {dim} (one value per row), got "
                             f"shape {tuple(scale.shape)}")
    elif scale is not None and (isinstance(scale, bool) or not isinstance(scale, Real)):
        raise TypeError(f"{where}: scale must be a number or a floating tensor, got {type(scale).__name__}")


def _broadcasts(shape: torch.Size, target: torch.Size) -> bool:
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target)))


def _leading(t: torch.Tensor, rank: int) -> Optional[tuple[int, int, int, int]]:
    """``t`` (expanded to a tensor of ``rank`` dims) seen as (A, heads, queries, keys): its strides
    (0 where it broadcasts), or None where its leading dims do not merge into one stride A."""
    sizes, strides = list(t.shape), list(t.stride())
    keys = strides[-1] if rank >= 1 else 0
    queries = strides[-2] if rank >= 2 else 0
    heads = strides[-3] if rank >= 3 else 0
    lead = [(size, stride) for size, stride in zip(sizes[:-3], strides[:-3]) if size != 1]
    a_stride = lead[-1][1] if lead else 0
    for (outer_size, outer_stride), (inner_size, inner_stride) in zip(lead, lead[1:]):
        if outer_stride != inner_stride * inner_size:
            return None
    return a_stride, heads, queries, keys


def _bias(x: torch.Tensor, mask: Optional[torch.Tensor], causal: bool) -> Optional[torch.Tensor]:
    """The composite's additive bias (float32, -inf where masked), or None without a mask."""
    bias = None
    if mask is not None:
        # A floating mask keeps its own precision where it is wider than float32 (a float64 bias).
        bias = (torch.where(mask, 0.0, -math.inf) if mask.dtype == torch.bool
                else mask.to(torch.promote_types(mask.dtype, torch.float32))).to(x.device)
    if causal:
        rows, cols = x.shape[-2], x.shape[-1]
        upper = torch.ones(rows, cols, dtype=torch.bool, device=x.device).triu(1)
        causal_bias = torch.zeros(rows, cols, device=x.device).masked_fill(upper, -math.inf)
        bias = causal_bias if bias is None else bias + causal_bias
    return bias


def _composite(x: torch.Tensor, dim: int, out_dtype: torch.dtype, log: bool, scale: Scale,
               mask: Optional[torch.Tensor], causal: bool) -> torch.Tensor:
    """The definition in torch operations and the plain kernels (differentiable through both: the
    gradient reaches x, a scale tensor and a floating mask, none where the bias is -inf)."""
    z = x.to(out_dtype) if not x.is_floating_point() else x
    if scale is not None:
        z = z * scale
    bias = _bias(x, mask, causal)
    if bias is not None:
        masked = torch.isneginf(bias).expand(z.shape)
        z = torch.where(masked, -math.inf, z + bias.to(z.dtype))
    y = (ops.log_softmax if log else ops.softmax)(z, dim, dtype=out_dtype)
    if mask is not None and mask.dtype == torch.bool:
        empty = masked.all(dim, keepdim=True)
        y = torch.where(empty, -math.inf if log else 0.0, y)
    return y


def _fusion(x: torch.Tensor, dim: int, scale: Scale, mask: Optional[torch.Tensor], causal: bool
            ) -> Optional[tuple[Fusion, torch.Tensor, torch.Tensor]]:
    """The fused variant of a call on contiguous ``x`` over ``dim``: the variant, the mask and
    scale tensors (x where absent); None where a mask or scale cannot be walked with their strides.
    The kernels number a contiguous tensor's rows in the order of ``x.movedim(dim, -1)``'s, and
    read the mask and scale seen the same way, as (A, heads, queries, ``dim``)."""
    rank = x.dim()
    moved = x.shape[:dim] + x.shape[dim + 1:] + x.shape[dim:dim + 1]
    heads = moved[-3] if rank >= 3 else 1
    queries = moved[-2] if rank >= 2 else 1
    mask_t, mask_strides, mask_kind = x, (0, 0, 0, 0), 0
    if mask is not None:
        mask_t = mask.to(x.device).expand(x.shape)
        mask_strides = _leading(mask_t.movedim(dim, -1), rank)
        if mask_strides is None:
            return None
        mask_kind = 1 if mask.dtype == torch.bool else 2
    scale_t, scale_strides, scale_kind, value = x, (0, 0, 0), 0, 1.0
    if isinstance(scale, torch.Tensor):
        scale_t = scale.to(x.device).expand(x.shape)
        found = _leading(scale_t.movedim(dim, -1), rank)
        if found is None:
            return None
        scale_strides, scale_kind = found[:3], 2
    elif scale is not None:
        scale_kind, value = 1, float(scale)
    fusion = Fusion(scale_kind, mask_kind, causal, (value, heads, queries, *mask_strides, *scale_strides))
    return fusion, mask_t, scale_t


# Fused calls by signature (``_signature``), as ``op_calls`` keeps plain ones: the launch (or None
# where the call is composed), so that a repeated call is a lookup and a launch. Emptied with op_calls'
# tables (the tuning table, the backend registry).
_forward_calls: dict[tuple, Optional["_Kernels"]] = {}
_backward_calls: dict[tuple, Optional["_Kernels"]] = {}
_MISSING = object()


def _forget_calls() -> None:
    _forward_calls.clear()
    _backward_calls.clear()


TUNING.on_change(_forget_calls)
on_registry_change(_forget_calls)


def _tensor_signature(t: torch.Tensor, device: torch.device) -> Optional[tuple]:
    # The kernels are specialised on a tensor's dtype and its pointer's 16-byte alignment; the
    # record holds its strides. A tensor on another device than x is copied each call: not kept.
    if type(t) is not torch.Tensor or t.device != device or torch._C._functorch.is_functorch_wrapped_tensor(t):
        return None
    try:
        return t.shape, t.stride(), t.dtype, t.data_ptr() % 16 == 0
    except RuntimeError:  # no strides or data pointer (sparse, nested, MKL-DNN): validation says so
        return None


def _signature(inputs: tuple[torch.Tensor, ...], dim: int, dtype: Optional[torch.dtype], log: bool, scale: Scale,
               mask: Optional[torch.Tensor], causal: bool) -> Optional[tuple]:
    """What a fused call's launch depends on, or None for calls that are not kept (tensor
    subclasses and wrappers, meta tensors, tracing, a mask or scale elsewhere or of no kind)."""
    first = inputs[0]
    if type(first) is not torch.Tensor or first.device.type == "meta" or ops._compiling() \
            or torch._C._functorch.is_functorch_wrapped_tensor(first):
        return None
    device = first.device
    parts: list[Any] = [dim, dtype, log, causal, device, op_calls._overrides()]
    for t in inputs:
        found = _tensor_signature(t, device)
        if found is None:
            return None
        parts.append(found)
    if isinstance(scale, torch.Tensor):
        found = _tensor_signature(scale, device)
        if found is None:
            return None
        parts.append(found)
    elif scale is None or (isinstance(scale, Real) and not isinstance(scale, bool)):
        # A number is one of the record's arguments: each value its own.
        parts.append(None if scale is None else float(scale))
    else:
        return None
    if mask is not None:
        found = _tensor_signature(mask, device) if isinstance(mask, torch.Tensor) else None
        if found is None:
            return None
        parts.append(found)
    else:
        parts.append(None)
    return tuple(parts)


class _Kernels:
    """A fused call signature's launch: the output allocated as torch lays it out, and the record
    (``launch.LaunchRecord``) launched on this call's tensors; the mask and scale tensors as the
    caller gave them (their expansions to x share their storage, which is what the kernels read
    through the strides the record holds), the input standing in for an absent one."""

    __slots__ = ("shape", "dtype", "device", "record")

    def __init__(self, out: torch.Tensor, record: launch.LaunchRecord) -> None:
        self.shape, self.dtype, self.device, self.record = out.shape, out.dtype, out.device, record

    def __call__(self, inputs: tuple[torch.Tensor, ...], scale: Scale, mask: Optional[torch.Tensor]) -> torch.Tensor:
        out = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        stand_in = inputs[0]
        self.record((*inputs, out, stand_in if mask is None else mask,
                     scale if isinstance(scale, torch.Tensor) else stand_in))
        return out


def _kernels(direction: str, inputs: tuple[torch.Tensor, ...], dim: int, out_dtype: torch.dtype, log: bool,
             scale: Scale, mask: Optional[torch.Tensor], causal: bool) -> Optional[_Kernels]:
    """The fused kernels' launch for contiguous ``inputs`` (x; or y and dy) over ``dim``, or None
    where the mask or scale cannot be walked with their strides, the tensor is empty, or a
    strided row is too long for 32-bit offsets."""
    first = inputs[0]
    found = _fusion(first, dim, scale, mask, causal)
    if found is None or first.numel() == 0:
        return None
    fusion, mask_t, scale_t = found
    out = torch.empty(first.shape, dtype=out_dtype, device=first.device)
    view = row_layout.row_view(tuple(first.shape), dim, *inputs, out)
    if view is None:
        return None
    # As the plain kernels: float64 accumulation for a float64 output forward, any float64 tensor backward.
    wide = (out_dtype,) if direction == "forward" else (*(t.dtype for t in inputs), out_dtype)
    return _Kernels(out, launch.build_record(direction, (*inputs, out, mask_t, scale_t), view, log,
                                             torch.float64 in wide, fusion=fusion))


def _kept(calls: dict[tuple, Optional[_Kernels]], key: Optional[tuple], direction: str,
          inputs: tuple[torch.Tensor, ...], dim: int, out_dtype: torch.dtype, log: bool, scale: Scale,
          mask: Optional[torch.Tensor], causal: bool) -> Optional[_Kernels]:
    """The launch kept for ``key`` in ``calls``, built (and kept, where there is a key) on a miss."""
    found = calls.get(key, _MISSING) if key is not None else _MISSING
    if found is _MISSING:
        found = _kernels(direction, inputs, dim, out_dtype, log, scale, mask, causal)
        if key is not None:
            op_calls._remember(calls, key, lambda: found)
    return found


def _fused_forward(x: torch.Tensor, dim: int, out_dtype: torch.dtype, log: bool, scale: Scale,
                   mask: Optional[torch.Tensor], causal: bool) -> Optional[torch.Tensor]:
    """The fused kernel on contiguous ``x`` over ``dim`` (validated), or None where it takes no
    kernel (``_kernels``)."""
    mask = _on(mask, x)
    key = _signature((x,), dim, out_dtype, log, scale, mask, causal)
    call = _kept(_forward_calls, key, "forward", (x,), dim, out_dtype, log, scale, mask, causal)
    return None if call is None else call((x,), scale, mask)


def _on(tensor: Optional[torch.Tensor], x: torch.Tensor) -> Optional[torch.Tensor]:
    return None if tensor is None else tensor.to(x.device)


def _fused_backward(y: torch.Tensor, dy: torch.Tensor, dim: int, grad_dtype: torch.dtype, log: bool, scale: Scale,
                    mask: Optional[torch.Tensor], causal: bool) -> torch.Tensor:
    """dx for x from the saved output (contiguous) over ``dim``: the fused backward kernel, or
    where it takes none (``_kernels``), the plain one with the scale and the masked zeros applied
    in torch. Kept by call signature (``_signature``) as the forward is."""
    dy = dy.contiguous()
    mask = _on(mask, y)
    key = _signature((y, dy), dim, grad_dtype, log, scale, mask, causal)
    call = _kept(_backward_calls, key, "backward", (y, dy), dim, grad_dtype, log, scale, mask, causal)
    if call is not None:
        return call((y, dy), scale, mask)
    dz = op_calls._backward(y, dy, dim, grad_dtype, log)
    if scale is not None:
        dz = dz * scale
    bias = _bias(y, mask, causal)
    if bias is not None:
        dz = torch.where(torch.isneginf(bias).expand(dz.shape), 0.0, dz)
    return dz.to(grad_dtype)


def _learnable(mask: Optional[torch.Tensor]) -> bool:
    """Whether ``mask`` is an input that takes a gradient: a floating mask that requires one (a
    learnable position bias); a bool mask is a constant."""
    return mask is not None and mask.requires_grad and mask.is_floating_point()


def _dz_dtype(grad_dtype: torch.dtype, mask: Optional[torch.Tensor]) -> torch.dtype:
    """The dtype of dz, the gradient with respect to ``x * scale + mask``: x's, or a learnable
    mask's where that is wider (torch's ``softmax(x + mask)`` computes in the promoted dtype)."""
    return grad_dtype if mask is None else torch.promote_types(grad_dtype, mask.dtype)


def _through_terms(dz: torch.Tensor, x: Optional[torch.Tensor], dim: int, scale: Scale,
                   mask: Optional[torch.Tensor], grad_dtype: Optional[torch.dtype]
                   ) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor], Optional[torch.Tensor]]:
    """dx, d scale and d mask from dz, the gradient with respect to ``z = x * scale + mask``:
    dx = dz * scale (where ``grad_dtype`` is given: x takes one), d scale = the sum over the row of
    x * dz (where ``x`` is given: the scale tensor takes one), d mask = dz (where ``mask`` is given:
    it takes one); the scale's and the mask's summed over the dimensions they broadcast along, in
    their dtypes and on their devices."""
    wide = torch.promote_types(dz.dtype, torch.float32)
    dscale = dmask = None
    if x is not None:
        dscale = (dz.to(wide) * x.to(wide)).sum(dim, keepdim=True).sum_to_size(scale.shape)
        dscale = dscale.to(scale.device, scale.dtype)
    if mask is not None:
        dmask = dz.to(wide).sum_to_size(mask.shape).to(mask.device, mask.dtype)
    dx = None
    if grad_dtype is not None:
        dx = (dz if scale is None else dz * scale).to(grad_dtype)
    return dx, dscale, dmask


class _FusedSoftmax(torch.autograd.Function):
    """The fused kernels for autograd: the gradient reaches x, a scale tensor that requires it (a
    learnable temperature) and a floating mask that requires it (a learnable position bias),
    as ``_through_terms`` gives them."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale_tensor: Optional[torch.Tensor], y: torch.Tensor, dim: int,
                scale: Scale, mask: Optional[torch.Tensor], causal: bool, log: bool) -> torch.Tensor:
        ctx.save_for_backward(y, x if scale_tensor is not None and scale_tensor.requires_grad else None)
        ctx.scale, ctx.mask, ctx.causal, ctx.log, ctx.grad_dtype, ctx.dim = scale, mask, causal, log, x.dtype, dim
        ctx.learnable_mask = _learnable(mask)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, dy: torch.Tensor):
        y, x = ctx.saved_tensors
        mask = ctx.mask if ctx.learnable_mask else None
        if x is None and mask is None:
            dx = _fused_backward(y, dy, ctx.dim, ctx.grad_dtype, ctx.log, ctx.scale, ctx.mask, ctx.causal)
            return dx, None, None, None, None, None, None, None
        # dz (no scale factor) first, then each input's gradient from it.
        dz = _fused_backward(y, dy, ctx.dim, _dz_dtype(ctx.grad_dtype, mask), ctx.log, None, ctx.mask, ctx.causal)
        dx, dscale, dmask = _through_terms(dz, x, ctx.dim, ctx.scale, mask,
                                           ctx.grad_dtype if ctx.needs_input_grad[0] else None)
        return dx, dscale, None, None, None, dmask, None, None


def _as_scale(tensor: Optional[torch.Tensor], value: Optional[float]) -> Scale:
    return tensor if tensor is not None else value


def _op_forward(x: torch.Tensor, dim: int, dtype: torch.dtype, log: bool, scale: Optional[torch.Tensor],
                scale_value: Optional[float], mask: Optional[torch.Tensor], causal: bool) -> torch.Tensor:
    with torch.no_grad():
        x = x.contiguous()
        found = _fused_forward(x, dim, dtype, log, _as_scale(scale, scale_value), mask, causal)
        if found is None:
            found = _composite(x, dim, dtype, log, _as_scale(scale, scale_value), mask, causal)
    return found


def _op_backward(y: torch.Tensor, dy: torch.Tensor, dim: int, grad_dtype: torch.dtype, log: bool,
                 scale: Optional[torch.Tensor], scale_value: Optional[float], mask: Optional[torch.Tensor],
                 causal: bool) -> torch.Tensor:
    return _fused_backward(y.contiguous(), dy, dim, grad_dtype, log, _as_scale(scale, scale_value), mask,
                           causal).contiguous()


def _op_fake(x: torch.Tensor, dim: int, dtype: torch.dtype, *rest: Any) -> torch.Tensor:
    return x.new_empty(x.shape, dtype=dtype)


def _op_setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    x, dim, _, log, scale, scale_value, mask, causal = inputs
    learnable = scale is not None and scale.requires_grad
    ctx.save_for_backward(output, x if learnable else None, scale, mask)
    ctx.scale_value, ctx.causal, ctx.log, ctx.grad_dtype, ctx.learnable = scale_value, causal, log, x.dtype, learnable
    ctx.dim, ctx.learnable_mask = dim, _learnable(mask)


def _op_gradient(ctx: Any, dy: torch.Tensor):
    """As ``_FusedSoftmax.backward``, through the backward operator."""
    y, x, scale, mask = ctx.saved_tensors
    if not (ctx.learnable or ctx.learnable_mask):
        dx = _fused_backward_op(y, dy, ctx.dim, ctx.grad_dtype, ctx.log, scale, ctx.scale_value, mask, ctx.causal)
        return dx, None, None, None, None, None, None, None
    learnable_mask = mask if ctx.learnable_mask else None
    dz = _fused_backward_op(y, dy, ctx.dim, _dz_dtype(ctx.grad_dtype, learnable_mask), ctx.log, None, None, mask,
                            ctx.causal)
    dx, dscale, dmask = _through_terms(dz, x, ctx.dim, _as_scale(scale, ctx.scale_value), learnable_mask,
                                       ctx.grad_dtype if ctx.needs_input_grad[0] else None)
    return dx, None, None, None, dscale, None, dmask, None


_fused_op = _fused_backward_op = None
if HAS_CUSTOM_OP:
    _definition = torch.library.custom_op(
        f"{NAMESPACE}::fused_softmax", _op_forward, mutates_args=(),
        schema="(Tensor x, int dim, ScalarType dtype, bool log, Tensor? scale, float? scale_value, Tensor? mask, "
               "bool causal) -> Tensor")
    _backward_definition = torch.library.custom_op(
        f"{NAMESPACE}::fused_softmax_backward", _op_backward, mutates_args=(),
        schema="(Tensor y, Tensor dy, int dim, ScalarType grad_dtype, bool log, Tensor? scale, float? scale_value, "
               "Tensor? mask, bool causal) -> Tensor")
    torch.library.register_fake(_definition, _op_fake)
    torch.library.register_fake(_backward_definition,
                                lambda y, dy, dim, grad_dtype, *rest: _op_fake(y, dim, grad_dtype))
    torch.library.register_autograd(_definition, _op_gradient, setup_context=_op_setup)
    _namespace = getattr(torch.ops, NAMESPACE)
    _fused_op = _namespace.fused_softmax.default
    _fused_backward_op = _namespace.fused_softmax_backward.default


def fused(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype], log: bool, scale: Scale,
          mask: Optional[torch.Tensor], causal: bool) -> torch.Tensor:
    """``softmax`` / ``log_softmax`` with ``scale``, ``mask`` or ``causal`` (``ops`` routes here).
    A repeated call signature (``_signature``) is a lookup and a launch."""
    key = _signature((x,), dim, dtype, log, scale, mask, causal) if isinstance(x, torch.Tensor) else None
    found = _forward_calls.get(key, _MISSING) if key is not None else _MISSING
    if found is not _MISSING and found is not None:
        with torch.no_grad():
            y = found((x.contiguous(),), scale, mask)
        return _differentiable(x, y, dim % x.dim(), scale, mask, causal, log)
    name = "log_softmax" if log else "softmax"
    meta = isinstance(x, torch.Tensor) and x.device.type == "meta"
    dim, out_dtype = (op_arguments._validate_meta if meta else op_arguments._validate)(x, dim, dtype, name)
    _check(x, dim, scale, mask, causal, name)
    if meta:
        return row_layout._output(x, out_dtype)
    kernels = x.is_floating_point() and x.dim() >= 1
    if kernels and _fused_op is not None and ops._compiling():
        tensor = scale if isinstance(scale, torch.Tensor) else None
        value = None if scale is None or tensor is not None else float(scale)
        return _fused_op(x, dim, out_dtype, log, tensor, value, mask, causal)
    if not kernels or _transformed(x, scale, mask):
        return _composite(x, dim, out_dtype, log, scale, mask, causal)
    contiguous, mask_on = x.contiguous(), _on(mask, x)
    with torch.no_grad():
        call = _kept(_forward_calls, key, "forward", (contiguous,), dim, out_dtype, log, scale, mask_on, causal)
        y = None if call is None else call((contiguous,), scale, mask_on)
    if y is None:
        # Composed with autograd on: its gradients are torch's through its operations.
        return _composite(x, dim, out_dtype, log, scale, mask, causal)
    return _differentiable(x, y, dim, scale, mask, causal, log)


def _differentiable(x: torch.Tensor, y: torch.Tensor, dim: int, scale: Scale, mask: Optional[torch.Tensor],
                    causal: bool, log: bool) -> torch.Tensor:
    """``y``, attached to autograd where the call needs a gradient (of x, of a scale tensor or of a
    floating mask)."""
    scale_tensor = scale if isinstance(scale, torch.Tensor) else None
    grad = torch.is_grad_enabled() and (x.requires_grad or (scale_tensor is not None and scale_tensor.requires_grad)
                                        or _learnable(mask))
    if not grad:
        return y
    return _FusedSoftmax.apply(x, scale_tensor, y, dim, scale, mask, causal, log)


def _transformed(*tensors: Any) -> bool:
    """Whether a ``torch.func`` transform wraps any of ``tensors`` (the composite takes those: its
    torch operations are what the transforms see through)."""
    return any(isinstance(t, torch.Tensor) and torch._C._functorch.is_functorch_wrapped_tensor(t) for t in tensors)


ops.use_fused(fused)
