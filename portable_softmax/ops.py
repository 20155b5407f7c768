"""The public operations: drop-in ``softmax`` and ``log_softmax``, and where a call goes: to the
DTensor, fused or custom-operator call another module registers (``use_dtensor``, ``use_fused``,
``use_custom_op``), to the autograd functions (``op_autograd``) where a gradient is wanted, else
straight to the kernels through the call records (``op_calls``). Arguments are checked in
``op_arguments``; ``row_layout`` maps any dim of any strided tensor onto the kernels' row view.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Optional

import torch
import torch.autograd.forward_ad as forward_ad

from portable_softmax.op_arguments import _torch_form, _validate
from portable_softmax.op_autograd import _Softmax, _TransformableSoftmax
from portable_softmax.op_calls import _forward


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
        if torch._C._are_functorch_transforms_active():
            # A tensor from outside a transform, differentiated inside it: the form transforms take.
            return _TransformableSoftmax.apply(x, dim, dtype, log)
        return _Softmax.apply(x, dim, dtype, log)
    return _forward(x, dim, dtype, log)


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


__all__ = ["softmax", "log_softmax"]
