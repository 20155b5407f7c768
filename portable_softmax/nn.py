"""Modules over the package's functions, as ``torch.nn``'s over torch's: ``CrossEntropyLoss``
(torch's arguments, plus the extras of ``cross_entropy``), ``Softmax`` and ``LogSoftmax``."""
from __future__ import annotations

import warnings
from typing import Optional, Union

import torch
from torch.nn.modules.loss import _WeightedLoss

from portable_softmax import loss, ops


class CrossEntropyLoss(_WeightedLoss):
    """``torch.nn.CrossEntropyLoss`` through :func:`portable_softmax.cross_entropy`.

    Args:
        weight, size_average, ignore_index, reduce, reduction, label_smoothing: as torch's
            (``size_average`` and ``reduce`` deprecated there too).
        z_loss, softcap, return_lse, inplace_backward: as :func:`portable_softmax.cross_entropy`.
    """

    __constants__ = ["ignore_index", "reduction", "label_smoothing", "z_loss", "softcap", "return_lse",
                     "inplace_backward"]

    def __init__(self, weight: Optional[torch.Tensor] = None, size_average: Optional[bool] = None,
                 ignore_index: int = -100, reduce: Optional[bool] = None, reduction: str = "mean",
                 label_smoothing: float = 0.0, *, z_loss: float = 0.0, softcap: Optional[float] = None,
                 return_lse: bool = False, inplace_backward: bool = False) -> None:
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing
        self.z_loss = z_loss
        self.softcap = softcap
        self.return_lse = return_lse
        self.inplace_backward = inplace_backward

    def forward(self, input: torch.Tensor, target: torch.Tensor
                ) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        return loss.cross_entropy(input, target, self.weight, ignore_index=self.ignore_index,
                                  reduction=self.reduction, label_smoothing=self.label_smoothing, z_loss=self.z_loss,
                                  softcap=self.softcap, return_lse=self.return_lse,
                                  inplace_backward=self.inplace_backward)


def _implicit_dim(name: str, rank: int) -> int:
    """torch's legacy choice of dim for ``dim=None`` (``torch.nn.functional._get_softmax_dim``)."""
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the call to include dim=X "
                  f"as an argument.", stacklevel=3)
    return 0 if rank in (0, 1, 3) else 1


class Softmax(torch.nn.Module):
    """``torch.nn.Softmax`` through :func:`portable_softmax.softmax`."""

    __constants__ = ["dim"]

    def __init__(self, dim: Optional[int] = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        dim = self.dim if self.dim is not None else _implicit_dim("softmax", input.dim())
        return ops.softmax(input, dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(torch.nn.Module):
    """``torch.nn.LogSoftmax`` through :func:`portable_softmax.log_softmax`."""

    __constants__ = ["dim"]

    def __init__(self, dim: Optional[int] = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        dim = self.dim if self.dim is not None else _implicit_dim("log_softmax", input.dim())
        return ops.log_softmax(input, dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


__all__ = ["CrossEntropyLoss", "LogSoftmax", "Softmax"]
