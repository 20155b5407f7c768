"""How a call's tensors are laid out for the kernels: any dim of any strided tensor mapped onto the
kernels' row view, without a copy where two strides walk its rows in every tensor (``row_view``),
and the output laid out as torch lays its own out (``_output``).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from portable_softmax.launch import RowView

# Column offsets times a column stride other than 1 are computed in 32 bits inside the kernels.
_MAX_COLUMN_SPAN = 2**31


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
        # that long streams through the loop regime, whose offsets are 64-bit (split_planner._can_split).
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
