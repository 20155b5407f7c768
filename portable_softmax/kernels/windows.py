"""Aligned windows of split rows (and of the loss's streamed rows: ``loss.py``). Split rows whose
starts are not 16-byte aligned (bf16 rows of 50257) would be read one element per instruction. The
split kernels then take ``ALIGN`` > 1 (the elements in 16 bytes): a row is read through a *window*
that starts at the aligned element at or before it. Each chunk moves the window's whole
ALIGN-element groups that lie inside the row as vectors, with no per-element mask; the at most
2 * (ALIGN - 1) elements that share a group with a neighbouring row travel in a small separate
block that joins a chunk's partial and is stored alone: in the softmax's split kernels each chunk
takes those in its own columns (``_edge_columns``), in the loss's the chunk that holds the row's
last element takes them all (``_row_edges``), as a streamed row does."""
from .jit import _jit, _language, tl  # noqa: F401 (_language: see jit.py)
from .common import _cast, _row_starts, _store


@_jit
def _split_window(outer, rows, row_mask, cols, n_cols, outer_stride, row_stride, ALIGN: tl.constexpr):
    """For the tensor whose strides are given (its rows fix the offsets of every tensor's): where
    each row's window starts, the row's first column in it (int32), and ``_chunk_mask``."""
    row = _row_starts(outer, rows, outer_stride, row_stride, False)
    base = _window_start(row, ALIGN)
    lead = (row - base).to(tl.int32)
    return base, lead, _chunk_mask(cols, lead, n_cols, row_mask, ALIGN)


@_jit
def _window_start(base, ALIGN: tl.constexpr):
    """The element offset at or before each row start ``base`` that is a multiple of ``ALIGN``."""
    if ALIGN > 1:
        base = base // ALIGN * ALIGN
    return base


@_jit
def _chunk_mask(cols, lead, n_cols, row_mask, ALIGN: tl.constexpr):
    """Which columns of a chunk ([1, BLOCK_N]) to load and store as the block. With windows
    (``lead``: the row's first column in its window, int32 so that compares take one
    instruction) only whole ALIGN-column groups inside the row: the mask is constant over each
    group, so the accesses stay vectors, and needs no per-element test."""
    # A missing row ends its columns at 0 (no column is below it): one compare a vector. From
    # ``row_mask & (cols < n_cols)`` LLVM kept the split loss's per-element masks across the
    # exchange's call as one <64 x i1> value, packed into an integer and unpacked again (sm_90:
    # about 80 instructions an item, NOTES v35).
    if ALIGN > 1:
        first = lead[:, None]
        mask = ((cols >= (first + ALIGN - 1) // ALIGN * ALIGN)
                & (cols < tl.where(row_mask[:, None], (first + n_cols) // ALIGN * ALIGN, 0)))
    else:
        mask = cols < tl.where(row_mask, n_cols, 0)[:, None]
    return mask


@_jit
def _output_window(row, lead, ALIGN: tl.constexpr, SHIFTED: tl.constexpr):
    """Where the output's window of a row starts (``row``: the row's first element): its own
    aligned window, or with ``SHIFTED`` (its rows lie at another offset from 16-byte boundaries
    than the inputs') ``lead`` columns before the row, so that the inputs' window columns
    address it; its stores are then unaligned, one element each, and the loads stay vectors."""
    if SHIFTED:
        base = row - lead
    else:
        base = _window_start(row, ALIGN)
    return base


@_jit
def _window_store(ptr, base, cols, col_stride, mask, value, lead, n_cols, row_mask, first_col,
                  BLOCK_N: tl.constexpr, ALIGN: tl.constexpr, SHIFTED: tl.constexpr):
    """``_store`` of a window chunk (columns [first_col, first_col + BLOCK_N); one row: windows
    take one at a time). A shifted output is stored one element an instruction, and under a mask
    each of those needs its own predicate, made and unpacked per element: rows of 50257 bf16
    sliced from 50304 ran 1422 instructions a chunk in the sm_90 loop against 831 aligned, and
    the forward was issue-bound. So chunks wholly inside their row's aligned groups (a long
    row's every chunk but its ends) store with no mask: 924 instructions."""
    if SHIFTED:
        first = tl.sum(lead, 0)
        inner = (first + ALIGN - 1) // ALIGN * ALIGN
        tail = (first + n_cols) // ALIGN * ALIGN
        exists = tl.sum(row_mask.to(tl.int32), 0) > 0
        if exists & (first_col >= inner) & (first_col + BLOCK_N <= tail):
            tl.store(ptr + base[:, None] + cols * col_stride, _cast(value, ptr.dtype.element_ty))
        else:
            # ``mask`` made again here from the chunk's own columns, a form that common-subexpression
            # elimination keeps apart: else its per-element copy in the store's layout is made
            # before the branch, for every chunk.
            column = tl.arange(0, BLOCK_N)[None, :]
            inside = (column >= inner - first_col) & (column < tl.where(exists, tail - first_col, 0))
            _store(ptr, base, cols, col_stride, inside, value)
    else:
        _store(ptr, base, cols, col_stride, mask, value)


@_jit
def _edge_columns(lead, n_cols, row_mask, first_col, BLOCK_N: tl.constexpr, ALIGN: tl.constexpr):
    """The window columns ([2 * ALIGN]) of the row's elements in its first and last group that
    ``_chunk_mask`` leaves out, and their mask, restricted to the chunk's own columns
    [first_col, first_col + BLOCK_N). One row per item (BLOCK_M = 1): the row's values are
    scalars here, so the block keeps Triton's one-element-per-thread layout."""
    lead = tl.sum(lead, 0)
    exists = tl.sum(row_mask.to(tl.int32), 0) > 0
    end = lead + n_cols
    inner = (lead + ALIGN - 1) // ALIGN * ALIGN
    tail = end // ALIGN * ALIGN
    j = tl.arange(0, 2 * ALIGN)
    # Descending columns, so that Triton sees no contiguity and gives no thread a vector of them.
    cols = tl.where(j < ALIGN, ALIGN - 1 - j, tail + 2 * ALIGN - 1 - j)
    # A row inside one group has no separate last group.
    distinct = (j < ALIGN) | (tail >= ALIGN)
    mask = exists & (cols >= lead) & (cols < end) & ((cols < inner) | (cols >= tail)) & distinct
    return cols, mask & (cols >= first_col) & (cols < first_col + BLOCK_N)


@_jit
def _row_edges(lead, n_cols, row_mask, ALIGN: tl.constexpr):
    """``_edge_columns`` of the whole row, whatever chunk holds them (a streamed row folds its edges
    in once). Written apart, not called by ``_edge_columns``: the split kernels' binaries then
    stay as they were (called from there, one capped sm_90 loss variant spilled 72 words, not 76)."""
    lead = tl.sum(lead, 0)
    exists = tl.sum(row_mask.to(tl.int32), 0) > 0
    end = lead + n_cols
    inner = (lead + ALIGN - 1) // ALIGN * ALIGN
    tail = end // ALIGN * ALIGN
    j = tl.arange(0, 2 * ALIGN)
    cols = tl.where(j < ALIGN, ALIGN - 1 - j, tail + 2 * ALIGN - 1 - j)
    distinct = (j < ALIGN) | (tail >= ALIGN)
    return cols, exists & (cols >= lead) & (cols < end) & ((cols < inner) | (cols >= tail)) & distinct


@_jit
def _edge_load(ptr, base, cols, mask, OTHER: tl.constexpr, CAST_TY: tl.constexpr):
    """``_load`` of ``_edge_columns`` from the window at ``base`` ([1])."""
    return _cast(tl.load(ptr + tl.sum(base, 0) + cols, mask=mask, other=OTHER), CAST_TY).to(tl.float32)


@_jit
def _edge_store(ptr, base, cols, mask, value):
    tl.store(ptr + tl.sum(base, 0) + cols, _cast(value, ptr.dtype.element_ty), mask=mask)
