"""The kernel variants, declared once: which kernel of ``kernels.py`` a configuration runs, the
order and meaning of its arguments, and its constexprs. The launch (``launch.py``), the compile
report (``crosscompile.py``) and the Ascend lowering (``ci/ascend_lowering.py``) all read this
table, so that a new constexpr or argument is written here and nowhere else.

Plain data and arithmetic: no torch, no Triton (the Ascend lowering loads this file into a venv
that has neither torch nor upstream Triton).

A kernel's parameters are, in order: its tensors (``TENSORS``), the split path's scratch
(``SCRATCH``, split kernels only), the counts (``COUNTS``), each tensor's (outer, row, column)
strides in elements, then the constexprs (``constexprs``).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

DIRECTIONS = ("forward", "backward")
REGIMES = ("tile", "split", "loop")

# The tensors of each direction, in argument order: the inputs, then the output.
TENSORS = {"forward": ("x", "y"), "backward": ("y", "dy", "dx")}
# The split path's exchange slots (int64, empty = -1) and arrival counters (int32).
SCRATCH = (("slot", "i64"), ("done", "i32"))
# First count: work items (tiles, or for split kernels tiles x chunks); then tiles per group,
# rows per group and the row length.
COUNTS = ("items", "tiles_per_outer", "rows_per_outer", "n_cols")


class Config(Protocol):
    """What a variant is specialised on (``planner.KernelConfig``)."""

    regime: str
    block_m: int
    block_n: int
    chunks: int
    num_stages: int
    align: int
    ticketed: bool
    reread: bool
    per_tile: bool
    dense: bool

    @property
    def chunks_p2(self) -> int: ...


@dataclass(frozen=True)
class CallFacts:
    """What a call adds to a configuration: the function, and what the device or tuning picks."""

    log: bool
    # float64 accumulation (a float64 tensor in the call).
    acc_fp64: bool = False
    # The split wait's read (``Tuning.split_wait_atomic``).
    wait_atomic: bool = True
    # The output's rows lie at another offset from 16-byte boundaries than the inputs' (rows
    # sliced from a padded vocabulary, written contiguous): windows follow the inputs
    # (``planner.window_align``) and the output is written unaligned at their columns.
    shifted: bool = False


def kernel_name(direction: str, regime: str) -> str:
    if direction not in DIRECTIONS or regime not in REGIMES:
        raise ValueError(f"no kernel for {direction!r} {regime!r}")
    return f"softmax_{direction}_{regime}"


def constexprs(config: Config, facts: CallFacts) -> dict[str, Any]:
    """The constexprs of ``config``'s kernel, by name."""
    values: dict[str, Any] = {"BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "LOG": facts.log}
    if config.regime == "split":
        values.update(CHUNKS=config.chunks, CHUNKS_P2=config.chunks_p2, ALIGN=config.align,
                      TICKETED=config.ticketed, STAGES=config.num_stages, WAIT_ATOMIC=facts.wait_atomic,
                      SHIFTED=facts.shifted and config.align > 1)
    else:
        values["ACC_FP64"] = facts.acc_fp64
        if config.regime == "tile":
            values.update(REREAD=config.reread, PER_TILE=config.per_tile, DENSE=config.dense)
    return values


def tiles(config: Config, n_outer: int, rows_per_outer: int) -> tuple[int, int]:
    """Tiles per group and in all: a tile is ``block_m`` rows of one group."""
    per_outer = -(-rows_per_outer // config.block_m)
    return per_outer, n_outer * per_outer


def scalar_arguments(config: Config, n_outer: int, rows_per_outer: int, n_cols: int,
                     strides: Sequence[tuple[int, int, int]]) -> tuple[int, ...]:
    """The integer arguments after the tensors and scratch, in order (``COUNTS``, then strides)."""
    per_outer, total = tiles(config, n_outer, rows_per_outer)
    items = total * config.chunks if config.regime == "split" else total
    return (items, per_outer, rows_per_outer, n_cols, *(s for triple in strides for s in triple))


def parameter_names(direction: str, regime: str) -> tuple[str, ...]:
    """The names of a kernel's non-constexpr parameters, in order, as ``kernels.py`` spells them."""
    names = [f"{t}_ptr" for t in TENSORS[direction]]
    if regime == "split":
        names += [f"{name}_ptr" for name, _ in SCRATCH]
    names += ["n_items" if regime == "split" else "n_tiles", *COUNTS[1:]]
    names += [f"{t}_{axis}_stride" for t in TENSORS[direction] for axis in ("outer", "row", "col")]
    return tuple(names)


def options(config: Config, num_warps: int, cooperative: bool) -> dict[str, Any]:
    """Compile and launch options: warps, pipeline depth, and for a persistent split grid (its
    programs wait on each other) a cooperative launch where the stack offers one, so that the
    driver refuses a grid that is not resident at once instead of letting it hang."""
    values: dict[str, Any] = {"num_warps": num_warps, "num_stages": config.num_stages}
    if config.regime == "split" and not config.ticketed and cooperative:
        values["launch_cooperative_grid"] = True
    return values
