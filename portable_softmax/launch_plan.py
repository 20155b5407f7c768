"""A call's launch plan, from what its kernel variants are known to occupy, checked against the
one binary that launches.

The planner (``planner.plan_launch``) weighs candidate configurations (a persistent or ticketed
split grid, register caps, taller tiles, dense and per-tile forms) by their resources. Compiling
each candidate to read them cost a cold first call several compiles (an H100's first bf16
softmax of 4096x50257 six, 5 s: issue 34). Here planning reads them from what is known
(``known_resources``: the target's table of compiled variants, ``kernel_resources``, else an
estimate), then compiles only the variant the plan launches and checks its numbers against the
ones planned with (``plan_checked``): where they differ, it plans again with the compiled
numbers, until the launched variant's numbers are its own (usually at once: one compile).

Torch-free: the launch layers (``launch``, ``loss_launch``) hand in the compile; the tests a fake
one, to count what a first call compiles.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional, TypeVar

from portable_softmax import variants
from portable_softmax.kernel_resources import POINTER_TYPES, ResourceTable, argument_signature, variant_key
from portable_softmax.loss_planner import plan_loss
from portable_softmax.plan_grid import KernelConfig, LaunchPlan, Target, estimate_resources
from portable_softmax.planner import call_windows, plan_launch, tile_fill, tile_fit
from portable_softmax.record import KernelResources
from portable_softmax.split_planner import split_fit

logger = logging.getLogger(__name__)

# The compile option of a register cap (``vendors._cuda_fit_options``): an estimate under it holds
# no more registers, and spills what it would have held beyond them.
REGISTER_CAP = "maxnreg"


@dataclass(frozen=True)
class RowView:
    """How the tensors of one call map onto rows (see ``kernels``): groups of rows, and for
    each tensor its (outer, row, column) strides in elements."""

    n_outer: int
    rows_per_outer: int
    n_cols: int
    strides: tuple[tuple[int, int, int], ...]

    @property
    def n_rows(self) -> int:
        return self.n_outer * self.rows_per_outer

    @property
    def strided(self) -> bool:
        """Whether an input's rows lie side by side in memory while its rows' own elements do not
        (a reduction along a strided dimension): tiles then span adjacent rows
        (``strided_planner._strided_config``). The last tensor is the output."""
        return self.rows_per_outer > 1 and self.n_cols > 1 and any(
            row == 1 and col != 1 for _, row, col in self.strides[:-1])

    @property
    def narrow(self) -> bool:
        """Whether every element offset of every tensor fits in int32."""
        counts = (self.n_outer, self.rows_per_outer, self.n_cols)
        return all(sum((count - 1) * abs(stride) for count, stride in zip(counts, triple)) < 2**31
                   for triple in self.strides)


@dataclass(frozen=True)
class Variant:
    """One binary of a kernel: how its scalar arguments are specialised
    (``kernel_resources.argument_signature``), its constexprs and compile options (and the
    configuration it was made from, which an estimate reads; not part of its identity)."""

    kernel: str
    arguments: str
    constexprs: tuple[tuple[str, Any], ...]
    options: tuple[tuple[str, Any], ...]
    config: KernelConfig = dataclasses.field(compare=False)

    @classmethod
    def of(cls, kernel: str, scalars: Sequence[Any], constexprs: Mapping[str, Any], options: Mapping[str, Any],
           config: KernelConfig) -> "Variant":
        """The variant of ``kernel`` launched with ``scalars`` (its arguments after the tensors)."""
        return cls(kernel, argument_signature(scalars), tuple(sorted(constexprs.items())),
                   tuple(sorted(options.items())), config)

    def key(self, dtype: str) -> str:
        """Its key in a table of known resources, for data of ``dtype``."""
        return variant_key(self.kernel, POINTER_TYPES[dtype], self.arguments, dict(self.constexprs),
                           dict(self.options))

    @property
    def constexpr_values(self) -> dict[str, Any]:
        return dict(self.constexprs)

    @property
    def option_values(self) -> dict[str, Any]:
        return dict(self.options)


Lookup = Callable[[Variant], KernelResources]
Plan = TypeVar("Plan")


def known_resources(target: Target, table: ResourceTable, dtype: str, backward: bool, input_bytes: int) -> Lookup:
    """What planning knows of a variant for data of ``dtype``: the table's row (or its nearest,
    ``ResourceTable.nearest``); else an estimate (``plan_grid.estimate_resources``; under a
    register cap, no more registers than the cap, the rest spilled), or for a variant under a cap
    whose uncapped form has a row, that row with its registers above the cap spilled, whichever
    spills less. ``backward`` and ``input_bytes`` as the planner hands them to its estimate.

    Both are guesses, and the one that spills less is the one that lets a denser grid be tried: a
    plan from a guess is checked against the binary it launches (``plan_checked``), so a guess
    too hopeful costs a compile, one too gloomy the grid. The estimate counts a thread's elements
    twice for the forward that writes the gradient: under a cap of 96 it gave float32 split rows
    of 8192 64 spilled words where their binary (103 registers uncapped, Triton 3.6) spills none,
    so the H200 ran them at 4 programs an SM rather than 5 (NOTES v50). Registers above a cap are
    not all spilled either: the forward alone's streamed windows, uncapped past the cap of 5 an
    SM by more than 8 words, compile under it within them."""
    def known(variant: Variant) -> KernelResources:
        found = table.nearest(variant.key(dtype))
        if found is not None:
            return found
        guess = estimate_resources(target.record, variant.config, backward, input_bytes)
        cap = variant.option_values.get(REGISTER_CAP)
        if cap is None:
            return guess
        if guess.registers > cap:
            guess = dataclasses.replace(guess, registers=cap, spills=guess.registers - cap)
        options = tuple(option for option in variant.options if option[0] != REGISTER_CAP)
        uncapped = table.nearest(dataclasses.replace(variant, options=options).key(dtype))
        if uncapped is not None:
            spills = uncapped.spills + max(0, uncapped.registers - cap)
            if spills < guess.spills:
                return dataclasses.replace(uncapped, registers=min(cap, uncapped.registers), spills=spills)
        return guess
    return known


def plan_checked(plan: Callable[[Lookup], Plan], launched: Callable[[Plan, Lookup], Sequence[Variant]],
                 known: Lookup, compile: Lookup) -> tuple[Plan, list[Variant]]:
    """Plan from ``known`` resources, compile what the plan launches, and plan again where the
    compiled numbers differ from the known ones, until the launched variants' numbers are their
    own binaries'. Each round compiles a variant not compiled before, so it ends, at worst when
    every candidate is compiled (as every first call did before the tables); where the known
    numbers hold, after one compile per launched variant.

    Args:
        plan: the plan from a lookup of variants' resources (pure: it may be asked again).
        launched: the variants a plan launches whose resources sized it (none for a plan not
            sized from resources), as the lookup picks them (register caps depend on it).
        known: what is known before compiling (``known_resources``).
        compile: compiles a variant and returns its resources.

    Returns:
        The plan and its launched variants, each compiled (by ``compile``) exactly once.
    """
    compiled: dict[Variant, KernelResources] = {}

    def lookup(variant: Variant) -> KernelResources:
        found = compiled.get(variant)
        return found if found is not None else known(variant)

    while True:
        found = plan(lookup)
        chosen = list(launched(found, lookup))
        fresh = [v for v in chosen if v not in compiled]
        if not fresh:
            return found, chosen
        guessed = {v: known(v) for v in fresh}
        for variant in fresh:
            compiled[variant] = compile(variant)
        if all(compiled[v] == guessed[v] for v in fresh):
            return found, chosen
        logger.debug("planned %s from %s, compiled %s: planning again", [v.kernel for v in fresh],
                     list(guessed.values()), [compiled[v] for v in fresh])


@dataclass(frozen=True)
class Fusion:
    """A fused call's variant (``variants.CallFacts``' scale, mask, causal) and the values of
    ``variants.FUSED_SCALARS``."""

    scale: int
    mask: int
    causal: bool
    scalars: tuple


@dataclass(frozen=True)
class SoftmaxCall:
    """What a softmax call's plan and variants depend on, besides the target: the direction, the
    row view, the call's facts (``variants.CallFacts``) and fused scalars, the bytes a column
    reads, the windows (``planner.call_windows``), the accumulation's dtype name, and the
    launch's choices (the split path allowed, a forced grid, a cooperative launch on offer)."""

    direction: str
    view: RowView
    facts: variants.CallFacts
    fused_scalars: tuple
    input_bytes: int
    align: int
    dtype: str
    programs: Optional[int] = None
    cooperative: bool = False
    fused: bool = False

    @property
    def backward(self) -> bool:
        return self.direction == "backward"

    def scalars(self, config: KernelConfig) -> tuple:
        """The kernel's scalar arguments for ``config`` (``variants.scalar_arguments``)."""
        view = self.view
        return variants.scalar_arguments(config, view.n_outer, view.rows_per_outer, view.n_cols, view.strides,
                                         self.fused_scalars)


def softmax_call(target: Target, direction: str, view: RowView, element_sizes: Sequence[int], aligned: bool,
                 log: bool, acc_fp64: bool, programs: Optional[int] = None,
                 fusion: Optional[Fusion] = None) -> SoftmaxCall:
    """The call of ``direction`` over ``view`` whose data tensors (inputs, then the output) have
    ``element_sizes`` and start 16-byte aligned where ``aligned``; ``fusion`` for a fused call."""
    align, shifted = call_windows(view.n_outer, view.rows_per_outer, view.n_cols, view.strides, element_sizes,
                                  aligned)
    facts = variants.CallFacts(log, acc_fp64, target.tuning.split_wait_atomic, shifted,
                               *((fusion.scale, fusion.mask, fusion.causal) if fusion else ()))
    return SoftmaxCall(direction, view, facts, fusion.scalars if fusion else variants.NO_FUSION,
                       sum(element_sizes[:-1]), align, "float64" if acc_fp64 else "float32", programs,
                       target.record.cooperative_launch, fusion is not None)


def softmax_variant(target: Target, call: SoftmaxCall, config: KernelConfig, lookup: Lookup) -> Variant:
    """The variant ``config`` launches for ``call``: its kernel, constexprs and options, with the
    register cap that fits the most programs per unit (``_fitted``) where the tuning asks for
    one (``split_planner.split_fit``, ``tile_fill``, ``tile_fit``)."""
    kernel = variants.kernel_name(call.direction, config.regime)
    constexprs = variants.constexprs(config, call.facts)
    options = variants.options(config, config.num_warps, call.cooperative)
    scalars = call.scalars(config)
    variant = Variant.of(kernel, scalars, constexprs, options, config)
    caps = split_fit(target, config, call.input_bytes) or tile_fill(target, config, call.input_bytes)
    if caps:
        variant = _fitted(target, variant, caps, lookup, reach=False)
    caps = tile_fit(target, config, scalars[0])
    if caps:
        # Only where every tile then has a program at once: a second wave left partly empty
        # costs as much as a full one.
        variant = _fitted(target, variant, caps, lookup, reach=True)
    return variant


def _fitted(target: Target, variant: Variant, caps: list[tuple[int, dict[str, Any]]], lookup: Lookup,
            reach: bool) -> Variant:
    """The most programs per unit whose register cap spills no more than the tuning allows (a
    cap that spills in the loop costs more than the programs it adds) and that holds more
    programs than ``variant``, or (reach) as many as the cap was asked for."""
    held = target.occupancy(target.record, lookup(variant))
    for programs, fit in caps:
        if programs <= held:
            break
        capped = dataclasses.replace(variant, options=tuple(sorted({**variant.option_values, **fit}.items())))
        used = lookup(capped)
        occupancy = target.occupancy(target.record, used)
        if used.spills <= target.tuning.split_fit_max_spills and occupancy >= (programs if reach else held + 1):
            return capped
    return variant


def plan_softmax(target: Target, call: SoftmaxCall, known: Lookup, compile: Lookup) -> tuple[LaunchPlan, list[Variant]]:
    """``call``'s plan and the variant it launches (none for a sliced plan, whose two launches
    are not sized from resources), by ``plan_checked``."""
    view = call.view

    def plan(lookup: Lookup) -> LaunchPlan:
        return plan_launch(target, view.n_rows, view.n_cols, call.dtype, backward=call.backward,
                           rows_per_group=view.rows_per_outer,
                           resources=lambda config: lookup(softmax_variant(target, call, config, lookup)),
                           programs=call.programs, align=call.align,
                           input_bytes=call.input_bytes, narrow=view.narrow, strided=view.strided,
                           causal=call.facts.causal, sliceable=not call.fused)

    def launched(found: LaunchPlan, lookup: Lookup) -> list[Variant]:
        if found.regime == variants.SLICED:
            return []
        return [softmax_variant(target, call, found.config, lookup)]
    return plan_checked(plan, launched, known, compile)


@dataclass(frozen=True)
class LossCall:
    """What a cross-entropy call's plan and variants depend on, besides the target: the
    direction, the row view (``variants.loss_row_tensors``' strides), the call's facts (its split
    kernel's wait and windows set: ``variants.LossFacts``), ``variants.LOSS_SCALARS``' values, the
    bytes a column reads, whether the forward may split (class targets) and through which
    windows (``planner.call_windows``), and whether a cooperative launch is on offer."""

    direction: str
    view: RowView
    facts: variants.LossFacts
    scalars: tuple
    input_bytes: int
    splittable: bool = False
    align: int = 1
    cooperative: bool = False

    @property
    def writes_gradient(self) -> bool:
        """Whether its kernel writes the gradient (as the planner and the estimate count its
        registers)."""
        return loss_writes_gradient(self.direction, self.facts)


def loss_variant(target: Target, call: LossCall, config: KernelConfig, lookup: Lookup) -> Variant:
    """The cross-entropy kernel ``config`` launches for ``call``, a split one with the register
    cap that fits the most programs per unit (``split_planner.split_fit``, ``_fitted``)."""
    view = call.view
    arguments = variants.loss_scalar_arguments(config, view.n_outer, view.rows_per_outer, view.n_cols, view.strides,
                                               call.scalars)
    variant = Variant.of(variants.loss_kernel_name(call.direction, config.regime), arguments,
                         variants.loss_constexprs(call.direction, config, call.facts),
                         variants.options(config, config.num_warps, call.cooperative, call.facts.dependent), config)
    fit = target
    limit = target.tuning.loss_gradient_programs_per_unit
    # (Rows of many chunks, without the whole loop, want every program the cap fits: NOTES v47.)
    if limit and call.writes_gradient and config.num_stages > 1 and config.whole_loop:
        fit = dataclasses.replace(target, tuning=dataclasses.replace(
            target.tuning, split_programs_per_unit=min(limit, target.tuning.split_programs_per_unit)))
    caps = split_fit(fit, config, call.input_bytes) or _loop_fit(target, config, call)
    return _fitted(target, variant, caps, lookup, reach=False) if caps else variant


def _loop_fit(target: Target, config: KernelConfig, call: LossCall) -> list[tuple[int, dict[str, Any]]]:
    """The register caps to try on the forward alone's streamed program (``Tuning.loss_loop_fit``'s
    programs a unit for the bytes its columns read, down to one; ``_fitted`` keeps the first that
    holds more than uncapped and spills no more than the tuning allows)."""
    wanted = target.tuning.loss_loop_fit.get(call.input_bytes, 0)
    if config.regime != "loop" or call.writes_gradient or wanted < 1:
        return []
    caps = [(programs, target.fit_options(target.record, config.num_warps, programs))
            for programs in range(wanted, 0, -1)]
    return [(programs, options) for programs, options in caps if options]


def plan_cross_entropy(target: Target, call: LossCall, known: Lookup,
                       compile: Lookup) -> tuple[LaunchPlan, list[Variant]]:
    """The plan of ``call``'s cross-entropy kernel (``loss_planner.plan_loss``) and the variant it
    launches, by ``plan_checked``."""
    view = call.view

    def plan(lookup: Lookup) -> LaunchPlan:
        return plan_loss(target, view.n_rows, view.n_cols, "float64" if call.facts.acc_fp64 else "float32",
                         writes_gradient=call.writes_gradient, rows_per_group=view.rows_per_outer,
                         resources=lambda config: lookup(loss_variant(target, call, config, lookup)),
                         input_bytes=call.input_bytes, rereads=call.facts.write_grad and call.direction == "forward",
                         splittable=call.splittable, align=call.align,
                         column_loads=call.facts.weight and call.facts.smoothing, softcap=call.facts.softcap)
    return plan_checked(plan, lambda found, lookup: [loss_variant(target, call, found.config, lookup)], known,
                        compile)


def loss_writes_gradient(direction: str, facts: variants.LossFacts) -> bool:
    """Whether the cross-entropy kernel of ``direction`` writes the gradient (as the planner and
    the estimate count its registers)."""
    return facts.write_grad or direction == "backward"
