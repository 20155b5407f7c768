"""The kernel variants, declared once: which kernel of ``kernels`` a configuration runs, the
order and meaning of its arguments, and its constexprs. The launch (``launch.py``), the compile
report (``crosscompile``) and the Ascend lowering (``ci/ascend_lowering.py``) all read this
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
from typing import Any, Optional, Protocol

DIRECTIONS = ("forward", "backward")
REGIMES = ("tile", "split", "loop")

# The tensors of each direction, in argument order: the inputs, then the output.
TENSORS = {"forward": ("x", "y"), "backward": ("y", "dy", "dx")}
# The fused variants (scale, masks, causal: ``kernels.fused._fused_terms``), in the regimes that take
# them (every one): their tensors after the others (the mask in its own dtype, the scale tensor; the input
# stands in where absent), and their scalars after the strides: a number scale, the input's
# leading dimensions as (A, n_heads, n_queries), the mask's (A, heads, queries, keys) strides and
# the scale's (A, heads, queries) strides (0 where they broadcast).
FUSED_REGIMES = REGIMES
FUSED_TENSORS = ("mask", "scale")
FUSED_SCALARS = ("scale_value", "n_heads", "n_queries", "mask_a_stride", "mask_b_stride", "mask_q_stride",
                 "mask_k_stride", "scale_a_stride", "scale_b_stride", "scale_q_stride")
FLOAT_SCALARS = ("scale_value",)
NO_FUSION = (1.0, 1, 1, 0, 0, 0, 0, 0, 0, 0)
# The split path's exchange slots (int64, empty = -1; a row's CHUNKS_P2 apart) and arrival counters
# (int32).
SCRATCH = (("slot", "i64"), ("done", "i32"))
# The counters after the per-tile ones of a split grid of one-row tiles, for a loss forward that
# counts its 'mean''s targets itself (``loss_counts``, ``kernels/grid_count.py``): one word of its
# arrivals and its count (the count in the low GRID_COUNT_BITS), and the departures; for one that
# sums its loss itself (``loss_sums``, ``kernels/grid_sum.py``), the finish counter; then a
# program's partial each (``launch.LaunchRecord``).
GRID_COUNTERS = 3
GRID_COUNT_BITS = 19
# The split kernels' PHASE (``kernels.exchange.EXCHANGE_*``, the same numbers): one launch whose
# programs wait on their row's peers (a resident grid); or, where programs cannot wait on each
# other (``Config.phased``: Triton's interpreter runs them one after another), two launches of
# the same kernel, the first publishing every chunk's partials, the second reading them all and
# writing every chunk; or (``Config.arrival``: the loss's forward that writes no gradient) one
# launch in which no program waits: each chunk publishes and counts its arrival, and the row's
# last to arrive reads them all and writes the row's own terms.
EXCHANGE_WAIT, EXCHANGE_PUBLISH, EXCHANGE_READ, EXCHANGE_ARRIVE = 0, 1, 2, 3
# First count: work items (tiles, or for split kernels tiles x chunks); then tiles per group,
# rows per group and the row length.
COUNTS = ("items", "tiles_per_outer", "rows_per_outer", "n_cols")


class Config(Protocol):
    """What a variant is specialised on (``plan_grid.KernelConfig``)."""

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
    phased: bool
    arrival: bool
    flat: bool
    whole: bool

    @property
    def chunks_p2(self) -> int: ...

    @property
    def whole_loop(self) -> bool: ...


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
    # The fused variants: SCALE (0 none, 1 a number, 2 a tensor), MASK (0 none, 1 bool, 2
    # additive), CAUSAL.
    scale: int = 0
    mask: int = 0
    causal: bool = False


def kernel_name(direction: str, regime: str) -> str:
    if direction not in DIRECTIONS or regime not in REGIMES:
        raise ValueError(f"no kernel for {direction!r} {regime!r}")
    return f"softmax_{direction}_{regime}"


def constexprs(config: Config, facts: CallFacts, phase: Optional[int] = None) -> dict[str, Any]:
    """The constexprs of ``config``'s kernel, by name.

    Args:
        config: the configuration.
        facts: what the call adds.
        phase: for a split config, the launch's PHASE, one of ``launch_phases(config)``; None:
            the first of them.

    Raises:
        ValueError: ``phase`` is not one of the config's launches.
    """
    values: dict[str, Any] = {"BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "LOG": facts.log}
    if config.regime == "split":
        values.update(split_constexprs(config, facts.wait_atomic, facts.shifted, phase))
    else:
        values["ACC_FP64"] = facts.acc_fp64
        if config.regime == "tile":
            values.update(REREAD=config.reread, PER_TILE=config.per_tile, DENSE=dense_level(config))
            if config.align > 1:
                # Named only where windows are taken: the kernel's defaults (1, False) leave the
                # other tiles' compiled variants, and their ``kernel_resources`` keys, as they were.
                values.update(ALIGN=config.align, SHIFTED=facts.shifted)
    if config.regime in FUSED_REGIMES:
        values.update(SCALE=facts.scale, MASK=facts.mask, CAUSAL=facts.causal)
    return values


# The tile kernels' DENSE beyond False and True (``kernels.common``): one group and int32 offsets,
# its masks kept. A value of its own, so that the keys of the other two forms' compiled variants
# (``kernel_resources``: "DENSE=0", "DENSE=1") stay as they were.
FLAT = 2


def dense_level(config: Config) -> Any:
    """The tile kernels' ``DENSE``: ``config.dense`` (False or True), or ``FLAT``."""
    return FLAT if config.flat and not config.dense else config.dense


def split_constexprs(config: Config, wait_atomic: bool, shifted: bool, phase: Optional[int] = None) -> dict[str, Any]:
    """The constexprs every split kernel takes (the softmax's and the loss's): its chunks, windows,
    grid form, pipeline, the wait's read (``wait_atomic``), whether the output is written at the
    inputs' windows (``shifted``), and the launch's ``phase`` (None: the first of
    ``launch_phases``).

    Raises:
        ValueError: ``phase`` is not one of the config's launches.
    """
    phases = launch_phases(config)
    if phase is not None and phase not in phases:
        form = "arrival" if config.arrival else "phased" if config.phased else "waiting"
        raise ValueError(f"phase={phase!r}: a {form} split config runs phases {phases}")
    return {"CHUNKS": config.chunks, "CHUNKS_P2": config.chunks_p2, "ALIGN": config.align,
            "TICKETED": config.ticketed, "STAGES": config.num_stages, "WAIT_ATOMIC": wait_atomic,
            "SHIFTED": shifted and config.align > 1, "PHASE": phases[0] if phase is None else phase}


def launch_phases(config: Config) -> tuple[int, ...]:
    """The PHASE of each launch of ``config``'s kernel, in order: a split config's exchange in
    two launches (``phased``: ``EXCHANGE_PUBLISH`` then ``EXCHANGE_READ``), in one by arrival
    (``arrival``: ``EXCHANGE_ARRIVE``) or in one with the wait (``EXCHANGE_WAIT``); every other
    config launches once (its kernel has no PHASE)."""
    if config.regime == "split" and config.arrival:
        return (EXCHANGE_ARRIVE,)
    if config.regime == "split" and config.phased:
        return (EXCHANGE_PUBLISH, EXCHANGE_READ)
    return (EXCHANGE_WAIT,)


def tiles(config: Config, n_outer: int, rows_per_outer: int) -> tuple[int, int]:
    """Tiles per group and in all: a tile is ``block_m`` rows of one group."""
    per_outer = -(-rows_per_outer // config.block_m)
    return per_outer, n_outer * per_outer


def scalar_arguments(config: Config, n_outer: int, rows_per_outer: int, n_cols: int,
                     strides: Sequence[tuple[int, int, int]], fusion: Sequence[Any] = NO_FUSION) -> tuple[Any, ...]:
    """The scalar arguments after the tensors and scratch, in order (``COUNTS``, strides, and in
    the regimes that fuse, ``fusion``: the values of ``FUSED_SCALARS``)."""
    per_outer, total = tiles(config, n_outer, rows_per_outer)
    items = total * config.chunks if config.regime == "split" else total
    fused = tuple(fusion) if config.regime in FUSED_REGIMES else ()
    return (items, per_outer, rows_per_outer, n_cols, *(s for triple in strides for s in triple), *fused)


def parameter_names(direction: str, regime: str) -> tuple[str, ...]:
    """The names of a kernel's non-constexpr parameters, in order, as the kernels spell them."""
    names = [f"{t}_ptr" for t in tensor_names(direction, regime)]
    if regime == "split":
        names += [f"{name}_ptr" for name, _ in SCRATCH]
    names += ["n_items" if regime == "split" else "n_tiles", *COUNTS[1:]]
    names += [f"{t}_{axis}_stride" for t in TENSORS[direction] for axis in ("outer", "row", "col")]
    if regime in FUSED_REGIMES:
        names += FUSED_SCALARS
    return tuple(names)


def tensor_names(direction: str, regime: str) -> tuple[str, ...]:
    """A kernel's tensor arguments (the split scratch aside), in order."""
    return TENSORS[direction] + (FUSED_TENSORS if regime in FUSED_REGIMES else ())


def options(config: Config, num_warps: int, cooperative: bool, overlap: bool = False) -> dict[str, Any]:
    """Compile and launch options: warps, pipeline depth, and for a persistent split grid (its
    programs wait on each other) a cooperative launch where the stack offers one, so that the
    driver refuses a grid that is not resident at once instead of letting it hang (a grid whose
    exchange takes two launches, ``phased``, or counts arrivals, ``arrival``, waits on nothing).
    ``overlap``: launched to overlap the kernel before it (``launch_pdl``; its kernel waits for
    that one first, ``kernels/dependency.py``), unless cooperative.

    Floating-point fusion (multiply-adds) is chosen, not left to Triton's default: the kernels
    were measured with it, Triton 3.9 warns on a process's first compile that leaves it unset, and
    3.10 turns the default off. Every backend's options take it (the interpreter ignores it)."""
    values: dict[str, Any] = {"num_warps": num_warps, "num_stages": config.num_stages, "enable_fp_fusion": True}
    waits = config.regime == "split" and not (config.ticketed or config.phased or config.arrival)
    if waits and cooperative:
        values["launch_cooperative_grid"] = True
    if overlap and "launch_cooperative_grid" not in values:
        # The driver starts a cooperative grid only once the kernel ahead of it has ended (H200,
        # NOTES v42): it asks for no overlap.
        values["launch_pdl"] = True
    return values


# The streamed kernels of rows cut into parts, in two launches (``kernels/partials.py``): rows sharded
# across ranks (``distributed.py``), and the ``sliced`` regime (long reductions along a strided
# dimension cut into slices; ``strided_planner._strided_config``). The kernels of each phase, their
# tensors in argument order (``stats``: the partials, indexed by part and row; the others: row
# views with (outer, row, column) strides), and counts after ``COUNTS``: the slices and the
# columns each holds (one slice of the whole row for sharded rows), and where partials are
# combined, the parts whose partials are read (the ranks, or the slices).
SLICED = "sliced"
SHARDED_PHASES = ("forward_partials", "forward_normalize", "backward_partials", "backward_normalize")
SHARDED_TENSORS = {
    "forward_partials": ("x", "stats"),
    "forward_normalize": ("x", "stats", "y"),
    "backward_partials": ("y", "dy", "stats"),
    "backward_normalize": ("y", "dy", "stats", "dx"),
}
SLICE_COUNTS = ("n_slices", "slice_cols")
COMBINED_PHASES = ("forward_normalize", "backward_normalize")


def phases(direction: str) -> tuple[str, str]:
    """The two phases of ``direction``, in launch order."""
    if direction not in DIRECTIONS:
        raise ValueError(f"no phases for {direction!r}")
    return f"{direction}_partials", f"{direction}_normalize"


def sharded_kernel_name(phase: str) -> str:
    if phase not in SHARDED_PHASES:
        raise ValueError(f"no sharded kernel for {phase!r}")
    return f"softmax_{phase}"


def sharded_row_tensors(phase: str) -> tuple[str, ...]:
    """The tensors of ``phase`` walked as row views (all but the partials)."""
    return tuple(t for t in SHARDED_TENSORS[phase] if t != "stats")


def phase_strides(direction: str, phase: str, strides: Sequence[tuple[int, int, int]]
                  ) -> list[tuple[int, int, int]]:
    """The row tensors' strides of ``phase`` (``sharded_row_tensors``), from ``strides`` of the
    direction's tensors in ``TENSORS`` order."""
    names = TENSORS[direction]
    return [strides[names.index(t)] for t in sharded_row_tensors(phase)]


def sharded_parameter_names(phase: str) -> tuple[str, ...]:
    names = [f"{t}_ptr" for t in SHARDED_TENSORS[phase]]
    names += ["n_tiles", *COUNTS[1:], *SLICE_COUNTS, *(("n_ranks",) if phase in COMBINED_PHASES else ())]
    names += [f"{t}_{axis}_stride" for t in sharded_row_tensors(phase) for axis in ("outer", "row", "col")]
    return tuple(names)


def _parts(config: Config, ranks: int) -> int:
    """The parts whose partials a normalize phase combines: a sliced config's slices, else ``ranks``."""
    return config.chunks if config.regime == SLICED else ranks


def sharded_constexprs(phase: str, config: Config, log: bool, acc_fp64: bool, ranks: int) -> dict[str, Any]:
    values: dict[str, Any] = {"BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "ACC_FP64": acc_fp64}
    if phase != "forward_partials":
        values["LOG"] = log
    if phase in COMBINED_PHASES:
        values["RANKS_P2"] = 1 << max(_parts(config, ranks) - 1, 0).bit_length()
    return values


def slice_columns(config: Config, n_cols: int) -> int:
    """The columns each slice of a row holds: a sliced config cuts rows into ``chunks`` slices,
    every other config takes the row whole."""
    return -(-n_cols // config.chunks) if config.regime == SLICED else n_cols


def sharded_scalar_arguments(phase: str, config: Config, n_outer: int, rows_per_outer: int, n_cols: int,
                             strides: Sequence[tuple[int, int, int]], ranks: int) -> tuple[int, ...]:
    """The integer arguments after the tensors: counts, the slices, the parts combined where they
    are, each row view's strides. ``ranks``: the ranks whose partials a sharded normalize phase
    combines (the backward's are all-reduced first: 1); a sliced config combines its slices."""
    per_outer, total = tiles(config, n_outer, rows_per_outer)
    cols = slice_columns(config, n_cols)
    counts = (-(-n_cols // cols) if n_cols else 1, cols)
    extra = (_parts(config, ranks),) if phase in COMBINED_PHASES else ()
    return (total, per_outer, rows_per_outer, n_cols, *counts, *extra, *(s for triple in strides for s in triple))


# The cross-entropy kernels (``kernels/loss.py``, ``kernels/loss_split.py``): a tile of rows held
# whole (``tile``: the forward may write the gradient in the same pass), a row cut into chunks
# held by co-resident programs (``split``, forward of class targets only: the split kernels'
# scratch after the tensors, its ``loss`` the first of CHUNKS slabs of per-position partials) or
# rows streamed in chunks (``loop``); one backward kernel that streams the gradient from the
# saved lse; and the held gradient's rescale. Tensors in argument order (absent ones: the input
# stands in, never read or written); the row tensors are walked through the row view with
# (outer, row, column) strides (one value per position: column stride 0); ``weight`` (classes)
# and ``stats`` (the reduction's denominators and the summed weights, ``kernels/loss_terms.py``'
# ``_constants``) are indexed directly.
LOSS_REGIMES = ("tile", "split", "loop")
LOSS_TENSORS = {
    "forward": ("x", "target", "weight", "stats", "loss", "lse", "grad"),
    "backward": ("x", "target", "weight", "stats", "lse", "dloss", "grad"),
}
LOSS_DIRECT_TENSORS = ("weight", "stats")
LOSS_SCALARS = ("ignore_index",)
# What ``stats`` holds, in order: the call's values, formed on the device.
LOSS_STATS = ("ce_denominator", "z_denominator", "weight_sum", "smoothing", "z_loss", "softcap")
GRAD_SCALE_KERNEL = "cross_entropy_grad_scale"
# Its parameters (a dense buffer of n_elements, times one value) and block.
GRAD_SCALE_PARAMETERS = ("grad_ptr", "dloss_ptr", "n_elements")
GRAD_SCALE_BLOCK = 4096
# The stats of a 'mean' of class targets formed by one program (``kernels/loss.py``): the counted
# targets' summed weights and count, W, and the rest copied from a kept constant of the call's
# values (``loss_reduction.stats``). Its parameters; its largest block of targets (one program: a fixed
# order; ``loss_planner.plan_stats``).
STATS_KERNEL = "cross_entropy_stats"
STATS_PARAMETERS = ("target_ptr", "weight_ptr", "kept_ptr", "stats_ptr", "n_targets", "n_classes", "ignore_index")
STATS_BLOCK = 16384
# A reduced loss from its terms, summed and cast by one program (``loss_reduction.reduced``; with
# ``COUNTED``, divided by the counted class targets: ``loss_reduction.counted_mean``): its
# parameters and largest block (``loss_planner.plan_sum``: the short rows' split shares, 8192x32000's
# 32768 and 4096x50257's 53248, in one launch where torch's sum and cast were two ops).
SUM_KERNEL = "cross_entropy_sum"
SUM_PARAMETERS = ("terms_ptr", "target_ptr", "out_ptr", "n_terms", "n_targets", "ignore_index")
SUM_BLOCK = 65536


@dataclass(frozen=True)
class LossFacts:
    """What a cross-entropy call specialises its kernels on, besides the configuration: float64
    accumulation, the options present, and whether the forward writes the gradient."""

    acc_fp64: bool = False
    weight: bool = False
    prob_target: bool = False
    smoothing: bool = False
    z_loss: bool = False
    softcap: bool = False
    write_grad: bool = False
    # The split kernel's (``CallFacts``' namesakes): the wait's read, and the gradient written at
    # the logits' windows (rows sliced from a padded vocabulary, their gradient contiguous).
    wait_atomic: bool = True
    shifted: bool = False
    # The forward launched to overlap the kernel before it (``kernels/dependency.py``): where the
    # target offers it.
    dependent: bool = False
    # An unweighted 'mean' of class targets that writes the gradient: its denominators, the count of
    # counted targets, may be formed by the forward's own grid (``loss_counts``), its stats holding 1.
    counted: bool = False
    # A reduced loss ('mean' or 'sum') that writes the gradient: its sum may be formed by the
    # forward's own grid (``loss_sums``), into a loss tensor of the input's dtype.
    summed: bool = False


def grid_count_fits(n_rows: int, programs: int) -> bool:
    """Whether a grid of ``programs`` counts the targets of ``n_rows`` positions in its one int32
    word (``kernels/grid_count.py``): a count below 2**GRID_COUNT_BITS, arrivals in the 31 bits
    above it less one."""
    return n_rows < 1 << GRID_COUNT_BITS and programs < 1 << (31 - GRID_COUNT_BITS)


def _persistent_gradient_grid(config: Config, facts: LossFacts) -> bool:
    """Whether the cross-entropy forward of ``config`` writes the gradient over a split grid whose
    programs are resident at once, or exchanged in two launches: not a ticketed grid (its later
    programs start only as earlier ones end, a program an item), nor one by arrival (no gradient).
    Such a grid may form a 'mean''s count and the reduced loss itself."""
    return facts.write_grad and config.regime == "split" and not (config.ticketed or config.arrival)


def loss_counts(config: Config, facts: LossFacts) -> bool:
    """Whether the cross-entropy forward of ``config`` counts the 'mean''s targets itself
    (``COUNTED``, ``kernels/grid_count.py``) for a ``counted`` call of ``facts``, over a
    ``_persistent_gradient_grid``. Where it does not (nor where its grid and rows do not fit the
    count's word, ``grid_count_fits``), the call's stats hold the denominators
    (``loss_reduction.stats``)."""
    return facts.counted and _persistent_gradient_grid(config, facts)


def loss_sums(config: Config, facts: LossFacts) -> bool:
    """Whether the cross-entropy forward of ``config`` sums a reduced loss itself (``SUMMED``,
    ``kernels/grid_sum.py``, a partial a program) for a ``summed`` call of ``facts``, over a
    ``_persistent_gradient_grid``. Its ``loss`` is then the reduced loss, in the input's dtype;
    elsewhere the kernel writes shares a sum after it reduces (``loss_reduction.reduced``)."""
    return facts.summed and _persistent_gradient_grid(config, facts)


def loss_dependent(direction: str, offered: bool) -> bool:
    """Whether the cross-entropy kernel of ``direction`` is compiled and launched to overlap the
    kernel before it (``LossFacts.dependent``): the forward, where the target offers it
    (``DeviceRecord.dependent_launch``). The backward holds no wait: it is never launched so."""
    return offered and direction == "forward"


def loss_kernel_name(direction: str, regime: str) -> str:
    if direction not in DIRECTIONS or regime not in LOSS_REGIMES or (direction, regime) == ("backward", "split"):
        raise ValueError(f"no cross-entropy kernel for {direction!r} {regime!r}")
    return f"cross_entropy_forward_{regime}" if direction == "forward" else "cross_entropy_backward"


def loss_row_tensors(direction: str) -> tuple[str, ...]:
    """The tensors of ``direction`` walked through the row view, in argument order."""
    return tuple(t for t in LOSS_TENSORS[direction] if t not in LOSS_DIRECT_TENSORS)


def loss_constexprs(direction: str, config: Config, facts: LossFacts, phase: Optional[int] = None) -> dict[str, Any]:
    """The constexprs of a cross-entropy kernel; a split config's also (``split_constexprs``,
    ``phase`` one of ``launch_phases(config)``); the forward loop's its windows (``ALIGN``)."""
    values: dict[str, Any] = {"BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "ACC_FP64": facts.acc_fp64,
                              "WEIGHT": facts.weight, "PROB_TARGET": facts.prob_target,
                              "SMOOTHING": facts.smoothing, "Z_LOSS": facts.z_loss, "SOFTCAP": facts.softcap}
    if direction == "forward":
        values["WRITE_GRAD"] = facts.write_grad
        values["DEPENDENT"] = facts.dependent
        if config.regime == "split":
            values["COUNTED"] = loss_counts(config, facts)
            values["SUMMED"] = loss_sums(config, facts)
            values["WHOLE"] = config.whole_loop
        if config.regime == "loop":
            # The forward alone's streamed rows read through aligned windows (``kernels/loss.py``).
            values["ALIGN"] = config.align
    elif config.align > 1:
        # The backward's too; named only there, so that its other variants (and their resource
        # table keys) stay as they were.
        values["ALIGN"] = config.align
    if config.regime == "split":
        values.update(split_constexprs(config, facts.wait_atomic, facts.shifted, phase))
    return values


def one_row_groups(config: Config, n_outer: int) -> bool:
    """Whether the loss's split kernel takes the rows of one group (a 2-D input) as groups of one
    row each: Triton specialises the rows a group (1) and the tiles a group (1) as constants, so an
    item finds its row with no division and its row mask folds away (sm_90, bf16 8192x32000: 1191
    -> 1072 instructions an item, NOTES v46). Persistent grids of aligned rows only: on the H200
    the ticketed fp32 forms ran 2-3% slower so, and the windowed bf16 rows of 50257 spilled more
    at 10 programs an SM and fitted 8."""
    return (config.regime == "split" and config.block_m == 1 and n_outer == 1 and not config.ticketed
            and config.align == 1)


def loss_scalar_arguments(config: Config, n_outer: int, rows_per_outer: int, n_cols: int,
                          strides: Sequence[tuple[int, int, int]], scalars: Sequence[Any]) -> tuple[Any, ...]:
    """The arguments after the tensors (and a split kernel's scratch): ``COUNTS`` (a split
    kernel's items are tiles x chunks), each row tensor's strides, ``LOSS_SCALARS``."""
    if one_row_groups(config, n_outer):
        n_outer, rows_per_outer = rows_per_outer, 1
        strides = [(r, r, c) for _, r, c in strides]
    per_outer, total = tiles(config, n_outer, rows_per_outer)
    items = total * config.chunks if config.regime == "split" else total
    return (items, per_outer, rows_per_outer, n_cols, *(s for triple in strides for s in triple), *scalars)


def loss_parameter_names(direction: str, regime: str = "tile") -> tuple[str, ...]:
    """A cross-entropy kernel's non-constexpr parameters, in order, as the kernels spell them."""
    names = [f"{t}_ptr" for t in LOSS_TENSORS[direction]]
    if regime == "split":
        names += [f"{name}_ptr" for name, _ in SCRATCH]
    names += ["n_items" if regime == "split" else "n_tiles", *COUNTS[1:]]
    names += [f"{t}_{axis}_stride" for t in loss_row_tensors(direction) for axis in ("outer", "row", "col")]
    return (*names, *LOSS_SCALARS)
