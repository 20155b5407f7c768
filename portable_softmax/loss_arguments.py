"""``cross_entropy``'s arguments: their validation (one error naming the argument at fault) into
the ``Options`` the launches are keyed on, and the shapes and dtype a call's per-position values
take."""
from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real
from typing import NamedTuple, Optional

import torch

from portable_softmax import op_arguments

REDUCTIONS = ("none", "mean", "sum")
_NAME = "portable_softmax.cross_entropy"


class Options(NamedTuple):
    """A validated call's options (hashable: part of launch signatures). A named tuple, not a
    dataclass: every call hashes and compares it (``_launch``'s key), which a tuple does in C."""

    n_classes: int
    prob_target: bool
    reduction: str
    ignore_index: int
    smoothing: float
    z_loss: float
    softcap: Optional[float]
    weighted: bool


def _positions(shape: Sequence[int]) -> tuple[int, ...]:
    """The shape of one value per position: the input's without its class dim (dim 1; a 1-D
    input's class dim is 0, with one position)."""
    shape = tuple(shape)
    return () if len(shape) == 1 else (shape[0], *shape[2:])


def validate(input: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], ignore_index: int,
             reduction: str, label_smoothing: float, z_loss: float, softcap: Optional[float]) -> Options:
    """The options of a call, or one error naming the argument at fault."""
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"{_NAME}: input must be a tensor, got {type(input).__name__}")
    if input.dtype not in op_arguments.FLOATING:
        raise TypeError(f"{_NAME}: input must be float16, bfloat16, float32 or float64, got {input.dtype}")
    if input.dim() == 0:
        raise ValueError(f"{_NAME}: input must have a class dimension (shape (C,), (N, C) or (N, C, d1, ...)), "
                         f"got a 0-d tensor")
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"{_NAME}: target must be a tensor, got {type(target).__name__}")
    n_classes = input.shape[0 if input.dim() == 1 else 1]
    prob = target.is_floating_point()
    if prob:
        if target.shape != input.shape:
            raise ValueError(f"{_NAME}: target of class probabilities must have input's shape {tuple(input.shape)}, "
                             f"got {tuple(target.shape)}")
        if ignore_index >= 0:
            raise ValueError(f"{_NAME}: ignore_index ({ignore_index}) is not supported with class probabilities")
    elif target.dtype == torch.bool or target.is_complex():
        raise TypeError(f"{_NAME}: target must hold class indices (an integer dtype) or class probabilities "
                        f"(floating), got {target.dtype}")
    elif target.shape != _positions(input.shape):
        raise ValueError(f"{_NAME}: target of class indices must have shape {_positions(input.shape)} for input of "
                         f"shape {tuple(input.shape)}, got {tuple(target.shape)}")
    if target.device != input.device:
        raise ValueError(f"{_NAME}: target is on {target.device}, input on {input.device}; move it to input's device")
    if weight is not None:
        if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
            raise TypeError(f"{_NAME}: weight must be a floating tensor of one value per class, got "
                            f"{getattr(weight, 'dtype', type(weight).__name__)}")
        if weight.shape != (n_classes,):
            raise ValueError(f"{_NAME}: weight must have shape ({n_classes},) (one value per class), got "
                             f"{tuple(weight.shape)}")
        if weight.device != input.device:
            raise ValueError(f"{_NAME}: weight is on {weight.device}, input on {input.device}; move it to input's "
                             f"device")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"{_NAME}: ignore_index must be an int, got {type(ignore_index).__name__}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"{_NAME}: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if not _real(label_smoothing) or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{_NAME}: label_smoothing must be a number in [0, 1], got {label_smoothing!r}")
    if not _real(z_loss) or not math.isfinite(z_loss):
        raise ValueError(f"{_NAME}: z_loss must be a finite number, got {z_loss!r}")
    if softcap is not None and (not _real(softcap) or not 0.0 < softcap < math.inf):
        raise ValueError(f"{_NAME}: softcap must be a positive number or None, got {softcap!r}")
    return Options(n_classes, prob, reduction, ignore_index, float(label_smoothing), float(z_loss),
                   None if softcap is None else float(softcap), weight is not None)


def _real(value: object) -> bool:
    # A float first: the usual value, which skips the abstract class's check.
    return type(value) is float or (isinstance(value, Real) and not isinstance(value, bool))


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32
