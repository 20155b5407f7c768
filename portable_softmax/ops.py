"""The public operations: drop-in ``softmax`` and ``log_softmax`` with their backward.

This module validates arguments the way a user can act on, maps any dim of any strided tensor
onto the kernels' row view without copying where it can, and wires the kernels into autograd and
``torch.func``.

The hot path: a call is keyed on everything its launch depends on (shape, strides, dtypes,
device, dim, the 16-byte alignment of its data, autocast, the environment overrides) and finds a
``_Call`` built the first time: the output's size and strides and the launch record
(``launch.LaunchRecord``). Later calls allocate the output and launch; they validate, plan and
query nothing.
"""
from __future__ import annotations

import functools
import operator
import os
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any, Optional

import torch
import torch.autograd.forward_ad as forward_ad

from portable_softmax import launch
from portable_softmax.backend import BACKEND_ENV, on_registry_change
from portable_softmax.device import device_record
from portable_softmax.launch import PROGRAMS_ENV, RowView
from portable_softmax.tuning import TUNING

FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Column offsets times a column stride other than 1 are computed in 32 bits inside the kernels.
_MAX_COLUMN_SPAN = 2**31


class DimensionError(IndexError, ValueError):
    """``dim`` is out of range (an IndexError, as torch raises, and a ValueError)."""


def _check_dtype(what: str, dtype: torch.dtype, name: str) -> None:
    if dtype not in FLOATING:
        raise TypeError(f"portable_softmax.{name}: {what} must be float16, bfloat16, float32 or float64, got {dtype}")


def _check_served(t: torch.Tensor, name: str, argument: str = "input") -> None:
    """One line for the kinds of tensors the kernels do not read (they walk one dense strided
    buffer): sparse, nested and MKL-DNN layouts, quantized tensors. Raised before anything asks
    such a tensor for strides or a data pointer, which it lacks."""
    where = f"portable_softmax.{name}"
    if t.is_nested:  # strided or jagged layout
        raise NotImplementedError(f"{where}: a nested {argument} is not supported; call it on each component "
                                  f"({argument}.unbind()) or use torch.{name}")
    if t.is_sparse or t.layout not in (torch.strided, torch._mkldnn):
        # torch.softmax does not take them either; torch.sparse's treats unspecified elements as -inf.
        sparse = f", or torch.sparse.{name} for a {name} over the specified elements" if argument == "input" else ""
        raise NotImplementedError(f"{where}: a sparse {argument} ({t.layout}) is not supported; use "
                                  f"{argument}.to_dense(){sparse}")
    if t.layout == torch._mkldnn:
        raise NotImplementedError(f"{where}: an MKL-DNN {argument} is not supported; use {argument}.to_dense()")
    if t.is_quantized:
        raise TypeError(f"{where}: a quantized {argument} ({t.dtype}) is not supported; use {argument}.dequantize()")


def _validate(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype], name: str) -> tuple[int, torch.dtype]:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"portable_softmax.{name}: expected a torch.Tensor, got {type(x).__name__}")
    _check_served(x, name)
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"portable_softmax.{name}: dim must be an int, got {type(dim).__name__}")
    rank = max(x.dim(), 1)
    if not -rank <= dim < rank:
        raise DimensionError(f"portable_softmax.{name}: dim {dim} is out of range for a tensor of {x.dim()} "
                             f"dimension(s) (expected {-rank} to {rank - 1})")
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"portable_softmax.{name}: dtype must be a torch.dtype or None, got {type(dtype).__name__}")
    if dtype is None:
        # With dtype= any input torch takes is cast first (integer and bool too); without, as
        # torch, only floating inputs.
        _check_dtype("the input's dtype", x.dtype, name)
    out_dtype = x.dtype if dtype is None else dtype
    _check_dtype("dtype", out_dtype, name)
    record = device_record(x.device)
    for needed in {x.dtype, out_dtype}:
        if needed == torch.float64 and not record.supports_fp64:
            raise TypeError(f"portable_softmax.{name}: float64 is not supported on {record.name} "
                            f"(backend {record.backend!r}); convert to float32 first")
        if needed == torch.bfloat16 and not record.supports_bf16:
            raise TypeError(f"portable_softmax.{name}: bfloat16 is not supported on {record.name} ({record.arch})")
    return dim % rank, out_dtype


def row_view(shape: tuple[int, ...], dim: int, *tensors: torch.Tensor) -> Optional[RowView]:
    """The row view of ``tensors`` (all of ``shape``) for a softmax over ``dim``, or None when the
    rows of some tensor cannot be walked with two strides."""
    return _row_view(tuple(shape), dim, tuple(t.stride() for t in tensors))


@functools.lru_cache(maxsize=4096)
def _row_view(shape: tuple[int, ...], dim: int, strides: tuple[tuple[int, ...], ...]) -> Optional[RowView]:
    n_cols = shape[dim]
    col_strides = [s[dim] for s in strides]
    widest = max(col_strides, default=0)
    if widest != 1 and (n_cols - 1) * widest >= _MAX_COLUMN_SPAN:
        # A strided row spanning 2**31 elements or more: its column offsets would overflow the
        # kernels' 32-bit column arithmetic; the caller makes the row contiguous. A contiguous row
        # that long streams through the loop regime, whose offsets are 64-bit (planner._can_split).
        return None
    others = [d for d in range(len(shape)) if d != dim and shape[d] != 1]
    # Walk the row dimensions in the first tensor's memory order, merging neighbours that are
    # contiguous with each other in every tensor.
    others.sort(key=lambda d: -strides[0][d])
    groups: list[tuple[int, list[int]]] = []
    for d in others:
        dim_strides = [s[d] for s in strides]
        if groups:
            size, last = groups[-1]
            if all(prev == s * shape[d] for prev, s in zip(last, dim_strides)):
                groups[-1] = (size * shape[d], dim_strides)
                continue
        groups.append((shape[d], dim_strides))
    if len(groups) > 2:
        return None
    while len(groups) < 2:
        groups.insert(0, (1, [0] * len(strides)))
    (n_outer, outer_strides), (rows, row_strides) = groups
    triples = tuple((o, r, c) for o, r, c in zip(outer_strides, row_strides, col_strides))
    return RowView(n_outer, rows, n_cols, triples)


def _output(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An output for ``t`` as torch lays its own out: softmax, log_softmax and their backward
    return contiguous tensors whatever the input's strides (transposed, channels-last, sliced,
    expanded, permuted), so ``.view`` works on them. One rule for every device: the four ops are
    structured kernels whose shared meta functions (``TORCH_META_FUNC(_softmax)`` and its
    siblings in aten/src/ATen/native/SoftMax.cpp) allocate the output with
    ``LEGACY_CONTIGUOUS_MEMORY_FORMAT`` before the CPU or CUDA implementation runs."""
    return torch.empty(t.shape, dtype=dtype, device=t.device)


# ----------------------------------------------------------------------------------------------
# Call records: what one call signature needs, built once.
# ----------------------------------------------------------------------------------------------

# The environment overrides, read from os.environ's own mapping where CPython has one: a lookup
# there costs a twentieth of os.environ.get, which encodes the name on every call.
_ENVIRON = getattr(os.environ, "_data", None)
_OVERRIDES = tuple(os.environ.encodekey(name) if _ENVIRON is not None else name  # type: ignore[attr-defined]
                   for name in (PROGRAMS_ENV, BACKEND_ENV))


def _overrides() -> tuple:
    if _ENVIRON is not None:
        return _ENVIRON.get(_OVERRIDES[0]), _ENVIRON.get(_OVERRIDES[1])
    return os.environ.get(_OVERRIDES[0]), os.environ.get(_OVERRIDES[1])


class _Call:
    """One call signature's work: allocate the output as torch lays it out (``_output``), and
    launch through the record (``launch.LaunchRecord``). A forward call also holds the backward
    call of its output's usual gradient (``gradient``)."""

    __slots__ = ("size", "stride", "dtype", "device", "record", "grad")

    def __init__(self, out: torch.Tensor, record: Callable) -> None:
        self.size, self.stride, self.dtype, self.device = out.shape, out.stride(), out.dtype, out.device
        self.record = record
        # (generation, overrides, backward call) for a dy laid out as the output: ``gradient``.
        self.grad: Optional[tuple] = None

    def gradient(self, y: torch.Tensor, dy: torch.Tensor, dim: int, grad_dtype: torch.dtype,
                 log: bool) -> torch.Tensor:
        """``_backward`` of this forward call's output ``y`` (as autograd's backward of
        ``_Softmax`` asks it). The backward call of a dy laid out as ``y`` (same strides and
        dtype, aligned: the usual gradient) is kept here, found again by a few comparisons rather
        than by building and hashing its key, about 40% of the host's backward work that is ours;
        within the generation of the call tables it was found in and under the same overrides."""
        held = self.grad
        usual = dy.dtype == self.dtype and dy.stride() == self.stride and dy.data_ptr() % 16 == 0
        if usual and held is not None and held[0] == _generation and held[1] == _overrides():
            return held[2](y, dy)
        generation, overrides = _generation, _overrides()
        call = _backward_lookup(y, dy, dim, grad_dtype, log)
        if usual:
            self.grad = (generation, overrides, call)
        return call(y, dy)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A fresh allocation is 16-byte aligned (torch's allocators align to 64 bytes or more),
        # as the binary in the record was specialised for.
        y = torch.empty_strided(self.size, self.stride, dtype=self.dtype, device=self.device)
        self.record((x, y))
        return y

    def backward(self, y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
        dx = torch.empty_strided(self.size, self.stride, dtype=self.dtype, device=self.device)
        self.record((y, dy, dx))
        return dx


# Calls by key; bounded so that a stream of distinct shapes cannot grow them forever; emptied when
# what they were planned from changes (the tuning table, the backend registry).
_forward_calls: dict[tuple, Callable[[torch.Tensor], torch.Tensor]] = {}
_backward_calls: dict[tuple, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {}
_CALLS_LIMIT = 4096
_build_lock = threading.Lock()


def _remember(calls: dict[tuple, Callable], key: tuple, build: Callable[[], Callable]) -> Callable:
    """Build the call record for ``key`` and keep it (builds take turns; the table is bounded).
    Called only on a miss: the hot path pays for no closure."""
    with _build_lock:
        if len(calls) >= _CALLS_LIMIT:
            calls.clear()
        found = calls[key] = build()
    return found


# Counts the emptyings of the call tables: a backward call a forward call holds (``_Call.grad``)
# is used only within the generation it was found in.
_generation = 0


def _forget_calls() -> None:
    global _generation
    _generation += 1
    _forward_calls.clear()
    _backward_calls.clear()


TUNING.on_change(_forget_calls)
on_registry_change(_forget_calls)


# Whether torch has autocast for a device type (not for meta tensors): asked once per type.
_autocast_available: dict[str, bool] = {}


def _autocast_dtype(x: torch.Tensor, out_dtype: torch.dtype, log: bool) -> torch.dtype:
    """The output dtype torch's own softmax gives ``x`` under the autocast now enabled for its
    device type: asked of torch itself (on CUDA softmax runs in float32; on CPU it keeps the
    input's dtype), once per state."""
    return _autocast_policy(x.device, x.dtype, torch.get_autocast_dtype(x.device.type), log) or out_dtype


@functools.lru_cache(maxsize=None)
def _autocast_policy(device: torch.device, dtype: torch.dtype, autocast: torch.dtype, log: bool) -> Optional[torch.dtype]:
    with torch.autocast(device.type, dtype=autocast):
        result = (torch.log_softmax if log else torch.softmax)(torch.zeros(1, dtype=dtype, device=device), -1).dtype
    return None if result == dtype else result


def _forward_call(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype], log: bool,
                  autocast: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    name = "log_softmax" if log else "softmax"
    if x.device.type == "meta":
        _, out_dtype = _validate_meta(x, dim, dtype, name)
        return lambda x: _output(x, out_dtype)
    dim, out_dtype = _validate(x, dim, dtype, name)
    if autocast and dtype is None:
        out_dtype = _autocast_dtype(x, out_dtype, log)
    if not x.is_floating_point():
        # torch casts first; the kernels read floating inputs only.
        return lambda x: _forward(x.to(out_dtype), dim, None, log)
    if x.dim() == 0:
        return lambda x: _forward(x.reshape(1), 0, out_dtype, log).reshape(())
    template = _output(x, out_dtype)
    if x.numel() == 0:
        return lambda x: _output(x, out_dtype)
    view = row_view(tuple(x.shape), dim, x, template)
    if view is None:
        # Rows that no two strides walk in both x and the contiguous output (channels-last over
        # H or W, three strided groups): a contiguous copy of x, which any dim walks in place.
        return lambda x: _forward(x.contiguous(), dim, out_dtype, log)
    record = launch.build_record("forward", (x, template), view, log, out_dtype == torch.float64)
    return _Call(template, record).forward


def _validate_meta(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype], name: str) -> tuple[int, torch.dtype]:
    """``_validate`` for meta tensors, which no backend serves and which need no device record:
    torch infers their shape, dtype and layout, and so do we."""
    _check_served(x, name)
    rank = max(x.dim(), 1)
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"portable_softmax.{name}: dim must be an int, got {type(dim).__name__}")
    if not -rank <= dim < rank:
        raise DimensionError(f"portable_softmax.{name}: dim {dim} is out of range for a tensor of {x.dim()} "
                             f"dimension(s) (expected {-rank} to {rank - 1})")
    if dtype is None:
        _check_dtype("the input's dtype", x.dtype, name)
    out_dtype = x.dtype if dtype is None else dtype
    _check_dtype("dtype", out_dtype, name)
    return dim % rank, out_dtype


def _forward(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype], log: bool) -> torch.Tensor:
    """softmax (or log_softmax) of ``x`` over ``dim``; ``dtype`` as the public functions take it."""
    return _forward_lookup(x, dim, dtype, log)(x)


def _forward_lookup(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype], log: bool
                    ) -> Callable[[torch.Tensor], torch.Tensor]:
    """The call ``_forward`` makes for ``x``: found by its key, built where it is new."""
    device = x.device
    autocast = _autocast_available.get(device.type) and torch.is_autocast_enabled(device.type)
    if autocast is None:
        _autocast_available[device.type] = torch.amp.is_autocast_available(device.type)
        return _forward_lookup(x, dim, dtype, log)
    try:
        key = (x.shape, x.stride(), x.dtype, device, dim, dtype, log, x.data_ptr() % 16 == 0, autocast, _overrides())
    except RuntimeError:
        # Sparse, nested and MKL-DNN tensors have no strides or data pointer: one line for them.
        _check_served(x, "log_softmax" if log else "softmax")
        raise
    return _forward_calls.get(key) or _remember(_forward_calls, key, lambda: _forward_call(x, dim, dtype, log, autocast))


def _backward_call(y: torch.Tensor, dy: torch.Tensor, dim: int, grad_dtype: torch.dtype,
                   log: bool) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    if y.device.type == "meta":
        return lambda y, dy: _output(y, grad_dtype)
    if y.dim() == 0:
        return lambda y, dy: _backward(y.reshape(1), dy.reshape(1), 0, grad_dtype, log).reshape(())
    template = _output(y, grad_dtype)
    if y.numel() == 0:
        return lambda y, dy: _output(y, grad_dtype)
    view = row_view(tuple(y.shape), dim, y, dy, template)
    if view is None:
        return lambda y, dy: _backward(y.contiguous(), dy.contiguous(), dim, grad_dtype, log)
    acc_fp64 = torch.float64 in (y.dtype, dy.dtype, grad_dtype)
    record = launch.build_record("backward", (y, dy, template), view, log, acc_fp64)
    return _Call(template, record).backward


def _backward(y: torch.Tensor, dy: torch.Tensor, dim: int, grad_dtype: torch.dtype, log: bool,
              check: Optional[Callable[[torch.Tensor, torch.Tensor, int, torch.dtype], int]] = None) -> torch.Tensor:
    """The gradient with respect to the input from the output ``y`` and its gradient ``dy``;
    ``dim`` normalized (0 <= dim < rank), or with ``check`` (the custom operator's validation,
    which returns the normalized dim) checked and normalized where the call is new: a repeated
    call is one lookup and one launch. ``dy`` must have ``y``'s shape (the key holds ``y``'s)."""
    return _backward_lookup(y, dy, dim, grad_dtype, log, check)(y, dy)


def _backward_lookup(y: torch.Tensor, dy: torch.Tensor, dim: int, grad_dtype: torch.dtype, log: bool,
                     check: Optional[Callable[[torch.Tensor, torch.Tensor, int, torch.dtype], int]] = None
                     ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The call ``_backward`` makes for ``y`` and ``dy``: found by its key, built where it is new."""
    try:
        key = (y.shape, y.stride(), dy.stride(), y.dtype, dy.dtype, y.device, dim, grad_dtype, log,
               y.data_ptr() % 16 == 0, dy.data_ptr() % 16 == 0, _overrides())
    except RuntimeError:
        # Sparse, nested and MKL-DNN tensors have no strides or data pointer: the check's line.
        if check is not None:
            check(y, dy, dim, grad_dtype)
        raise
    return _backward_calls.get(key) or _remember(
        _backward_calls, key, lambda: _backward_call(y, dy, check(y, dy, dim, grad_dtype) if check else dim,
                                                     grad_dtype, log))


def _reference_backward(y: torch.Tensor, dy: torch.Tensor, dim: int, grad_dtype: torch.dtype, log: bool) -> torch.Tensor:
    """Backward in torch operations: differentiable again, for double backward."""
    if log:
        dx = dy - torch.exp(y) * dy.sum(dim, keepdim=True)
    else:
        dx = y * (dy - (dy * y).sum(dim, keepdim=True))
    # Contiguous as torch's (``_output``): the elementwise result takes a strided dy's layout.
    return dx.to(grad_dtype).contiguous()


class _Softmax(torch.autograd.Function):
    """softmax / log_softmax for autograd and forward-mode AD: the kernels forward and backward,
    torch operations for double backward and for the tangent (``jvp``).

    Written with ``forward(ctx, ...)``: a Function that defines ``setup_context`` has its
    arguments bound through ``inspect.signature`` on every call (tens of microseconds), so the
    ``torch.func`` form (``_TransformableSoftmax``) is used only where a transform needs it."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int, dtype: Optional[torch.dtype], log: bool) -> torch.Tensor:
        call = _forward_lookup(x, dim, dtype, log)
        y = call(x)
        _Softmax._save(ctx, x, dim, log, y, forward_ad._current_level >= 0, getattr(call, "__self__", None))
        return y

    @staticmethod
    def _save(ctx, x: torch.Tensor, dim: int, log: bool, y: torch.Tensor, tangents: bool,
              call: Optional[_Call] = None) -> None:
        """What the backward needs: y, the normalized dim, the function, the input's dtype, and
        the forward call whose output y is (None where y came another way), which keeps the
        backward call of y's usual gradient (``_Call.gradient``)."""
        ctx.save_for_backward(y)
        if tangents:
            ctx.save_for_forward(y)
        ctx.dim, ctx.log, ctx.grad_dtype, ctx.call = dim % max(x.dim(), 1), log, x.dtype, call

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        (y,) = ctx.saved_tensors
        if torch.is_grad_enabled():
            dx = _reference_backward(y, dy, ctx.dim, ctx.grad_dtype, ctx.log)
        elif ctx.call is not None:
            dx = ctx.call.gradient(y, dy, ctx.dim, ctx.grad_dtype, ctx.log)
        else:
            dx = _backward(y, dy, ctx.dim, ctx.grad_dtype, ctx.log)
        return dx, None, None, None

    @staticmethod
    def jvp(ctx, tangent: torch.Tensor, *_):
        """The tangent of the output: y * (t - sum(t * y)) for softmax, t - sum(softmax(x) * t)
        for log_softmax (t cast to the output's dtype first, as the input is)."""
        (y,) = ctx.saved_tensors
        t = tangent.to(y.dtype)
        if ctx.log:
            return t - (torch.exp(y) * t).sum(ctx.dim, keepdim=True)
        return y * (t - (t * y).sum(ctx.dim, keepdim=True))


class _TransformableSoftmax(torch.autograd.Function):
    """``_Softmax`` in the form ``torch.func`` transforms take (``setup_context``), with ``vmap``."""

    @staticmethod
    def forward(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype], log: bool) -> torch.Tensor:
        return _forward(x, dim, dtype, log)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, dim, _, log = inputs
        _Softmax._save(ctx, x, dim, log, output, True)

    backward = _Softmax.backward
    jvp = _Softmax.jvp

    @staticmethod
    def vmap(info, in_dims, x: torch.Tensor, dim: int, dtype: Optional[torch.dtype], log: bool):
        """Over a batch dimension: the same softmax over one more leading dimension."""
        batch = in_dims[0]
        if batch is None:
            return _TransformableSoftmax.apply(x, dim, dtype, log), None
        rank = max(x.dim() - 1, 1)
        if isinstance(dim, int) and not isinstance(dim, bool) and not -rank <= dim < rank:
            raise DimensionError(f"portable_softmax.{'log_softmax' if log else 'softmax'}: dim {dim} is out of "
                                 f"range for a tensor of {x.dim() - 1} dimension(s) (expected {-rank} to {rank - 1})")
        x = x.movedim(batch, 0)
        return _TransformableSoftmax.apply(x, dim if dim < 0 else dim + 1, dtype, log), 0




def _never_compiling() -> bool:
    return False


# ``torch.compiler.is_compiling`` where torch has it (2.3+).
_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or _never_compiling
# The custom operator call that ``torch_ops`` registers (torch 2.4+): under torch.compile a call
# goes to it, which dynamo puts in the graph as one node (with its fake and autograd
# registrations) instead of breaking the graph.
_custom_op_call: Optional[Callable[[torch.Tensor, int, torch.dtype, bool], torch.Tensor]] = None


def use_custom_op(call: Callable[[torch.Tensor, int, torch.dtype, bool], torch.Tensor]) -> None:
    """Route calls made while ``torch.compile`` traces to ``call(x, dim, out_dtype, log)``."""
    global _custom_op_call
    _custom_op_call = call


# The call that takes the fused variants (``fused`` registers it): scale, mask, causal.
_fused_call: Optional[Callable[..., torch.Tensor]] = None


def use_fused(call: Callable[..., torch.Tensor]) -> None:
    """Route calls with ``scale``, ``mask`` or ``causal`` to ``call(x, dim, dtype, log, scale, mask,
    causal)``."""
    global _fused_call
    _fused_call = call


# The call that takes DTensors (``distributed`` registers it): a DTensor sharded on the softmax
# dimension keeps its shards.
_dtensor_call: Optional[Callable[[torch.Tensor, int, Optional[torch.dtype], bool], torch.Tensor]] = None
# Where DTensor lives. A DTensor exists only once its module is loaded, so the routing looks the
# class up there and never imports it: importing torch.distributed.tensor takes longer than the
# rest of the package's import together.
_DTENSOR_MODULE = "torch.distributed.tensor"


def use_dtensor(call: Callable[[torch.Tensor, int, Optional[torch.dtype], bool], torch.Tensor]) -> None:
    """Route calls on DTensors to ``call(x, dim, dtype, log)``."""
    global _dtensor_call
    _dtensor_call = call


def _is_dtensor(x: Any) -> bool:
    kind = getattr(sys.modules.get(_DTENSOR_MODULE), "DTensor", None)
    return kind is not None and isinstance(x, kind)


def _apply(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype], log: bool, name: str) -> torch.Tensor:
    if type(x) is not torch.Tensor and _dtensor_call is not None and _is_dtensor(x):
        return _dtensor_call(x, dim, dtype, log)
    if _custom_op_call is not None and _compiling():
        dim, out_dtype = _validate(x, dim, dtype, name)
        return _custom_op_call(x, dim, out_dtype, log)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"portable_softmax.{name}: expected a torch.Tensor, got {type(x).__name__}")
    if torch._C._functorch.is_functorch_wrapped_tensor(x):  # vmap, grad, jvp, ...
        return _TransformableSoftmax.apply(x, dim, dtype, log)
    if (x.requires_grad and torch.is_grad_enabled()) or forward_ad._current_level >= 0:
        return _Softmax.apply(x, dim, dtype, log)
    return _forward(x, dim, dtype, log)


def _torch_form(x: Any, dim: Any, dtype: Any, f_dtype: Optional[torch.dtype], stacklevel: int,
                name: str) -> tuple[Any, Optional[torch.dtype]]:
    """``dim`` and ``dtype`` from the call forms torch takes besides ``(input, int dim, dtype)``:
    ``F.softmax(input, dim, _stacklevel, dtype)`` (an int third is its ``_stacklevel``; a
    torch.dtype third is ``torch.softmax``'s dtype, which F.softmax would silently ignore),
    ``dim=None`` (F.softmax's implicit dimension, with its warning) and an index-like ``dim``
    (a NumPy integer, a one-element integer tensor). Any other ``dim`` is refused.

    The warning is issued here, called by ``softmax`` / ``log_softmax`` directly: F.softmax's
    ``_stacklevel`` (3, the caller of the public function) then names the same frame."""
    if dtype.__class__ is int:
        stacklevel, dtype = dtype, f_dtype
    elif f_dtype is not None:
        raise TypeError(f"portable_softmax.{name}: a dtype in fourth place is F.{name}'s (input, dim, _stacklevel, "
                        f"dtype) form and needs an int _stacklevel third, got {dtype!r}; pass dtype= instead")
    if dim is None and isinstance(x, torch.Tensor):
        warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the call to include dim=X "
                      "as an argument.", stacklevel=stacklevel)
        dim = 0 if x.dim() in (0, 1, 3) else 1
    elif isinstance(dim, str):
        raise TypeError(f"portable_softmax.{name}: dim must be an int, got the name {dim!r} (named dimensions are "
                        "not supported: pass its index)")
    elif not isinstance(dim, bool) and hasattr(type(dim), "__index__"):
        dim = operator.index(dim)
    elif dim is not None:
        # Refused here, not left to the call's key: True and 1.0 hash as 1 and would find its record.
        raise TypeError(f"portable_softmax.{name}: dim must be an int, got {type(dim).__name__}")
    return dim, dtype


def softmax(input: torch.Tensor, dim: Optional[int] = -1, dtype: Optional[torch.dtype] = None,
            _dtype: Optional[torch.dtype] = None, *, _stacklevel: int = 3, scale: Any = None,
            mask: Optional[torch.Tensor] = None, causal: bool = False) -> torch.Tensor:
    """Softmax of ``input`` along ``dim``, as ``torch.softmax`` computes it.

    Takes the call forms of ``torch.softmax(input, dim, dtype)`` and of
    ``torch.nn.functional.softmax(input, dim=None, _stacklevel=3, dtype=None)``: an int in third
    place is F.softmax's ``_stacklevel`` (``dtype`` then fourth), ``dim=None`` is F.softmax's
    implicit dimension (with its deprecation warning). ``scale``, ``mask`` and ``causal`` are
    keyword-only.

    Args:
        input: a float16, bfloat16, float32 or float64 tensor of any rank and strides, on any
            device a backend serves (CPU tensors run through Triton's interpreter), or a meta
            tensor.
        dim: the dimension to normalise over; negative counts from the end.
        dtype: if given, ``input`` is cast to it first and the result has this dtype (as in torch).
        _dtype: F.softmax's ``dtype`` where its ``_stacklevel`` is passed third.
        _stacklevel: as F.softmax's: the frame the ``dim=None`` warning names.
        scale: a number, or a floating tensor that broadcasts to ``input`` with size 1 along
            ``dim`` (a per-row temperature is ``1 / T``): ``input`` is multiplied by it first.
        mask: a tensor that broadcasts to ``input``: bool keeps the elements where it is True (as
            ``scaled_dot_product_attention``); floating is added after the scaling (-inf allowed)
            and takes its gradient where it requires one. Masked positions take no gradient; a row
            a bool mask leaves empty gives 0.
        causal: mask element (i, j) of the last two dimensions where j > i (``is_causal``,
            top-left aligned); only with ``dim=-1``.

    Returns:
        A tensor of ``input``'s shape; differentiable with respect to ``input`` (autograd,
        forward-mode AD and ``torch.func`` transforms).

    Raises:
        TypeError: ``input`` is not a floating tensor, its dtype is unsupported on its device, or
            ``dim`` is not an integer.
        IndexError: ``dim`` is out of range (a :class:`DimensionError`, also a ValueError).
        RuntimeError: no backend serves ``input``'s device.
    """
    if dim.__class__ is not int or dtype.__class__ is int or _dtype is not None:
        dim, dtype = _torch_form(input, dim, dtype, _dtype, _stacklevel, "softmax")
    if scale is not None or mask is not None or causal:
        return _fused_call(input, dim, dtype, False, scale, mask, causal)
    return _apply(input, dim, dtype, False, "softmax")


def log_softmax(input: torch.Tensor, dim: Optional[int] = -1, dtype: Optional[torch.dtype] = None,
                _dtype: Optional[torch.dtype] = None, *, _stacklevel: int = 3, scale: Any = None,
                mask: Optional[torch.Tensor] = None, causal: bool = False) -> torch.Tensor:
    """Log-softmax of ``input`` along ``dim``, as ``torch.log_softmax`` computes it; a row a bool
    mask leaves empty gives -inf. The call forms of ``torch.log_softmax`` and
    ``torch.nn.functional.log_softmax``, as :func:`softmax` takes softmax's.

    Args, Returns and Raises as :func:`softmax`.
    """
    if dim.__class__ is not int or dtype.__class__ is int or _dtype is not None:
        dim, dtype = _torch_form(input, dim, dtype, _dtype, _stacklevel, "log_softmax")
    if scale is not None or mask is not None or causal:
        return _fused_call(input, dim, dtype, True, scale, mask, causal)
    return _apply(input, dim, dtype, True, "log_softmax")


__all__ = ["softmax", "log_softmax", "DimensionError"]
