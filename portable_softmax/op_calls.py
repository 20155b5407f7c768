"""The public operations' call records, their hot path: a call is keyed on everything its launch
depends on (shape, strides, dtypes, device, dim, the 16-byte alignment of its data, autocast, the
environment overrides) and finds a ``_Call`` built the first time: the output's size and strides
and the launch record (``launch.LaunchRecord``). Later calls allocate the output and launch; they
validate, plan and query nothing. ``_forward`` and ``_backward`` are the kernels' entry points for
the rest of the package.
"""
from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from typing import Optional, Union

import torch

from portable_softmax import launch, op_arguments
from portable_softmax.backend import BACKEND_ENV, on_registry_change
from portable_softmax.launch import PROGRAMS_ENV, RowView
from portable_softmax.launch_compile import compile_ahead
from portable_softmax.row_layout import _output, row_view
from portable_softmax.tuning import TUNING


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
# Whether autocast is on for any device type, one call into torch: a call outside autocast (the
# usual one) asks no more (``_autocast_on``: a device's type and its state cost 0.6 us a call).
_any_autocast: Callable[[], bool] = getattr(torch._C, "_is_any_autocast_enabled", None) or (lambda: True)


def _autocast_on(device_type: str) -> bool:
    """Whether autocast is enabled for ``device_type`` (False where torch has none for it)."""
    available = _autocast_available.get(device_type)
    if available is None:
        available = _autocast_available[device_type] = torch.amp.is_autocast_available(device_type)
    return available and torch.is_autocast_enabled(device_type)


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
                  autocast: bool, backward: bool = False) -> Callable[[torch.Tensor], torch.Tensor]:
    name = "log_softmax" if log else "softmax"
    if x.device.type == "meta":
        _, out_dtype = op_arguments._validate_meta(x, dim, dtype, name)
        return lambda x: _output(x, out_dtype)
    dim, out_dtype = op_arguments._validate(x, dim, dtype, name)
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
    if backward:
        _backward_ahead(template, dim, x.dtype, log)
    record = launch.build_record("forward", (x, template), view, log, out_dtype == torch.float64)
    return _Call(template, record).forward


def _backward_ahead(y: torch.Tensor, dim: int, grad_dtype: torch.dtype, log: bool) -> None:
    """Start compiling, beside the forward's compile (``launch_compile.compile_ahead``), the
    backward of the output ``y`` (laid out as a forward call's) for the gradient autograd usually
    brings: laid out as y and of its dtype (``_Call.gradient``), into a dx that ``_backward_call``
    lays out as y. The backward's own build asks for the same binary and waits for it."""
    view = row_view(tuple(y.shape), dim, y, y, y)
    if view is None:
        return
    # Empty tensors stand for y, dy and dx: their dtypes, and aligned (a null pointer, as the
    # fresh buffers they stand for are): nothing held or allocated for the thread.
    y_like, dx_like = y.new_empty(0), y.new_empty(0, dtype=grad_dtype)
    compile_ahead(y.device, lambda: _backward_record(y_like, y_like, dx_like, view, log))


def _backward_record(y: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, view: RowView,
                     log: bool) -> Union[launch.LaunchRecord, launch.SlicedRecord]:
    """The launch record of the backward into ``dx`` from ``y`` and ``dy`` over ``view``."""
    return launch.build_record("backward", (y, dy, dx), view, log, torch.float64 in (y.dtype, dy.dtype, dx.dtype))


def _forward(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype], log: bool) -> torch.Tensor:
    """softmax (or log_softmax) of ``x`` over ``dim``; ``dtype`` as the public functions take it."""
    return _forward_lookup(x, dim, dtype, log)(x)


def _forward_lookup(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype], log: bool, backward: bool = False
                    ) -> Callable[[torch.Tensor], torch.Tensor]:
    """The call ``_forward`` makes for ``x``: found by its key, built where it is new; with
    ``backward`` (the input requires grad), the backward's compile started beside it."""
    autocast = _any_autocast() and _autocast_on(x.device.type)
    try:
        key = (x.shape, x.stride(), x.dtype, x.device, dim, dtype, log, x.data_ptr() % 16 == 0, autocast, _overrides())
    except RuntimeError:
        # Sparse, nested and MKL-DNN tensors have no strides or data pointer: one line for them.
        op_arguments._check_served(x, "log_softmax" if log else "softmax")
        raise
    return _forward_calls.get(key) or _remember(_forward_calls, key,
                                                lambda: _forward_call(x, dim, dtype, log, autocast, backward))


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
    return _Call(template, _backward_record(y, dy, template, view, log)).backward


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
