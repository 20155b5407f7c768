"""The public operations' arguments: the checks that raise what a user can act on (``_validate``,
``_validate_meta`` for meta tensors, ``_check_served`` for the tensors the kernels do not read),
and the call forms torch's softmax functions take besides ``(input, int dim, dtype)``
(``_torch_form``).
"""
from __future__ import annotations

import operator
import warnings
from typing import Any, Optional

import torch

from portable_softmax.device import device_record

FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


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
