"""Cross-compiled proof without hardware: compile, on a machine without any GPU, every kernel
variant the launch plans use for a set of GPU targets, and report what each binary occupies.

For each target (``cuda:<compute capability>`` or ``hip:<gfx arch>``) the device record comes from
the recorded profile of that chip (``profiles/*.json``); a target without one gets a *synthetic*
record: the nearest recorded chip's properties with the architecture replaced, and the output says
so. For every problem (shape, dtype, direction, softmax or log_softmax) the planner's
``select_config`` names the kernel configuration the launch would use, and also the one it falls
back to when the split-row path cannot be used (not resident, or no scratch during graph
capture). Each distinct variant is compiled with Triton's own compiler for the target, specialised
as ``kernel[grid](...)`` would specialise a launch on contiguous tensors (16-byte aligned pointers,
column stride 1), with ``num_warps`` / ``num_stages`` from the configuration.

Resource use without a driver: NVIDIA register, stack, shared and local (spill) sizes come from
``cuobjdump --dump-resource-usage`` on the cubin; AMD ones from the code object metadata in the
AMDGCN assembly (``.vgpr_count``, ``.sgpr_count``, ``.vgpr_spill_count``,
``.private_segment_fixed_size``, ``.group_segment_fixed_size``). Those numbers go through the same
``plan_launch`` the device layer uses, giving each problem's occupancy and persistent grid.

Each compile runs in a worker process (spawned, without ``TRITON_INTERPRET``) under a timeout, so
a compile that never ends is reported as a timeout instead of hanging the run.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence

from portable_softmax.amdgcn import amdgcn_resources, kernel_resources
from portable_softmax import variants
from portable_softmax.backend import get_backend
from portable_softmax.arguments import parse_shape as _shape
from portable_softmax.planner import (DTYPE_BYTES, TALLER_TILES, KernelConfig, contiguous_align, plan_sharded,
                                      call_windows, input_bytes_per_column, next_power_of_2)
from portable_softmax.targets import dense_form, plan_launch, select_config, target_for, ticketed_forms
from portable_softmax.profiles import load_profile, profile_names
from portable_softmax.record import DeviceRecord, KernelResources
from portable_softmax.tuning import tuning_for

DEFAULT_TARGETS = ("cuda:80", "cuda:90", "cuda:100", "hip:gfx90a", "hip:gfx942", "hip:gfx950", "hip:gfx1100")
DEFAULT_SHAPES = ((32768, 256), (32768, 4096), (16384, 16384), (4096, 50257), (4096, 262144), (32, 128256))
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
# The ranks whose partials the sharded kernels combine, as compiled here.
SHARDED_RANKS = 2
DEFAULT_DTYPES = ("bfloat16", "float32")
DEFAULT_TIMEOUT_S = 600.0

# The recorded chip that stands for each target. Targets not listed get a synthetic record.
TARGET_PROFILES = {
    "cuda:80": "a100",
    "cuda:90": "h100",
    "hip:gfx90a": "mi250x",
    "hip:gfx942": "mi300x",
    "hip:gfx1100": "rx7900xtx",
}

POINTER_TYPES = {"float16": "*fp16", "bfloat16": "*bf16", "float32": "*fp32", "float64": "*fp64"}

_TARGET_FORMS = "cuda:<compute capability> (e.g. cuda:90) or hip:<gfx arch> (e.g. hip:gfx942)"


# --------------------------------------------------------------------------------------------
# Targets and their device records
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A Triton compilation target: ``GPUTarget(backend, arch, warp_size)``."""

    backend: str
    arch: Any  # int compute capability for cuda, "gfx..." for hip
    warp_size: int
    profile: Optional[str] = None  # a recorded chip named explicitly (``cuda:90=h200``)

    @property
    def name(self) -> str:
        return f"{self.backend}:{self.arch}"


def _gfx_family(gfx: str) -> int:
    """gfx942 -> 9, gfx1100 -> 11 (the major version, as Triton's HIP options read it)."""
    return int(gfx[3:-2])


def _gfx_key(gfx: str) -> tuple[int, int]:
    return _gfx_family(gfx), int(gfx[-2:], 16)


def parse_target(text: str) -> Target:
    """``cuda:90`` / ``hip:gfx942`` (optionally ``=profile`` to pick the recorded chip) -> Target.

    Raises:
        ValueError: the string is not such a target, naming the accepted forms.
    """
    spec, _, profile = text.strip().partition("=")
    backend, sep, arch = spec.strip().partition(":")
    backend, arch = backend.strip().lower(), arch.strip().lower()
    known = ", ".join(TARGET_PROFILES)
    if not sep or backend not in ("cuda", "hip"):
        raise ValueError(f"unknown target {text!r}: expected {_TARGET_FORMS}; recorded targets: {known}")
    if backend == "cuda":
        if not arch.isdigit() or not 30 <= int(arch) <= 999:
            raise ValueError(f"unknown target {text!r}: a cuda target names a compute capability as "
                             f"major*10+minor, e.g. cuda:80, cuda:90, cuda:100")
        target = Target("cuda", int(arch), 32)
    else:
        if not re.fullmatch(r"gfx[0-9]{1,2}[0-9a-f]{2}", arch):
            raise ValueError(f"unknown target {text!r}: a hip target names a gfx architecture without "
                             f"feature flags, e.g. hip:gfx90a, hip:gfx942, hip:gfx1100")
        # CDNA (gfx9) runs wave64; RDNA (gfx10+) wave32, as Triton compiles for it.
        target = Target("hip", arch, 32 if _gfx_family(arch) >= 10 else 64)
    if profile:
        profile = profile.strip()
        if profile not in profile_names():
            raise ValueError(f"target {text!r}: unknown device profile {profile!r}; recorded profiles: "
                             f"{', '.join(profile_names())}")
        if load_profile(profile)["target"]["backend"] != target.backend:
            raise ValueError(f"target {text!r}: profile {profile!r} is not a {target.backend} chip")
        target = Target(target.backend, target.arch, target.warp_size, profile)
    return target


def _nearest_profile(target: Target) -> str:
    candidates = [(parse_target(name), profile) for name, profile in TARGET_PROFILES.items()]
    candidates = [(t, p) for t, p in candidates if t.backend == target.backend]
    if target.backend == "cuda":
        def distance(t: Target) -> tuple:
            return abs(t.arch - target.arch), -t.arch
    else:
        def distance(t: Target) -> tuple:
            (family, minor), (own_family, own_minor) = _gfx_key(t.arch), _gfx_key(target.arch)
            return abs(family - own_family), abs(minor - own_minor)
    return min(candidates, key=lambda c: distance(c[0]))[1]


def target_record(target: Target) -> tuple[DeviceRecord, str, Optional[str]]:
    """The device record for ``target``, the profile it comes from, and a note if it is synthetic."""
    name = target.profile or TARGET_PROFILES.get(target.name) or _nearest_profile(target)
    profile = load_profile(name)
    properties = dict(profile["properties"])
    # Named as the live device is, where the profile says: tuning rows may be keyed by that name
    # (the H200's), as ``profiles.profile_record`` names it.
    description = profile.get("device_name", profile["description"])
    recorded = profile["target"]
    note = None
    if str(recorded["arch"]) != str(target.arch):
        note = (f"synthetic record: no recorded {target.name} chip; {name}'s recorded properties "
                f"({recorded['backend']}:{recorded['arch']}) with the architecture replaced by {target.arch}")
        description = f"synthetic {target.name}, from {name} ({profile['description']})"
        if target.backend == "hip":
            properties["arch"] = target.arch
        properties["warpSize"] = target.warp_size
    record = get_backend(target.backend).normalize(properties, target.arch, description)
    return record, name, note


# --------------------------------------------------------------------------------------------
# Problems, the variants they use, and the launch specialisation
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One problem: a contiguous [rows, cols] tensor, softmax over the last dimension; or with
    ``strided`` a contiguous [cols, rows] one, softmax over the first (rows side by side); with
    ``sharded`` a rank's contiguous slice of rows sharded across ranks (``distributed.py``); with
    ``fused`` the fused variants (``_fused_scalars``); with ``sliced`` rows sliced from a padded
    [rows, cols rounded up to SLICED_PADDING] input, the output contiguous."""

    rows: int
    cols: int
    dtype: str
    backward: bool
    log: bool
    strided: bool = False
    sharded: bool = False
    fused: bool = False
    sliced: bool = False

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
        # As launch.py passes it.
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
        function = "log_softmax" if self.log else "softmax"
        over = f"{self.cols}x{self.rows} over dim 0" if self.strided else f"{self.rows}x{self.cols}"
        if self.sharded:
            over = f"{over} sharded"
        if self.fused:
            over = f"{over} fused"
        if self.sliced:
            over = f"{over} sliced"
        return f"{over} {self.dtype} {self.direction} {function}"


def _int_type(value: int) -> str:
    """How ``kernel[grid](...)`` specialises an integer argument (Triton 3.3 to 3.9)."""
    if value == 1:
        return "constexpr"
    if -2**31 <= value < 2**31:
        return "i32"
    if -2**63 <= value < 2**63:
        return "i64"
    return "u64"


def sharded_arguments(config: KernelConfig, case: Case, phase: str) -> tuple[str, tuple, dict]:
    """``launch_arguments`` for the ``phase`` kernel of rows sharded across ranks, or of a sliced
    config (``planner._sliced_config``: the same kernels): the partials are float32 (float64 with
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


def case_configs(record: DeviceRecord, case: Case) -> list[tuple[str, KernelConfig]]:
    """``planned_configs``, and where the record rules the split path out (no residency: HIP
    until its wait loops are shown to read memory), the split configurations a record with
    residency would plan: every split kernel is compiled and checked on every target. For
    sharded rows, the planned configuration of each phase of the direction (the role names it),
    as for a sliced configuration."""
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


def planned_configs(record: DeviceRecord, case: Case) -> list[tuple[str, KernelConfig]]:
    """The configurations a launch of ``case`` may use: the plan's, its ticketed form where the
    tuning table allows one in its direction (the plan picks between them from the compiled
    occupancy), its unpipelined form where the plan's is pipelined (taken where programs would
    get too few items), its no-split fallback, for tiles the taller ones that may fill the waves
    better (``Tuning.tile_wave_fill``), and the dense form of each tile that the plan would take
    (``planner.dense_form``), each also in its form for a program per tile."""
    common = dict(backward=case.backward, rows_per_group=case.rows, align=case.align,
                  input_bytes=case.input_bytes, strided=case.strided, causal=case.causal, sliceable=not case.fused)
    primary = select_config(record, case.rows, case.cols, case.plan_dtype, **common)
    found = [("primary", primary)]
    if primary.regime == "tile" and not primary.reread and tuning_for(record).tile_wave_fill:
        for factor in TALLER_TILES:
            if primary.block_m * factor <= next_power_of_2(case.rows):
                found.append((f"taller x{factor}", dataclasses.replace(primary, block_m=primary.block_m * factor)))
    found += [(f"{role}, dense", dataclasses.replace(config, dense=True)) for role, config in found
              if dense_form(record, config, case.rows, case.cols, case.rows, case.narrow, case.backward)]
    if primary.regime == "tile":
        found += [(f"{role}, per tile", dataclasses.replace(config, per_tile=True)) for role, config in found]
    if primary.regime == "split":
        if case.direction in tuning_for(record).split_tickets:
            forms = ticketed_forms(record, primary, case.cols, case.backward, case.input_bytes)
            found += [("ticketed" if form.block_n == primary.block_n else "ticketed, narrower", form)
                      for form in forms]
        if primary.num_stages > 1:
            found.append(("unpipelined", dataclasses.replace(primary, num_stages=1)))
        found.append(("fallback", select_config(record, case.rows, case.cols, case.plan_dtype, allow_split=False,
                                                **common)))
    return found


def _options(target: Target, config: KernelConfig) -> dict[str, Any]:
    from portable_softmax import compat

    # As the launch asks on a device with cooperative launch (both recorded GPU families).
    return variants.options(config, config.num_warps, compat.COOPERATIVE_LAUNCH)


def variant_spec(target: Target, record: DeviceRecord, config: KernelConfig, case: Case,
                 role: str = "") -> dict[str, Any]:
    """Everything a worker needs to compile one variant (plain data: it crosses a process); for
    sharded rows and sliced configs ``role`` is the phase (``case_configs``)."""
    if case.sharded or config.regime == variants.SLICED:
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


def _spec_key(spec: dict[str, Any]) -> str:
    return json.dumps(spec, sort_keys=True)


# --------------------------------------------------------------------------------------------
# The compile itself (runs in a worker process)
# --------------------------------------------------------------------------------------------


def _nvidia_tool(name: str) -> Optional[str]:
    """``cuobjdump`` or ``nvdisasm``: Triton's bundled copy, else one on PATH or in CUDA's folder."""
    try:
        from triton import knobs

        path = getattr(knobs.nvidia, name).path
        if path and os.path.exists(path):
            return path
    except Exception:  # older Triton: no knobs, or no bundled tool
        pass
    import shutil

    import triton

    bundled = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    for candidate in (bundled, shutil.which(name), f"/usr/local/cuda/bin/{name}"):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def _cuobjdump() -> Optional[str]:
    return _nvidia_tool("cuobjdump")


def cubin_sass(cubin: bytes) -> str:
    """The SASS of a cubin with labels and source lines (``nvdisasm -c -g``)."""
    tool = _nvidia_tool("nvdisasm")
    if tool is None:
        raise RuntimeError("no nvdisasm found (Triton's nvidia backend bin/, PATH, /usr/local/cuda/bin)")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "kernel.cubin")
        with open(path, "wb") as handle:
            handle.write(cubin)
        return subprocess.run([tool, "-c", "-g", path], capture_output=True, text=True, check=True).stdout


def wait_source_lines() -> tuple[str, ...]:
    """``exchange.py:N`` of each of the split kernels' wait loops (the ``while`` in
    ``kernels.exchange._awaited_slots`` and ``_awaited_count``), which the machine code's line
    information names."""
    import inspect

    from portable_softmax.kernels import exchange

    found = []
    for function in (exchange._awaited_slots.fn, exchange._awaited_count.fn):
        lines, first = inspect.getsourcelines(function)
        offset = next(i for i, line in enumerate(lines) if line.lstrip().startswith("while "))
        found.append(f"{os.path.basename(inspect.getsourcefile(function))}:{first + offset}")
    return tuple(found)


def wait_loop_check(backend: str, compiled: Any) -> dict[str, Any]:
    """Whether every wait loop of a compiled split kernel reads memory on each trip, from its
    final machine code (``machine_code``): the count of wait loops found, and the reads in each."""
    from portable_softmax import machine_code

    if backend == "cuda":
        loops = machine_code.sass_loops(cubin_sass(compiled.asm["cubin"]))
    else:
        loops = machine_code.amdgcn_loops(compiled.asm["amdgcn"])
    waits = [loop for line in wait_source_lines() for loop in machine_code.wait_loops(loops, line)]
    return {"wait_loops": len(waits), "wait_loop_reads": [list(loop.reads[:2]) for loop in waits],
            "wait_loop_reads_memory": bool(waits) and all(loop.reads_memory for loop in waits)}


def toolchain_missing(target: Target) -> Optional[str]:
    """Why ``target`` cannot be compiled and read here, or None: what this Triton needs for it
    (``compat.missing_toolchain``), and for NVIDIA targets the cuobjdump that reads the resources."""
    from portable_softmax import compat

    missing = compat.missing_toolchain(target.backend)
    if missing is None and target.backend == "cuda":
        absent = [tool for tool in ("cuobjdump", "nvdisasm") if _nvidia_tool(tool) is None]
        if absent:
            missing = (f"no {' or '.join(absent)} found (Triton's nvidia backend bin/, PATH, /usr/local/cuda/bin) "
                       f"to read the cubins")
    return missing


def cubin_resources(cubin: bytes, kernel: str) -> dict[str, int]:
    """REG, STACK, SHARED, LOCAL, ... of ``kernel`` in a cubin, read with cuobjdump."""
    tool = _cuobjdump()
    if tool is None:
        raise RuntimeError("no cuobjdump found (Triton's nvidia backend bin/, PATH, /usr/local/cuda/bin)")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, f"{kernel}.cubin")
        with open(path, "wb") as handle:
            handle.write(cubin)
        out = subprocess.run([tool, "--dump-resource-usage", path], capture_output=True, text=True, check=True).stdout
    found: dict[str, int] = {}
    in_kernel = False
    for line in out.splitlines():
        if line.strip().startswith("Function "):
            in_kernel = line.strip()[len("Function "):].rstrip(":") == kernel
        elif in_kernel:
            for key, value in re.findall(r"([A-Z]+(?:\[\d+\])?):(\d+)", line):
                found[key] = int(value)
    if "REG" not in found:
        raise RuntimeError(f"cuobjdump reported no resource usage for {kernel!r}:\n{out}")
    return found


def called_shared_memory(llir: str, kernel: Optional[str] = None) -> list[str]:
    """The functions in a kernel's LLVM IR, other than the kernel, that address shared memory.
    Triton 3.6 gives a called function none of its own: what it uses overlaps the caller's,
    pipeline buffers in flight included (a pipelined split kernel gave NaN so, NOTES v9).

    The kernel is the function with a kernel calling convention, or the one named ``kernel``:
    Triton 3.2 marks an NVIDIA kernel only in ``!nvvm.annotations`` (``define void @name``)."""
    found: list[str] = []
    name = None
    for line in llir.splitlines():
        if line.startswith("define "):
            defined = line.split("@", 1)[1].split("(", 1)[0]
            is_kernel = "ptx_kernel" in line or "amdgpu_kernel" in line or defined.strip('"') == kernel
            name = None if is_kernel else defined
        elif name is not None and "global_smem" in line and name not in found:
            found.append(name)
    return found


def compiled_variant(spec: dict[str, Any]) -> tuple[Any, dict[str, str], list[str], list[str]]:
    """``triton.compile`` of one variant for its target: the compiled kernel, its signature, and
    the arguments specialised as divisible by 16 and as equal to 1."""
    import triton
    from triton.backends.compiler import GPUTarget

    from portable_softmax import compat, kernels

    backend, arch, warp_size = spec["target"]
    fn = getattr(kernels, spec["kernel"])
    args = iter(spec["args"])
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    divisible: list[str] = []
    equal_to_1: list[str] = []
    for param in fn.params:
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            constexprs[param.name] = spec["constexprs"][param.name]
            continue
        kind, flag = next(args)
        signature[param.name] = kind
        if kind == "constexpr":  # an integer equal to 1, specialised away like a constexpr
            constexprs[param.name] = flag
            equal_to_1.append(param.name)
        elif flag:
            divisible.append(param.name)
    source = compat.ast_source(fn, signature, constexprs, divisible)
    compiled = triton.compile(source, target=GPUTarget(backend, arch, warp_size), options=dict(spec["options"]))
    return compiled, signature, divisible, equal_to_1


def compile_variant(spec: dict[str, Any]) -> dict[str, Any]:
    """Compile one variant for its target and read its resource use. Runs in a worker process."""
    started = time.perf_counter()
    backend = spec["target"][0]
    compiled, signature, divisible, equal_to_1 = compiled_variant(spec)
    compile_s = time.perf_counter() - started
    name = compiled.metadata.name
    result: dict[str, Any] = {"compile_s": round(compile_s, 2), "shared": int(compiled.metadata.shared),
                              "signature": {k: v for k, v in signature.items() if v != "constexpr"},
                              "specialised": {"divisible_by_16": divisible, "equal_to_1": equal_to_1},
                              "called_shared": called_shared_memory(compiled.asm.get("llir", ""), name)}
    if spec["kernel"].endswith("_split"):
        result.update(wait_loop_check(backend, compiled))
    if backend == "cuda":
        usage = cubin_resources(compiled.asm["cubin"], name)
        # As the driver reports them: n_regs, and n_spills = local bytes / 4, which count the
        # stack frame, where ptxas spills (an H200 read 24, 52, 70 spills for STACK 96, 208, 280
        # bytes and LOCAL 0: benchmarks/probes/spill_count.py, NOTES v21).
        local = usage.get("LOCAL", 0) + usage.get("STACK", 0)
        result.update(registers=usage["REG"], spills=local // 4, static_shared=usage.get("SHARED", 0),
                      detail={k.lower(): v for k, v in usage.items() if k in ("REG", "STACK", "SHARED", "LOCAL")})
    else:
        usage = amdgcn_resources(compiled.asm["amdgcn"])
        # As a live launch reads them (launch._compiled_resources): one rule for both.
        used = kernel_resources(usage, spec["options"]["num_warps"], result["shared"])
        result.update(registers=used.registers, spills=used.spills, sgprs=used.sgprs,
                      static_shared=usage.get("group_segment_fixed_size", 0), detail=usage)
    return result


# --------------------------------------------------------------------------------------------
# Worker processes with a per-compile timeout
# --------------------------------------------------------------------------------------------


def _worker_main(conn: Any) -> None:
    if hasattr(os, "setsid"):
        os.setsid()  # its own process group, so a timeout also ends ptxas / ld.lld children
    import warnings

    warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION.*")
    try:
        import triton  # noqa: F401

        from portable_softmax import kernels  # noqa: F401
    except BaseException:
        conn.send(("broken", None, traceback.format_exc(limit=3)))
        return
    conn.send(("ready", None, None))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        index, spec = message
        # MLIR and LLVM print diagnostics (whole IR dumps) straight to fd 2: keep them out of the
        # report, and quote their error lines when the compile fails.
        with tempfile.TemporaryFile(mode="w+b") as log:
            saved = os.dup(2)
            os.dup2(log.fileno(), 2)
            try:
                result: Any = ("done", index, compile_variant(spec))
            except BaseException as error:  # a compile error is a result, not a worker failure
                result = ("error", index, error)
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
            if result[0] == "error":
                log.seek(0)
                diagnostics = [line.strip() for line in log.read().decode(errors="replace").splitlines()
                               if " error: " in line or line.startswith("error: ")]
                text = str(result[2]).strip()
                text = text if len(text) < 2000 else text[:600] + "\n...\n" + text[-1200:]
                result = ("error", index, "\n".join([f"{type(result[2]).__name__}: {text}", *diagnostics[:4]]))
        conn.send(result)


class _Worker:
    def __init__(self, context: Any) -> None:
        parent, child = context.Pipe()
        self.process = context.Process(target=_worker_main, args=(child,), daemon=True)
        saved = os.environ.pop("TRITON_INTERPRET", None)  # read when a kernel is decorated
        try:
            self.process.start()
        finally:
            if saved is not None:
                os.environ["TRITON_INTERPRET"] = saved
        child.close()
        self.conn = parent
        self.ready = False
        self.task: Optional[int] = None
        self.deadline = time.monotonic()

    def kill(self) -> None:
        pid = self.process.pid
        try:
            os.killpg(pid, signal.SIGKILL)  # the worker's own group (it called setsid)
        except (AttributeError, OSError):
            self.process.kill()
        self.process.join(5)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.process.join(10)
        if self.process.is_alive():
            self.kill()
        else:
            self.conn.close()


def compile_all(specs: Sequence[dict[str, Any]], *, jobs: int = 2, timeout: float = DEFAULT_TIMEOUT_S,
                progress: Optional[Callable[[int, dict[str, Any]], None]] = None) -> list[dict[str, Any]]:
    """Compile ``specs`` in ``jobs`` spawned workers; each result is ``{"status": "ok"|"error"|
    "timeout", ...}``. A compile running past ``timeout`` seconds has its worker killed."""
    import multiprocessing
    from multiprocessing.connection import wait

    context = multiprocessing.get_context("spawn")
    results: list[Optional[dict[str, Any]]] = [None] * len(specs)
    pending = deque(range(len(specs)))
    workers: list[_Worker] = []
    startup_limit = max(timeout, 120.0)

    def finish(index: int, result: dict[str, Any]) -> None:
        results[index] = result
        if progress is not None:
            progress(index, result)

    try:
        while pending or any(w.task is not None for w in workers):
            while len(workers) < min(jobs, len(pending) + sum(w.task is not None for w in workers)):
                worker = _Worker(context)
                worker.deadline = time.monotonic() + startup_limit
                workers.append(worker)
            for worker in workers:
                if worker.ready and worker.task is None and pending:
                    worker.task = pending.popleft()
                    worker.deadline = time.monotonic() + timeout
                    worker.conn.send((worker.task, specs[worker.task]))
            nearest = min(w.deadline for w in workers) - time.monotonic()
            ready = wait([w.conn for w in workers], timeout=None if nearest == float("inf") else max(0.0, nearest))
            for worker in list(workers):
                if worker.conn in ready:
                    try:
                        kind, index, payload = worker.conn.recv()
                    except (EOFError, OSError):
                        code = worker.process.exitcode
                        worker.process.join(5)
                        died = f"compiler process died (exit code {worker.process.exitcode or code})"
                        if worker.task is not None:
                            finish(worker.task, {"status": "error", "error": died})
                        elif not worker.ready and pending:  # died starting: charge a task, so the run ends
                            finish(pending.popleft(), {"status": "error", "error": f"{died} while starting"})
                        workers.remove(worker)
                        worker.conn.close()
                        continue
                    if kind == "ready":
                        worker.ready = True
                        worker.deadline = float("inf")
                    elif kind == "broken":
                        workers.remove(worker)
                        worker.stop()
                        while pending:
                            finish(pending.popleft(), {"status": "error",
                                                       "error": f"compiler process could not start:\n{payload}"})
                    else:
                        status = "ok" if kind == "done" else "error"
                        finish(index, {"status": status, **payload} if status == "ok" else
                               {"status": status, "error": payload})
                        worker.task = None
                        worker.deadline = float("inf")
                elif time.monotonic() >= worker.deadline:
                    if worker.task is not None:
                        finish(worker.task, {"status": "timeout", "error": f"compile ran past {timeout:g} s"})
                    elif pending:  # never became ready
                        finish(pending.popleft(), {"status": "error",
                                                   "error": f"compiler process did not start in {startup_limit:g} s"})
                    workers.remove(worker)
                    worker.kill()
    finally:
        for worker in workers:
            if worker.task is None:
                worker.stop()
            else:
                worker.kill()
    return [r if r is not None else {"status": "error", "error": "not compiled"} for r in results]


# --------------------------------------------------------------------------------------------
# The whole run
# --------------------------------------------------------------------------------------------


def cases_for(shapes: Iterable[tuple[int, int]], dtypes: Iterable[str], logs: Iterable[bool],
              strided_shapes: Iterable[tuple[int, int]] = (),
              sharded_shapes: Iterable[tuple[int, int]] = (),
              fused_shapes: Iterable[tuple[int, int]] = (),
              sliced_shapes: Iterable[tuple[int, int]] = ()) -> list[Case]:
    """Every case of the shapes, dtypes and logs, both directions; the strided shapes also fused
    where any shape is fused."""
    strided_shapes, fused_shapes = list(strided_shapes), list(fused_shapes)
    forms = ([(shape, {}) for shape in shapes] + [(shape, {"strided": True}) for shape in strided_shapes]
             + [(shape, {"sharded": True}) for shape in sharded_shapes]
             + [(shape, {"fused": True}) for shape in fused_shapes]
             + [(shape, {"sliced": True}) for shape in sliced_shapes]
             + [(shape, {"strided": True, "fused": True}) for shape in strided_shapes if fused_shapes])
    return [Case(rows, cols, dtype, backward, log, **form) for (rows, cols), form in forms for dtype in dtypes
            for log in logs for backward in (False, True)]


def _cost(spec: dict[str, Any]) -> int:
    c = spec["constexprs"]
    return c["BLOCK_M"] * c["BLOCK_N"] * (2 if "backward" in spec["kernel"] else 1)


def run(targets: Sequence[Target], cases: Sequence[Case], *, jobs: int = 2, timeout: float = DEFAULT_TIMEOUT_S,
        progress: Optional[Callable[[str], None]] = None) -> dict[str, Any]:
    """Plan, compile and check every variant; the report as plain data (``report["ok"]``). A
    target whose toolchain is missing here (``toolchain_missing``) is not compiled: its report
    says why (``unavailable``), and is not ok."""
    started = time.perf_counter()
    specs: list[dict[str, Any]] = []
    index_of: dict[str, int] = {}
    per_target = []
    unavailable: dict[str, str] = {}
    for target in targets:
        record, profile, note = target_record(target)
        uses = []
        missing = toolchain_missing(target)
        if missing is not None:
            unavailable[target.name] = missing
            per_target.append((target, record, profile, note, uses))
            continue
        for case in cases:
            for role, config in case_configs(record, case):
                spec = variant_spec(target, record, config, case, role)
                key = _spec_key(spec)
                if key not in index_of:
                    index_of[key] = len(specs)
                    specs.append(spec)
                uses.append((case, role, config, index_of[key]))
        per_target.append((target, record, profile, note, uses))

    order = sorted(range(len(specs)), key=lambda i: -_cost(specs[i]))  # the long compiles first
    done = [0]

    def report_progress(position: int, result: dict[str, Any]) -> None:
        done[0] += 1
        if progress is not None:
            spec = specs[order[position]]
            c = spec["constexprs"]
            progress(f"[{done[0]}/{len(specs)}] {spec['target'][0]}:{spec['target'][1]} {spec['kernel']} "
                     f"M={c['BLOCK_M']} N={c['BLOCK_N']} warps={spec['options']['num_warps']}: {result['status']}"
                     f" {result.get('compile_s', '')}")

    ordered = compile_all([specs[i] for i in order], jobs=jobs, timeout=timeout, progress=report_progress)
    compiled = [None] * len(specs)
    for position, index in enumerate(order):
        compiled[index] = ordered[position]

    report_targets = [_target_report(target, record, profile, note, uses, specs, compiled)
                      for target, record, profile, note, uses in per_target]
    for entry in report_targets:
        if entry["target"] in unavailable:
            entry.update(ok=False, unavailable=unavailable[entry["target"]])
    return {
        "ok": all(t["ok"] for t in report_targets),
        "elapsed_s": round(time.perf_counter() - started, 1),
        "compiles": len(specs),
        "timeout_s": timeout,
        "targets": report_targets,
    }


def _target_report(target: Target, record: DeviceRecord, profile: str, note: Optional[str], uses: list,
                   specs: list, compiled: list) -> dict[str, Any]:
    backend = get_backend(record.backend)
    tuning = tuning_for(record)
    limit = record.shared_memory_per_unit
    variants: dict[int, dict[str, Any]] = {}
    for case, role, config, index in uses:
        if index in variants:
            continue
        spec, result = specs[index], compiled[index]
        entry: dict[str, Any] = {
            "id": len(variants) + 1, "target": target.name, "kernel": spec["kernel"],
            "constexprs": spec["constexprs"], "num_warps": config.num_warps, "num_stages": config.num_stages,
            "pointer": spec["args"][0][0], "status": result["status"], "problems": [], "notes": [],
        }
        if result["status"] == "ok":
            resources = KernelResources(registers=result["registers"], shared_memory=result["shared"],
                                        num_warps=config.num_warps, spills=result["spills"],
                                        sgprs=result.get("sgprs", 0))
            occupancy = backend.occupancy(record, resources)
            # Triton's launcher grants dynamic shared memory up to the per-block limit less the static part.
            shared_total = result["shared"] + result["static_shared"]
            entry.update({k: result[k] for k in ("registers", "spills", "shared", "static_shared", "compile_s",
                                                 "signature", "specialised", "detail", "called_shared")})
            if spec["kernel"].endswith("_split"):
                entry.update({k: result[k] for k in ("wait_loops", "wait_loop_reads", "wait_loop_reads_memory")})
                if not result["wait_loop_reads_memory"]:
                    # A variant the planner never launches on this target (HIP plans no split path
                    # yet) is reported, not failed: the report says where the split path would hang.
                    found = (f"a wait loop does not read memory ({result['wait_loops']} wait loops found): a "
                             f"program waiting on an empty slot would spin forever")
                    unplanned = all(role.endswith("unplanned") for _, role, _, i in uses if i == index)
                    (entry["notes"] if unplanned else entry["problems"]).append(found)
            if result["called_shared"]:
                entry["problems"].append(f"called functions use shared memory: {', '.join(result['called_shared'])}")
            entry.update(shared_limit=limit, shared_ok=limit is None or shared_total <= limit, occupancy=occupancy)
            entry["resources"] = resources
            if not entry["shared_ok"]:
                entry["problems"].append(f"shared memory {result['shared']} + static {result['static_shared']} "
                                         f"bytes exceeds the {limit}-byte limit of {target.name}")
            if occupancy < 1:
                entry["problems"].append("occupancy 0: one program does not fit a unit")
        else:
            entry["error"] = result.get("error", "")
            entry["problems"].append(f"{result['status']}: {entry['error'].splitlines()[0] if entry['error'] else ''}")
        variants[index] = entry

    # The compiled resources of each configuration a case may use, as launch.py's resources() gives them.
    by_case: dict[Case, dict[KernelConfig, KernelResources]] = {}
    for case, role, config, index in uses:
        if "resources" in variants[index]:
            by_case.setdefault(case, {})[config] = variants[index]["resources"]

    plans = []
    for case, role, config, index in uses:
        variant = variants[index]
        row = {"case": case.label(), "rows": case.rows, "cols": case.cols, "dtype": case.dtype,
               "direction": case.direction, "log": case.log, "role": role, "variant": variant["id"],
               "regime": config.regime, "block_m": config.block_m, "problems": []}
        compiled_for_case = by_case.get(case, {})
        if case.sharded:
            # Streamed like the loop regime: no program waits on another, so any grid is safe.
            row["note"] = "sharded rows: streamed, no program waits on another"
        elif config in compiled_for_case:
            plan = plan_launch(record, case.rows, case.cols, case.plan_dtype, backward=case.backward,
                               rows_per_group=case.rows, allow_split=role != "fallback", align=case.align,
                               resources=lambda c, found=compiled_for_case: found[c],
                               input_bytes=case.input_bytes, narrow=case.narrow, strided=case.strided,
                               causal=case.causal)
            if plan.config != config:
                # Another configuration serves the case: the ticketed, persistent or unpipelined
                # form, or the fallback where the split grid does not fit resident (each has its
                # own row).
                row["note"] = f"not used: {plan.reason}"
            else:
                resident = record.compute_units * plan.occupancy
                # Persistent split programs wait on each other: the whole grid must be resident at
                # once. Ticketed split, tile and loop programs never wait on one that has not
                # started, so the planner may queue up to tile_waves waves, or give each tile or
                # item a program (None: no bound).
                waves: Optional[int] = 1 if config.regime == "split" else tuning.tile_waves
                if config.per_tile or config.ticketed:
                    waves = None
                row.update(programs=plan.programs, occupancy=plan.occupancy, resident_limit=resident,
                           compute_units=record.compute_units, waves=round(plan.programs / max(resident, 1), 2),
                           allowed_waves=waves, reason=plan.reason)
                if waves is not None and plan.programs > resident * waves:
                    row["problems"].append(f"{plan.programs} programs exceed {waves} wave(s) of "
                                           f"{record.compute_units} units x occupancy {plan.occupancy}")
                # A ticketed row's chunks wait on each other: they must fit one residency domain.
                domain_units = record.compute_units // record.residency_domains
                if config.ticketed and config.chunks > domain_units * plan.occupancy:
                    row["problems"].append(f"rows of {config.chunks} chunks exceed one of {record.residency_domains} "
                                           f"residency domains: {domain_units} units x occupancy {plan.occupancy}")
        else:
            row["problems"].append(f"variant {variant['id']} did not compile")
        plans.append(row)

    variant_list = sorted(variants.values(), key=lambda v: v["id"])
    for v in variant_list:
        v.pop("resources", None)
    ok = not any(v["problems"] for v in variant_list) and not any(p["problems"] for p in plans)
    return {"target": target.name, "warp_size": target.warp_size, "profile": profile, "synthetic": note,
            "record": record.to_dict(), "ok": ok, "unavailable": None, "variants": variant_list, "plans": plans}


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


# Triton's backend (``triton.backends.backends``) that compiles for each target kind.
TRITON_BACKENDS = {"cuda": "nvidia", "hip": "amd"}

# A kernel as small as kernels come, compiled in a worker process to learn whether Triton's AMD
# backend takes a gfx architecture: the list lives in its C++ ("unsupported target: 'gfx999'").
_PROBE = """
import sys
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from portable_softmax import compat


@triton.jit
def probe(x_ptr):
    tl.store(x_ptr, tl.load(x_ptr) + 1.0)


backend, arch, warp_size = sys.argv[1], sys.argv[2], int(sys.argv[3])
target = GPUTarget(backend, int(arch) if backend == "cuda" else arch, warp_size)
triton.compile(compat.ast_source(probe, {"x_ptr": "*fp32"}, {}), target=target)
"""
_PROBE_TIMEOUT_S = 300


@functools.lru_cache(maxsize=None)
def _ptxas_architectures(path: str) -> frozenset:
    """The ``sm_*`` names a ptxas takes (its ``--help`` lists them); empty if it cannot be run."""
    try:
        text = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(re.findall(r"'(sm_[0-9]+[a-z]?)'", text))


@functools.lru_cache(maxsize=None)
def _cuda_capabilities() -> Optional[tuple]:
    """Compute capabilities Triton's NVIDIA backend compiles for: its ``sm_arch_from_capability``
    name of each must be one the ptxas it picks for that capability takes. None if unknown."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

        def known(capability: int) -> bool:
            return sm_arch_from_capability(capability) in _ptxas_architectures(get_ptxas(capability).path)

        names = _ptxas_architectures(get_ptxas(80).path) | _ptxas_architectures(get_ptxas(90).path)
        return tuple(sorted(c for c in {int(re.sub(r"[a-z]$", "", n)[3:]) for n in names} if known(c))) or None
    except Exception:  # noqa: BLE001  (no ptxas, another Triton layout: the compile itself will say)
        return None


@functools.lru_cache(maxsize=None)
def _probe(backend: str, arch: str, warp_size: int) -> Optional[str]:
    """Why Triton cannot compile a trivial kernel for the target, or None if it can (or the probe
    could not finish: the compile itself will say)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "probe.py")  # triton.jit reads its function's source file
        with open(script, "w") as handle:
            handle.write(_PROBE)
        try:
            done = subprocess.run([sys.executable, script, backend, arch, str(warp_size)], capture_output=True,
                                  text=True, env=env, timeout=_PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return None
    if done.returncode == 0:
        return None
    # MLIR's "<file>:<line>:<col>: error: unsupported target: 'gfx999'", else the last error line.
    errors = re.findall(r"error:\s*(.+)", done.stderr, flags=re.IGNORECASE)
    reasons = [e for e in errors if "unsupported target" in e] or errors[-1:] or [f"exit code {done.returncode}"]
    return reasons[0].strip()[:300]


def target_problem(target: Target) -> Optional[str]:
    """Why this Triton cannot compile for ``target`` (a sentence), or None if it can."""
    import triton
    import triton.backends

    backend = TRITON_BACKENDS[target.backend]
    if backend not in triton.backends.backends:
        return (f"this Triton ({triton.__version__}) has no {backend!r} backend (installed: "
                f"{', '.join(sorted(triton.backends.backends)) or 'none'})")
    if target.backend == "cuda":
        capabilities = _cuda_capabilities()
        if capabilities is not None:
            if target.arch in capabilities:
                return None
            return (f"Triton {triton.__version__} compiles for compute capabilities "
                    f"{', '.join(map(str, capabilities))} (cuda:{capabilities[0]} to cuda:{capabilities[-1]})")
    reason = _probe(target.backend, str(target.arch), target.warp_size)
    return None if reason is None else f"Triton {triton.__version__} cannot compile for it ({reason})"


def _target(text: str) -> Target:
    try:
        target = parse_target(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    # Refused here, not after a run of compiles that each die (cuda:999 aborted every one).
    problem = target_problem(target)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"target {text!r}: {problem}")
    return target


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", type=_target, action="append",
                        help=f"{_TARGET_FORMS}, optionally =PROFILE to pick the recorded chip; repeat for "
                             f"several (default: {' '.join(DEFAULT_TARGETS)})")
    parser.add_argument("--shape", type=_shape, action="append",
                        help="rows x columns; repeat for several (default: "
                             f"{' '.join(f'{r}x{c}' for r, c in DEFAULT_SHAPES)})")
    parser.add_argument("--strided-shape", type=_shape, action="append",
                        help="rows x length of a reduction along a strided dimension (a softmax over dim 0 "
                             "of a contiguous length x rows tensor); repeat for several (default: "
                             f"{' '.join(f'{r}x{c}' for r, c in DEFAULT_STRIDED_SHAPES)}, unless --shape is given)")
    parser.add_argument("--sharded-shape", type=_shape, action="append",
                        help="rows x a rank's slice of rows sharded across ranks; repeat for several (default: "
                             f"{' '.join(f'{r}x{c}' for r, c in DEFAULT_SHARDED_SHAPES)}, unless --shape is given)")
    parser.add_argument("--fused-shape", type=_shape, action="append",
                        help="rows x keys of the fused variants (a scale tensor, a bool mask, causal); repeat for "
                             f"several (default: {' '.join(f'{r}x{c}' for r, c in DEFAULT_FUSED_SHAPES)}, unless "
                             "--shape is given)")
    parser.add_argument("--sliced-shape", type=_shape, action="append",
                        help=f"rows x length of rows sliced from a vocabulary padded to {SLICED_PADDING}, written "
                             "contiguous (unaligned); repeat for several (default: "
                             f"{' '.join(f'{r}x{c}' for r, c in DEFAULT_SLICED_SHAPES)}, unless --shape is given)")
    parser.add_argument("--dtype", action="append", choices=sorted(DTYPE_BYTES),
                        help=f"repeat for several (default: {' '.join(DEFAULT_DTYPES)})")
    parser.add_argument("--log", action="store_true", help="also compile the log_softmax (LOG=True) variants")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds allowed per compile")
    parser.add_argument("--jobs", type=int, default=max(1, min(os.cpu_count() or 1, 8)),
                        help="compiles at once (default: CPU count, at most 8)")
    parser.add_argument("--json", action="store_true")


def run_command(args: argparse.Namespace) -> int:
    """``portable-softmax compile``: 0 when every variant compiled and fits its target, else 1."""
    targets = args.target or [parse_target(t) for t in DEFAULT_TARGETS]
    logs = (False, True) if args.log else (False,)
    strided = args.strided_shape or (() if args.shape else DEFAULT_STRIDED_SHAPES)
    sharded = args.sharded_shape or (() if args.shape else DEFAULT_SHARDED_SHAPES)
    fused = args.fused_shape or (() if args.shape else DEFAULT_FUSED_SHAPES)
    sliced = args.sliced_shape or (() if args.shape else DEFAULT_SLICED_SHAPES)
    cases = cases_for(args.shape or DEFAULT_SHAPES, args.dtype or DEFAULT_DTYPES, logs, strided, sharded, fused,
                      sliced)
    show = getattr(args, "verbose", False) or sys.stderr.isatty()
    report = run(targets, cases, jobs=max(1, args.jobs), timeout=args.timeout,
                 progress=(lambda line: print(line, file=sys.stderr, flush=True)) if show else None)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_report(report))
    return 0 if report["ok"] else 1


def format_report(report: dict[str, Any]) -> str:
    lines = []
    for t in report["targets"]:
        r = t["record"]
        lines.append(f"== {t['target']} (warp {t['warp_size']}): {r['name']}")
        lines.append(f"   profile {t['profile']}; {r['compute_units']} units in {r['residency_domains']} residency "
                     f"domain(s), {r['registers_per_unit']} registers/unit, shared limit "
                     f"{r['shared_memory_per_unit']} B/program, cooperative launch "
                     f"{'yes' if r['cooperative_launch'] else 'no'}")
        if t["synthetic"]:
            lines.append(f"   NOTE: {t['synthetic']}")
        if t.get("unavailable"):
            lines.append(f"   NOT COMPILED: {t['unavailable']}")
            lines.append(f"   {t['target']}: PROBLEMS")
            lines.append("")
            continue
        lines.append(f"   {'#':>2} {'kernel':<24} {'BLOCK_M':>7} {'BLOCK_N':>7} {'CHUNKS':>6} {'warps':>5} {'ptr':>5} "
                     f"{'regs':>4} {'spill':>5} {'shared':>6} {'static':>6} {'occ':>3} {'compile':>8}  status")
        for v in t["variants"]:
            c = v["constexprs"]
            head = (f"   {v['id']:>2} {v['kernel']:<24} {c['BLOCK_M']:>7} {c['BLOCK_N']:>7} {c.get('CHUNKS', '-'):>6} "
                    f"{v['num_warps']:>5} {v['pointer']:>5} ")
            if v["status"] == "ok":
                notes = [f"spills {v['spills'] * 4} B to memory"] if v["spills"] else []
                if v["detail"].get("agpr_count"):
                    notes.append(f"{v['detail']['agpr_count']} AGPRs")
                if v["detail"].get("sgpr_spill_count"):
                    notes.append(f"{v['detail']['sgpr_spill_count']} SGPRs spilled to VGPR lanes")
                status = "ok" + (f" ({', '.join(notes)})" if notes else "")
                status = "; ".join(v["problems"]) if v["problems"] else status
                if v.get("notes"):
                    status += f" (not planned here: {'; '.join(v['notes'])})"
                lines.append(head + f"{v['registers']:>4} {v['spills']:>5} {v['shared']:>6} {v['static_shared']:>6} "
                                    f"{v['occupancy']:>3} {v['compile_s']:>7.1f}s  {status}")
            else:
                why = " | ".join(line.strip() for line in v.get("error", "").splitlines()[:2])
                lines.append(head + f"{'':>37}  {v['status'].upper()}: {why}")
        lines.append(f"   {'problem':<44} {'role':<8} {'#':>2} {'regime':<6} {'occ':>3} {'programs':>8} "
                     f"{'units x occ':>11} {'waves':>5}")
        for p in t["plans"]:
            if "programs" in p:
                tail = f"{p['occupancy']:>3} {p['programs']:>8} {p['resident_limit']:>11} {p['waves']:>5}"
            elif p.get("note"):
                tail = f"{'':>3} {'':>8} {'':>11} {'':>5}  ({p['note']})"
            else:
                tail = "  not planned"
            if p["problems"]:
                tail += "  " + "; ".join(p["problems"])
            lines.append(f"   {p['case']:<44} {p['role']:<8} {p['variant']:>2} {p['regime']:<6} {tail}")
        lines.append(f"   {t['target']}: {'OK' if t['ok'] else 'PROBLEMS'}")
        lines.append("")
    failed = [t["target"] for t in report["targets"] if not t["ok"]]
    verdict = f"problems on {', '.join(failed)}" if failed else "all variants compiled and fit their targets"
    lines.append(f"{report['compiles']} compiles in {report['elapsed_s']} s: {verdict}")
    return "\n".join(lines)
