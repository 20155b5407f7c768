"""The problems a compile report covers, the kernel variants the launch plans use for them, and
each variant's launch specialisation (the arguments ``kernel[grid](...)`` would pass on contiguous
tensors) as a spec a worker compiles."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Iterable

from portable_softmax import variants
from portable_softmax.loss_planner import split_elements_per_thread
from portable_softmax.plan_grid import KernelConfig, next_power_of_2
from portable_softmax.planner import (DTYPE_BYTES, TALLER_TILES, contiguous_align, plan_sharded, call_windows,
                                      input_bytes_per_column)
from portable_softmax.targets import (dense_form, flat_form, loss_split_form, plan_loss, select_config,
                                      target_for, ticketed_forms)
from portable_softmax.record import DeviceRecord
from portable_softmax.tuning import tuning_for
from portable_softmax.crosscompile.targets import Target

DEFAULT_SHAPES = ((32768, 256), (32768, 4096), (16384, 16384), (4096, 50257), (4096, 262144), (32, 128256),
                  (4096, 4095))

# Reductions along a strided dimension, as rows (side by side in memory) x their length: a
# column softmax of a (32768, 1024) tensor.
DEFAULT_STRIDED_SHAPES = ((1024, 32768),)

# Rows sharded across ranks (``distributed.py``): rows x the local slice's length (a vocabulary of
# 151936 over 2 ranks).
DEFAULT_SHARDED_SHAPES = ((8192, 75968),)

# Rows sliced from a padded vocabulary (rows x length; the inputs' rows at a stride padded to
# SLICED_PADDING elements, the output contiguous, so written unaligned: SHIFTED).
DEFAULT_SLICED_SHAPES = ((4096, 50257),)

SLICED_PADDING = 64

# The fused variants (``fused.py``: scale, mask, causal), as rows x keys: attention rows in tiles
# and a vocabulary of logits (split, or the loop where residency is not promised). Each compiles
# the heaviest form, ``FUSED_FORM``: a per-row scale tensor, a bool mask and causal; the strided
# shapes also compile fused, without causal (a call over the last dimension only).
DEFAULT_FUSED_SHAPES = ((16384, 2048), (256, 151936))

FUSED_FORM = {"scale": 2, "mask": 1, "causal": True}

# The cross-entropy kernels (``kernels/loss.py``, ``kernels/loss_split.py``), as tokens x
# vocabulary: rows held in tiles, and vocabularies split across programs forward (the loop regime
# where the split path is closed, and backward), one of them off 16-byte boundaries (windows).
# Each compiles in the forms ``LOSS_FORMS`` names, by role.
DEFAULT_LOSS_SHAPES = ((16384, 4096), (8192, 128256), (4096, 50257))

# The forms of the loss kernels compiled for each problem, by role: the forward that writes the
# gradient (plain: the default 'mean', its grid counting the targets where it splits rows; and with
# every option: class weights, smoothing, z-loss, softcap; both summing the loss by the grid where
# it splits rows; and the rows' losses written, not summed: the head's and the tensor-parallel
# loss's chunks), the forward alone (no gradient needed), and the backward of reduction='none'
# with every option.
ALL_OPTIONS = {"weight": True, "smoothing": True, "z_loss": True, "softcap": True}
LOSS_FORMS = {
    "forward": {"grad": {"write_grad": True, "counted": True, "summed": True},
                "grad, all": {**ALL_OPTIONS, "write_grad": True, "summed": True}, "grad, rows": {"write_grad": True},
                "no grad": {}},
    "backward": {"all": ALL_OPTIONS},
}

# A loss role names its form (``LOSS_FORMS``), then after this separator, for a configuration
# the plan may take instead of the one it takes from estimated resources, which: the split
# forms the planner picks between from compiled occupancy and the loop it falls back to.
LOSS_ALTERNATIVE = " | "

# The ranks whose partials the sharded kernels combine, as compiled here.
SHARDED_RANKS = 2

DEFAULT_DTYPES = ("bfloat16", "float32")

POINTER_TYPES = {"float16": "*fp16", "bfloat16": "*bf16", "float32": "*fp32", "float64": "*fp64"}


@dataclass(frozen=True)
class Case:
    """One problem: a contiguous [rows, cols] tensor, softmax over the last dimension; or with
    ``strided`` a contiguous [cols, rows] one, softmax over the first (rows side by side); with
    ``sharded`` a rank's contiguous slice of rows sharded across ranks (``distributed.py``); with
    ``fused`` the fused variants (``_fused_scalars``); with ``sliced`` rows sliced from a padded
    [rows, cols rounded up to SLICED_PADDING] input, the output contiguous; with ``loss`` the
    cross-entropy of [rows, cols] logits, class targets of int64 (``LOSS_FORMS``)."""

    rows: int
    cols: int
    dtype: str
    backward: bool
    log: bool
    strided: bool = False
    sharded: bool = False
    fused: bool = False
    sliced: bool = False
    loss: bool = False

    @property
    def direction(self) -> str:
        return "backward" if self.backward else "forward"

    @property
    def align(self) -> int:
        if self.strided:
            return 1
        if self.sliced:
            return self._sliced_windows()[0]
        return contiguous_align(self.rows, self.cols, DTYPE_BYTES[self.dtype])

    @property
    def shifted(self) -> bool:
        """Whether the output is written at the inputs' windows, unaligned (``CallFacts.shifted``)."""
        return self.sliced and self._sliced_windows()[1]

    def _sliced_windows(self) -> tuple[int, bool]:
        return call_windows(1, self.rows, self.cols, self.tensor_strides,
                            [DTYPE_BYTES[self.dtype]] * len(self.tensor_strides), True)

    @property
    def strides(self) -> tuple[int, int, int]:
        """The (outer, row, column) strides of every tensor (of the inputs where ``sliced``)."""
        if self.strided:
            return (0, 1 if self.rows > 1 else 0, self.rows)
        if self.sliced:
            return (0, -(-self.cols // SLICED_PADDING) * SLICED_PADDING if self.rows > 1 else 0, 1)
        return (0, self.cols if self.rows > 1 else 0, 1)

    @property
    def tensor_strides(self) -> list[tuple[int, int, int]]:
        """Each tensor's strides, the output's last: contiguous where ``sliced``."""
        tensors = len(variants.TENSORS[self.direction])
        if self.sliced:
            return [self.strides] * (tensors - 1) + [(0, self.cols if self.rows > 1 else 0, 1)]
        return [self.strides] * tensors

    @property
    def causal(self) -> bool:
        # FUSED_FORM's causal, over the last dimension only.
        return self.fused and FUSED_FORM["causal"] and not self.strided

    @property
    def input_bytes(self) -> int:
        # As launch.py passes it (the loss: the logits', as loss_launch passes it).
        if self.loss:
            return DTYPE_BYTES[self.dtype]
        return input_bytes_per_column(DTYPE_BYTES[self.dtype], self.backward)

    @property
    def narrow(self) -> bool:
        # As RowView.narrow: every offset fits in int32.
        return self.rows * self.cols <= 2**31

    @property
    def plan_dtype(self) -> str:
        # What launch.py plans with: only float64 accumulation changes the plan.
        return "float64" if self.dtype == "float64" else "float32"

    def label(self) -> str:
        if self.loss:
            return f"{self.rows}x{self.cols} {self.dtype} {self.direction} cross_entropy"
        function = "log_softmax" if self.log else "softmax"
        over = f"{self.cols}x{self.rows} over dim 0" if self.strided else f"{self.rows}x{self.cols}"
        if self.sharded:
            over = f"{over} sharded"
        if self.fused:
            over = f"{over} fused"
        if self.sliced:
            over = f"{over} sliced"
        return f"{over} {self.dtype} {self.direction} {function}"


def cases_for(shapes: Iterable[tuple[int, int]], dtypes: Iterable[str], logs: Iterable[bool],
              strided_shapes: Iterable[tuple[int, int]] = (),
              sharded_shapes: Iterable[tuple[int, int]] = (),
              fused_shapes: Iterable[tuple[int, int]] = (),
              sliced_shapes: Iterable[tuple[int, int]] = (),
              loss_shapes: Iterable[tuple[int, int]] = ()) -> list[Case]:
    """Every case of the shapes, dtypes and logs, both directions; the strided shapes also fused
    where any shape is fused; the loss shapes once per dtype and direction (no log)."""
    strided_shapes, fused_shapes = list(strided_shapes), list(fused_shapes)
    forms = ([(shape, {}) for shape in shapes] + [(shape, {"strided": True}) for shape in strided_shapes]
             + [(shape, {"sharded": True}) for shape in sharded_shapes]
             + [(shape, {"fused": True}) for shape in fused_shapes]
             + [(shape, {"sliced": True}) for shape in sliced_shapes]
             + [(shape, {"strided": True, "fused": True}) for shape in strided_shapes if fused_shapes])
    dtypes = list(dtypes)
    cases = [Case(rows, cols, dtype, backward, log, **form) for (rows, cols), form in forms for dtype in dtypes
             for log in logs for backward in (False, True)]
    return cases + [Case(rows, cols, dtype, backward, False, loss=True) for rows, cols in loss_shapes
                    for dtype in dtypes for backward in (False, True)]


def case_configs(record: DeviceRecord, case: Case) -> list[tuple[str, KernelConfig]]:
    """``planned_configs``, and where the record rules the split path out (no residency: HIP
    until its wait loops are shown to read memory), the split configurations a record with
    residency would plan: every split kernel is compiled and checked on every target. For
    sharded rows, the planned configuration of each phase of the direction (the role names it),
    as for a sliced configuration. For the loss, the plan's configuration in each of its forms
    (``LOSS_FORMS``: the role names it)."""
    if case.loss:
        return loss_configs(record, case)
    if case.sharded:
        plan = plan_sharded(target_for(record), case.rows, case.cols, case.plan_dtype, backward=case.backward,
                            rows_per_group=case.rows, input_bytes=case.input_bytes)
        return [(phase, plan.config) for phase in variants.SHARDED_PHASES if phase.startswith(case.direction)]
    found = planned_configs(record, case)
    if not record.residency_guaranteed:
        waiting = dataclasses.replace(record, residency_guaranteed=True)
        found += [(f"{role}, unplanned", config) for role, config in planned_configs(waiting, case)
                  if config.regime == "split"]
    # A sliced config runs two kernels: the role names the phase.
    phased: list[tuple[str, KernelConfig]] = []
    for role, config in found:
        if config.regime != variants.SLICED:
            phased.append((role, config))
        elif not any(c == config for _, c in phased):
            phased += [(phase, config) for phase in variants.phases(case.direction)]
    return phased


def loss_form(role: str) -> str:
    """The form (``LOSS_FORMS``) a loss role compiles."""
    return role.split(LOSS_ALTERNATIVE)[0]


def loss_plan_options(case: Case, form: str) -> dict[str, Any]:
    """``plan_loss``'s options for a loss case in ``form``, as ``loss_launch`` passes them."""
    flags = LOSS_FORMS[case.direction][form]
    writes = flags.get("write_grad", False)
    return dict(writes_gradient=writes or case.backward, rows_per_group=case.rows, input_bytes=case.input_bytes,
                rereads=writes and not case.backward, splittable=not case.backward, align=case.align,
                column_loads=flags.get("weight", False) and flags.get("smoothing", False),
                softcap=flags.get("softcap", False))


def loss_configs(record: DeviceRecord, case: Case) -> list[tuple[str, KernelConfig]]:
    """The configurations of a loss case, by role: the plan's in each form, and where its forward
    may split, every split form the plan picks between from compiled occupancy (persistent or
    ticketed, pipelined or not: ``ticketed_forms``) and the loop it streams through where the
    split grid does not fit. Where the record rules the split path out (HIP until its wait loops
    are shown to read memory), the split forms a record with residency would plan ("unplanned"):
    every split kernel is compiled and checked on every target. The forward alone plans its
    exchange by arrival on every target (``Tuning.loss_arrival``); its waiting forms, which that
    switch turned off plans, are its alternatives."""
    found: list[tuple[str, KernelConfig]] = []
    resident = record if record.residency_guaranteed else dataclasses.replace(record, residency_guaranteed=True)
    suffix = "" if record.residency_guaranteed else ", unplanned"
    for form in LOSS_FORMS[case.direction]:
        options = loss_plan_options(case, form)
        planned = plan_loss(record, case.rows, case.cols, case.plan_dtype, **options).config
        found.append((form, planned))
        split = plan_loss(resident, case.rows, case.cols, case.plan_dtype, **options).config
        if split.regime != "split":
            continue
        per_thread = split_elements_per_thread(tuning_for(resident), options["column_loads"], options["softcap"])
        # As the loss planner forms it: unpipelined where this Triton does not build the gradient's
        # pipelined form or the form loads class weights under smoothing, the whole loop where its
        # rows take it (``KernelConfig.whole``).
        primary = loss_split_form(resident, case.rows, case.cols, align=case.align, arrival=False,
                                  writes_gradient=options["writes_gradient"], per_thread=per_thread,
                                  column_loads=options["column_loads"])
        others = [("split", primary)]
        if "forward" in tuning_for(resident).split_tickets:
            others += [("ticketed", ticketed) for ticketed in ticketed_forms(resident, primary, case.cols, False,
                                                                             case.input_bytes, per_thread)]
        if primary.num_stages > 1:
            others.append(("unpipelined", dataclasses.replace(primary, num_stages=1)))
        others.append(("loop", plan_loss(record, case.rows, case.cols, case.plan_dtype,
                                         **{**options, "splittable": False}).config))
        seen = {planned}
        for kind, config in others:
            if config not in seen:
                seen.add(config)
                found.append((f"{form}{LOSS_ALTERNATIVE}{kind}{suffix if kind != 'loop' else ''}", config))
    return found


def planned_configs(record: DeviceRecord, case: Case) -> list[tuple[str, KernelConfig]]:
    """The configurations a launch of ``case`` may use: the plan's, its ticketed form where the
    tuning table allows one in its direction (the plan picks between them from the compiled
    occupancy), its unpipelined form where the plan's is pipelined (taken where programs would
    get too few items), its no-split fallback, for tiles the taller ones that may fill the waves
    better (``Tuning.tile_wave_fill``), and the dense form of each tile that the plan would take
    (``planner.dense_form``), else its flat form (``planner.flat_form``), each also in its form for
    a program per tile."""
    common = dict(backward=case.backward, rows_per_group=case.rows, align=case.align,
                  input_bytes=case.input_bytes, strided=case.strided, causal=case.causal, sliceable=not case.fused)
    primary = select_config(record, case.rows, case.cols, case.plan_dtype, **common)
    found = [("primary", primary)]
    # (Windowed tiles hold one row: the wave fill takes no taller ones, ``planner.plan_launch``.)
    if primary.regime == "tile" and not primary.reread and primary.align == 1 and tuning_for(record).tile_wave_fill:
        for factor in TALLER_TILES:
            if primary.block_m * factor <= next_power_of_2(case.rows):
                found.append((f"taller x{factor}", dataclasses.replace(primary, block_m=primary.block_m * factor)))
    found = _tile_forms(record, case, found)
    if primary.regime == "split":
        if case.direction in tuning_for(record).split_tickets:
            forms = ticketed_forms(record, primary, case.cols, case.backward, case.input_bytes)
            found += [("ticketed" if form.block_n == primary.block_n else "ticketed, narrower", form)
                      for form in forms]
        if primary.num_stages > 1:
            found.append(("unpipelined", dataclasses.replace(primary, num_stages=1)))
        # A fallback tile (rows short enough to hold: a split through windows) in the forms its plan takes.
        found += _tile_forms(record, case, [("fallback", select_config(record, case.rows, case.cols, case.plan_dtype,
                                                                        allow_split=False, **common))])
    return found


def _tile_forms(record: DeviceRecord, case: Case,
                found: list[tuple[str, KernelConfig]]) -> list[tuple[str, KernelConfig]]:
    """``found`` and, for tiles, the dense form of each that the plan would take
    (``planner.dense_form``), else its flat form (``planner.flat_form``), each also in its form
    for a program per tile."""
    found = found + [(f"{role}, dense", dataclasses.replace(config, dense=True)) for role, config in found
                     if dense_form(record, config, case.rows, case.cols, case.rows, case.narrow, case.backward)]
    found += [(f"{role}, flat", dataclasses.replace(config, flat=True)) for role, config in found
              if not config.dense and flat_form(record, config, case.rows, case.rows, case.narrow, case.backward)
              and not dense_form(record, config, case.rows, case.cols, case.rows, case.narrow, case.backward)]
    if found[0][1].regime == "tile":
        found += [(f"{role}, per tile", dataclasses.replace(config, per_tile=True)) for role, config in found]
    return found


def variant_spec(target: Target, record: DeviceRecord, config: KernelConfig, case: Case,
                 role: str = "") -> dict[str, Any]:
    """Everything a worker needs to compile one variant (plain data: it crosses a process); for
    sharded rows and sliced configs ``role`` is the phase (``case_configs``)."""
    if case.loss:
        kernel, args, constexprs = loss_arguments(config, case, role, tuning_for(record).split_wait_atomic,
                                                  record.dependent_launch)
    elif case.sharded or config.regime == variants.SLICED:
        kernel, args, constexprs = sharded_arguments(config, case, role)
    else:
        kernel, args, constexprs = launch_arguments(config, case, tuning_for(record).split_wait_atomic)
    return {
        "target": [target.backend, target.arch, target.warp_size],
        "kernel": kernel,
        "args": [list(a) for a in args],
        "constexprs": constexprs,
        "options": _options(target, config),
    }


def _options(target: Target, config: KernelConfig) -> dict[str, Any]:
    from portable_softmax import compat

    # As the launch asks on a device with cooperative launch (both recorded GPU families).
    return variants.options(config, config.num_warps, compat.COOPERATIVE_LAUNCH)


def launch_arguments(config: KernelConfig, case: Case, wait_atomic: bool = True) -> tuple[str, tuple, dict]:
    """The kernel, its non-constexpr arguments as (type, divisible by 16 or constant value) pairs,
    and its constexprs, as the launch would pass them for ``case`` (both from ``variants``).

    The row view of ``case``'s tensors: one group (outer stride 0), ``Case.tensor_strides``;
    pointers 16-byte aligned.
    """
    pointer = POINTER_TYPES[case.dtype]
    # The fused variants' mask and scale: the input stands in where the call is not fused.
    types = {"mask": "*i1"} if case.fused else {}
    args: list[tuple[str, Any]] = [(types.get(name, pointer), True)
                                   for name in variants.tensor_names(case.direction, config.regime)]
    if config.regime == "split":
        args += [(f"*{kind}", True) for _, kind in variants.SCRATCH]
    form = {**FUSED_FORM, "causal": case.causal} if case.fused else {}
    facts = variants.CallFacts(case.log, case.dtype == "float64", wait_atomic, case.shifted, **form)
    for value in variants.scalar_arguments(config, 1, case.rows, case.cols, case.tensor_strides,
                                           _fused_scalars(case)):
        if isinstance(value, float):  # Triton specialises no float
            args.append(("fp32", False))
            continue
        kind = _int_type(value)
        args.append((kind, value) if kind == "constexpr" else (kind, value % 16 == 0))
    return variants.kernel_name(case.direction, config.regime), tuple(args), variants.constexprs(config, facts)


def sharded_arguments(config: KernelConfig, case: Case, phase: str) -> tuple[str, tuple, dict]:
    """``launch_arguments`` for the ``phase`` kernel of rows sharded across ranks, or of a sliced
    config (``strided_planner._sliced_config``: the same kernels): the partials are float32 (float64 with
    float64 data), indexed by part and row."""
    pointer = POINTER_TYPES[case.dtype]
    stats = POINTER_TYPES["float64" if case.dtype == "float64" else "float32"]
    args: list[tuple[str, Any]] = [(stats if t == "stats" else pointer, True) for t in variants.SHARDED_TENSORS[phase]]
    strides = variants.phase_strides(case.direction, phase, case.tensor_strides)
    for value in variants.sharded_scalar_arguments(phase, config, 1, case.rows, case.cols, strides, SHARDED_RANKS):
        kind = _int_type(value)
        args.append((kind, value) if kind == "constexpr" else (kind, value % 16 == 0))
    constexprs = variants.sharded_constexprs(phase, config, case.log, case.dtype == "float64", SHARDED_RANKS)
    return variants.sharded_kernel_name(phase), tuple(args), constexprs


def loss_arguments(config: KernelConfig, case: Case, role: str, wait_atomic: bool = True,
                   dependent: bool = False) -> tuple[str, tuple, dict]:
    """``launch_arguments`` for a cross-entropy kernel in the form ``role`` names (``loss_form``),
    as ``loss_launch`` passes them: the logits and their gradient [rows, cols] contiguous, class
    targets int64 and the per-position tensors (loss rows, lse, the incoming gradient of 'none')
    one value a row (column stride 0), the weights and stats in the accumulation's dtype; a split
    kernel's scratch, and its wait's read (``wait_atomic``); the forward's instructions that
    overlap launches where the target has them (``dependent``)."""
    pointer = POINTER_TYPES[case.dtype]
    accumulation = POINTER_TYPES[case.plan_dtype]
    types = {"target": "*i64", "weight": accumulation, "stats": accumulation, "loss": accumulation,
             "lse": accumulation}
    args: list[tuple[str, Any]] = [(types.get(name, pointer), True) for name in variants.LOSS_TENSORS[case.direction]]
    if config.regime == "split":
        args += [(f"*{kind}", True) for _, kind in variants.SCRATCH]
    row = case.cols if case.rows > 1 else 0
    per_position = (0, 1 if case.rows > 1 else 0, 0)
    strides = [(0, row, 1) if name in ("x", "grad") else per_position
               for name in variants.loss_row_tensors(case.direction)]
    for value in variants.loss_scalar_arguments(config, 1, case.rows, case.cols, strides, (-100,)):
        kind = _int_type(value)
        args.append((kind, value) if kind == "constexpr" else (kind, value % 16 == 0))
    facts = variants.LossFacts(acc_fp64=case.dtype == "float64", wait_atomic=wait_atomic,
                               dependent=variants.loss_dependent(case.direction, dependent),
                               **LOSS_FORMS[case.direction][loss_form(role)])
    if case.direction == "forward" and variants.loss_sums(config, facts):
        # The grid's sum: the loss itself, of the logits' dtype (``loss_rows._launch``).
        args[variants.LOSS_TENSORS["forward"].index("loss")] = (pointer, True)
    return (variants.loss_kernel_name(case.direction, config.regime), tuple(args),
            variants.loss_constexprs(case.direction, config, facts))


def _fused_scalars(case: Case) -> tuple[Any, ...]:
    """``variants.FUSED_SCALARS`` of a fused case, seen as (A, 16 heads, queries, keys): a scale
    of one value per row, a padding mask of one row of keys per A (``FUSED_FORM``); strided, as
    (rows, length): a scale per row, a mask along the length shared by the rows."""
    if not case.fused:
        return variants.NO_FUSION
    if case.strided:
        return (1.0, 1, case.rows, 0, 0, 0, 1, 0, 0, 1)
    heads, queries = 16, case.cols
    return (1.0, heads, queries, case.cols, 0, 0, 1, heads * queries, queries, 1)


def _int_type(value: int) -> str:
    """How ``kernel[grid](...)`` specialises an integer argument (Triton 3.3 to 3.9)."""
    if value == 1:
        return "constexpr"
    if -2**31 <= value < 2**31:
        return "i32"
    if -2**63 <= value < 2**63:
        return "i64"
    return "u64"


def _spec_key(spec: dict[str, Any]) -> str:
    return json.dumps(spec, sort_keys=True)


def _cost(spec: dict[str, Any]) -> int:
    c = spec["constexprs"]
    return c["BLOCK_M"] * c["BLOCK_N"] * (2 if "backward" in spec["kernel"] else 1)
