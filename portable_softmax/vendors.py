"""The built-in backends: NVIDIA (cuda), AMD (hip), Huawei Ascend (npu) and the CPU interpreter.

Each turns its driver's raw property dictionary (``triton.runtime.driver.active.utils.
get_device_properties``) into a :class:`DeviceRecord` and states its occupancy rule. The key sets
differ by driver: CUDA reports no per-SM thread limit, HIP reports ``arch`` and
``max_threads_per_sm``, triton-ascend reports core counts only. Limits a driver does not report
come from the per-architecture tables below, which are data, not code paths.
"""
from __future__ import annotations

import dataclasses
import math
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from portable_softmax import compat
from portable_softmax.backend import Backend, register_backend
from portable_softmax.record import DeviceRecord, KernelResources, Tuning, both_directions

# Per-SM limits CUDA's driver dictionary lacks, by compute capability (CUDA programming guide,
# "Technical Specifications per Compute Capability"). Unknown architectures fall back to the
# smallest value of the table so a guarantee of residency errs on the safe side.
CUDA_MAX_THREADS_PER_SM = {70: 2048, 72: 2048, 75: 1024, 80: 2048, 86: 1536, 87: 2048, 89: 1536,
                           90: 2048, 100: 2048, 103: 2048, 110: 2048, 120: 1536, 121: 1536}
CUDA_MAX_BLOCKS_PER_SM = {70: 32, 72: 32, 75: 16, 80: 32, 86: 16, 87: 16, 89: 24,
                          90: 32, 100: 32, 103: 32, 110: 32, 120: 24, 121: 24}
# Registers are allocated to a warp in units of 256, and warps to an SM's four schedulers alike;
# each block reserves 1 KiB of shared memory (sm_80+).
CUDA_REGISTER_ALLOCATION_UNIT = 256
CUDA_WARP_ALLOCATION_GRANULARITY = 4
# ptxas caps registers per thread in steps of 8, at most 255; a cap under 32 only buys spills.
CUDA_REGISTER_GRANULE = 8
CUDA_MAX_REGISTERS_PER_THREAD = 255
CUDA_MIN_REGISTER_CAP = 32
CUDA_SHARED_MEMORY_RESERVED_PER_BLOCK = 1024
CUDA_GRID_LIMIT = 2**31 - 1
CUDA_COOPERATIVE_LAUNCH_MIN_CAPABILITY = 60
# Programmatic dependent launch (``griddepcontrol``): PTX ISA 7.8, sm_90 and newer.
CUDA_DEPENDENT_LAUNCH_MIN_CAPABILITY = 90

HIP_GRID_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class HipUnitLimits:
    """What bounds the waves resident on one SIMD of an AMD chip, and how SIMDs make a unit.

    Attributes:
        max_waves_per_simd: waves a SIMD holds at most.
        vgprs_per_simd: VGPRs per lane of one SIMD's register file, in the wave size Triton
            compiles for (wave64 on gfx9, wave32 on gfx10+).
        vgpr_granule: a wave's VGPRs are allocated in multiples of this.
        sgprs_per_simd: SGPRs a SIMD shares among its waves; 0 where each wave has its own.
        simds_per_unit: SIMDs per unit of ``DeviceRecord.compute_units``.
        max_workgroups_per_unit: workgroups of more than one wave a unit holds (each takes a
            barrier); one-wave workgroups take none.
        residency_domains: ``DeviceRecord.residency_domains``.
    """

    max_waves_per_simd: int
    vgprs_per_simd: int
    vgpr_granule: int
    sgprs_per_simd: int
    simds_per_unit: int
    max_workgroups_per_unit: int
    residency_domains: int


# Occupancy on AMD as the HIP runtime computes it (ROCm clr, hipamd/src/hip_platform.cpp,
# ihipOccupancyMaxActiveBlocksPerMultiprocessor, which also judges a cooperative launch): waves
# per SIMD are the least of the maximum (8 on gfx9, 16 on gfx10+), vgprsPerSimd over the
# kernel's VGPRs rounded up to the allocation granule, and sgprsPerSimd over its SGPRs rounded up
# to 16 (rocclr/device/rocm/rocdevice.cpp: 800 on gfx8-9, unlimited on gfx10+, where each wave
# has its own); programs per unit are SIMDs x waves per SIMD / waves per program.
# vgprsPerSimd and the granule are the ISA's TotalNumVGPRs and VGPRAllocGranule, as LLVM states
# them (AMDGPUBaseInfo.cpp getTotalNumVGPRs, getVGPRAllocGranule): 512 in granules of 8 where the
# architectural and accumulation registers share one file (FeatureGFX90AInsts: gfx90a, gfx94x,
# gfx950); 1536 in granules of 24 in wave32 on chips with 1.5x the VGPRs (Feature1_5xVGPRs:
# gfx1100, gfx1101; gfx1200 and gfx1201 by their 384 KiB VGPR file per CU in ROCt's
# hsakmt get_vgpr_size_per_cu); 1024 in granules of 16 in wave32 on the other gfx10.3+ chips.
# A kernel's VGPRs are its code object's .vgpr_count, which the runtime reads as usedVGPRs_ and
# which LLVM already gives as the unified total where the file is shared (AMDGPUMCExpr
# TotalNumVGPRs: the architectural VGPRs rounded up to 4, i.e. .amdhsa_accum_offset, plus the
# AGPRs: a gfx942 tl.dot probe with 256 VGPRs and 18 AGPRs reports 274); adding .agpr_count
# would count them twice.
# SIMDs per unit: 4 per CU on gfx9; on gfx10+ Triton's kernels run in WGP mode (its default
# wgp_cu_mode), where the runtime counts WGPs as units (multiProcessorCount halved) and gives a
# WGP mode kernel 2 x 2 SIMDs. Workgroups per unit: LLVM's getMaxWorkGroupsPerCU (16 barriers per
# CU, 32 per WGP in WGP mode; never the tighter bound here, 32 waves / 2 and 64 / 2, but kept as
# the hardware's). Residency domains: MI300X, MI325X and MI355X deal workgroups round-robin to 8
# XCDs, each with only its own CUs (ROCm/composable_kernel#3652 remaps MI300 workgroups for it;
# iree-org/wave#1001 models MI350's dealing over 8 XCDs of 32 CUs); 8 is also the
# safe side for the parts and partition modes with fewer (MI300A: 6; CPX: 1), whose XCDs have as
# many CUs or more than compute_units / 8.
_CDNA2 = HipUnitLimits(max_waves_per_simd=8, vgprs_per_simd=512, vgpr_granule=8, sgprs_per_simd=800,
                       simds_per_unit=4, max_workgroups_per_unit=16, residency_domains=1)
_CDNA3 = dataclasses.replace(_CDNA2, residency_domains=8)
_RDNA_1_5X_VGPRS = HipUnitLimits(max_waves_per_simd=16, vgprs_per_simd=1536, vgpr_granule=24, sgprs_per_simd=0,
                                 simds_per_unit=4, max_workgroups_per_unit=32, residency_domains=1)
_RDNA_10_3 = dataclasses.replace(_RDNA_1_5X_VGPRS, vgprs_per_simd=1024, vgpr_granule=16)
HIP_UNIT_LIMITS = {
    "gfx90a": _CDNA2,
    "gfx940": _CDNA3, "gfx941": _CDNA3, "gfx942": _CDNA3, "gfx950": _CDNA3,
    "gfx1030": _RDNA_10_3, "gfx1031": _RDNA_10_3, "gfx1032": _RDNA_10_3, "gfx1102": _RDNA_10_3,
    "gfx1103": _RDNA_10_3, "gfx1150": _RDNA_10_3,
    "gfx1100": _RDNA_1_5X_VGPRS, "gfx1101": _RDNA_1_5X_VGPRS, "gfx1200": _RDNA_1_5X_VGPRS,
    "gfx1201": _RDNA_1_5X_VGPRS,
}
# Architectures not in the table, by family: limits no larger than any chip of the family has
# (gfx9: gfx908's 256 VGPRs per SIMD, in gfx90a's coarser granule, and 8 domains; gfx10+: 1024
# VGPRs in the coarsest granule), so that a guarantee of residency errs on the safe side.
HIP_FAMILY_LIMITS = {
    9: dataclasses.replace(_CDNA3, vgprs_per_simd=256),
    10: dataclasses.replace(_RDNA_10_3, vgpr_granule=24),
}
# SGPRs are allocated in multiples of 16 on gfx8-9 (clr's alignUp(usedSGPRs_, 16)).
HIP_SGPR_GRANULE = 16

# triton-ascend reports core counts only; the rest is per chip family.
ASCEND_UNIFIED_BUFFER_BYTES = {"Ascend910B": 196608, "Ascend910_93": 196608, "Ascend310P": 262144}
ASCEND_GRID_LIMIT = 65535


def _lookup(table: Mapping[int, int], arch: int) -> int:
    return table.get(arch, min(table.values()))


def _cuda_normalize(raw: Mapping[str, Any], arch: Any, name: str) -> DeviceRecord:
    capability = int(arch)
    return DeviceRecord(
        backend="cuda",
        name=name,
        arch=f"sm_{capability}",
        warp_size=int(raw["warpSize"]),
        compute_units=int(raw["multiprocessor_count"]),
        registers_per_unit=int(raw["max_num_regs"]),
        shared_memory_per_unit=int(raw["max_shared_mem"]),
        max_threads_per_unit=_lookup(CUDA_MAX_THREADS_PER_SM, capability),
        max_programs_per_unit=_lookup(CUDA_MAX_BLOCKS_PER_SM, capability),
        grid_limit=CUDA_GRID_LIMIT,
        supports_fp64=True,
        supports_bf16=capability >= 80,
        residency_guaranteed=True,
        # cuLaunchCooperativeKernel needs compute capability 6.0 or newer (CUDA programming guide,
        # "Grid Synchronization"); Triton's CUDA driver does not report the attribute.
        cooperative_launch=capability >= CUDA_COOPERATIVE_LAUNCH_MIN_CAPABILITY,
        dependent_launch=capability >= CUDA_DEPENDENT_LAUNCH_MIN_CAPABILITY,
        # Not in Triton's property set: device.py asks torch for a live device, a profile holds it.
        l2_cache_bytes=int(raw["l2_cache_bytes"]) if raw.get("l2_cache_bytes") else None,
    )


def _shared_memory_fit(available: int | None, used: int, reserved: int = 0) -> int | None:
    if not used or not available:
        return None
    return available // (used + reserved)


def _cuda_register_warps(record: DeviceRecord, registers: int) -> int:
    """Warps an SM can hold at ``registers`` per thread: warps take registers in units of 256, and
    an SM hands them out per scheduler (four per SM), so the count is a multiple of four."""
    per_warp = math.ceil(registers * record.warp_size / CUDA_REGISTER_ALLOCATION_UNIT) * CUDA_REGISTER_ALLOCATION_UNIT
    return record.registers_per_unit // (per_warp * CUDA_WARP_ALLOCATION_GRANULARITY) * CUDA_WARP_ALLOCATION_GRANULARITY


def _cuda_occupancy(record: DeviceRecord, kernel: KernelResources) -> int:
    """Resident blocks per SM: the tightest of threads, blocks, registers and shared memory."""
    threads = kernel.num_warps * record.warp_size
    limits = [record.max_threads_per_unit // threads, record.max_programs_per_unit]
    if kernel.registers:
        limits.append(_cuda_register_warps(record, kernel.registers) // kernel.num_warps)
    shared = _shared_memory_fit(record.shared_memory_per_unit, kernel.shared_memory, CUDA_SHARED_MEMORY_RESERVED_PER_BLOCK)
    if shared is not None:
        limits.append(shared)
    return max(0, min(limits))


def _cuda_fit_options(record: DeviceRecord, num_warps: int, programs: int) -> dict[str, Any]:
    """``maxnreg``: the most registers per thread that still let ``programs`` blocks share an SM."""
    if not record.registers_per_unit or programs < 1:
        return {}
    cap = CUDA_MAX_REGISTERS_PER_THREAD // CUDA_REGISTER_GRANULE * CUDA_REGISTER_GRANULE
    while cap >= CUDA_MIN_REGISTER_CAP and _cuda_register_warps(record, cap) < programs * num_warps:
        cap -= CUDA_REGISTER_GRANULE
    return {"maxnreg": cap} if cap >= CUDA_MIN_REGISTER_CAP else {}


def _hip_arch(raw: Mapping[str, Any], arch: Any) -> str:
    # gcnArchName carries feature flags: "gfx942:sramecc+:xnack-".
    return str(raw.get("arch") or arch).split(":")[0]


def _gfx_family(gfx: str) -> int:
    """gfx942 -> 9, gfx1100 -> 11: the major version (the last two characters are minor, stepping)."""
    digits = gfx[3:-2]
    return int(digits) if digits.isdigit() else 0


def hip_unit_limits(gfx: str) -> HipUnitLimits:
    """The occupancy limits of an AMD architecture; its family's safe side where it is not listed."""
    found = HIP_UNIT_LIMITS.get(gfx)
    if found is not None:
        return found
    return HIP_FAMILY_LIMITS[10 if _gfx_family(gfx) >= 10 else 9]


def _hip_normalize(raw: Mapping[str, Any], arch: Any, name: str) -> DeviceRecord:
    gfx = _hip_arch(raw, arch)
    limits = hip_unit_limits(gfx)
    warp_size = int(raw["warpSize"])
    # ROCm 7 reports the whole register file per unit in regsPerBlock, ROCm 6 and older only the
    # addressable 256 VGPRs x 4 SIMDs x 64 lanes: the larger is right for both.
    register_file = limits.vgprs_per_simd * limits.simds_per_unit * warp_size
    return DeviceRecord(
        backend="hip",
        name=name,
        arch=gfx,
        warp_size=warp_size,
        compute_units=int(raw["multiprocessor_count"]),
        registers_per_unit=max(int(raw["max_num_regs"]), register_file),
        shared_memory_per_unit=int(raw["max_shared_mem"]),
        max_threads_per_unit=int(raw["max_threads_per_sm"]),
        max_programs_per_unit=None,
        grid_limit=HIP_GRID_LIMIT,
        supports_fp64=True,
        supports_bf16=True,
        # No split path on AMD until its wait loop is shown, in the compiled AMDGCN of every split
        # variant, to read memory on every trip (the compile report does so now), and the split
        # path has run on an AMD GPU: Triton 3.6+ turns the volatile loads it used into buffer
        # loads without the volatile bit, LLVM hoists them out of the loop, and a program that
        # found a peer's slot empty would spin forever. The loop regime never waits on another.
        residency_guaranteed=False,
        # Triton 3.9's HIP driver reports it; device.py asks the runtime where a driver does not.
        # A dictionary without it (an old recording) claims no cooperative launch.
        cooperative_launch=bool(raw.get("cooperativeLaunch", 0)),
        residency_domains=limits.residency_domains,
    )


def _round_up(value: int, granule: int) -> int:
    return -(-value // granule) * granule


def _hip_waves_per_simd(limits: HipUnitLimits, kernel: KernelResources) -> int:
    """Waves of ``kernel`` one SIMD holds: the least of the maximum, its VGPRs and its SGPRs."""
    waves = [limits.max_waves_per_simd]
    if kernel.registers:
        waves.append(limits.vgprs_per_simd // _round_up(kernel.registers, limits.vgpr_granule))
    if kernel.sgprs and limits.sgprs_per_simd:
        waves.append(limits.sgprs_per_simd // _round_up(kernel.sgprs, HIP_SGPR_GRANULE))
    return min(waves)


def _hip_occupancy(record: DeviceRecord, kernel: KernelResources) -> int:
    """Resident programs per CU (WGP on gfx10+) by the HIP runtime's rule: SIMDs x waves per SIMD
    over the program's waves, within the unit's workgroup, thread and LDS limits."""
    limits = hip_unit_limits(record.arch)
    programs = [limits.simds_per_unit * _hip_waves_per_simd(limits, kernel) // kernel.num_warps]
    if kernel.num_warps > 1:
        programs.append(limits.max_workgroups_per_unit)
    if record.max_threads_per_unit:
        programs.append(record.max_threads_per_unit // (kernel.num_warps * record.warp_size))
    shared = _shared_memory_fit(record.shared_memory_per_unit, kernel.shared_memory)
    if shared is not None:
        programs.append(shared)
    return max(0, min(programs))


def _ascend_family(arch: str) -> str:
    for family in ASCEND_UNIFIED_BUFFER_BYTES:
        if arch.startswith(family):
            return family
    return ""


def _npu_normalize(raw: Mapping[str, Any], arch: Any, name: str) -> DeviceRecord:
    chip = str(arch)
    vector_cores = int(raw.get("num_vectorcore") or 0) or int(raw["num_aicore"])
    return DeviceRecord(
        backend="npu",
        name=name,
        arch=chip,
        warp_size=0,
        compute_units=vector_cores,
        registers_per_unit=None,
        # triton-ascend's max_shared_mem is a placeholder (1); the unified buffer is what bounds a block.
        shared_memory_per_unit=ASCEND_UNIFIED_BUFFER_BYTES.get(_ascend_family(chip)),
        max_threads_per_unit=None,
        max_programs_per_unit=1,
        grid_limit=ASCEND_GRID_LIMIT,
        supports_fp64=False,
        supports_bf16=True,
        residency_guaranteed=False,
    )


def _one_per_unit(record: DeviceRecord, kernel: KernelResources) -> int:
    return 1


def _interpreter_normalize(raw: Mapping[str, Any], arch: Any, name: str) -> DeviceRecord:
    return DeviceRecord(
        backend="interpreter",
        name=name or platform.processor() or platform.machine() or "cpu",
        arch="cpu",
        warp_size=1,
        compute_units=os.cpu_count() or 1,
        registers_per_unit=None,
        shared_memory_per_unit=None,
        max_threads_per_unit=None,
        max_programs_per_unit=1,
        grid_limit=CUDA_GRID_LIMIT,
        supports_fp64=True,
        supports_bf16=True,
        # The interpreter runs programs one after another: a program waiting on another never returns.
        residency_guaranteed=False,
    )


# ----------------------------------------------------------------------------------------------
# Tuning rows: each backend's numbers for the planner (record.Tuning), beside its rules.
# ----------------------------------------------------------------------------------------------

# A program per tile from 3 programs per unit forward and 2 backward, measured on the H200 only
# (NOTES v12): rows of 8192 gain 0.04-0.10 of copy in both dtypes and directions; the bf16 forward
# of 16384, 2 programs per unit, reads 0.90 per tile against 0.92 on the looping grid.
_CUDA_TILE_LOOP = {"forward": 3, "backward": 2}

# Rows read twice where a column reads 4 bytes, measured on the H200 only: of 16384 (NOTES v10),
# fp32 forward 0.90 -> 0.95 of copy, bf16 backward 0.99 -> 1.02 (fp16, the same bytes, not
# measured); in the kernels' dense form (NOTES v13), bf16 backward of 4096 1.02 -> 1.05 and of
# 32768 0.97 -> 1.03, where rows of 8192 read 1.01 against 1.02-1.03 held. Elsewhere twice-read
# tiles were level or lower: bf16 forward (twice the exponentials) 0.69-0.84, fp32 backward of
# 16384-32768 0.87-0.96.
_CUDA_REREAD = {("forward", 4): frozenset({16384}), ("backward", 4): frozenset({4096, 16384, 32768})}

# Held tiles in the kernels' dense form too, measured on the H200 only (NOTES v13, three passes):
# rows of 128-256 gain 0.02-0.08 of copy (bf16 32768x128 backward 1.01-1.07 -> 1.10-1.17, fp32
# 32768x128 forward 0.93-0.95 -> 0.99-1.04); rows of 1024-16384 level.
_CUDA_DENSE = frozenset({"forward", "backward"})

# CUDA's split wait re-reads its slots with a volatile load: ptxas keeps ``ld.volatile`` in the
# loop (the compile report checks the SASS), where a relaxed atomic costs a shared-memory broadcast
# and a barrier per trip (Triton issues an atomic once per element and hands its result to the
# threads that replicate it) and, in the called wait of pipelined kernels, shared memory that
# overlaps the pipeline's buffers (NOTES v9).
_CUDA_WAIT_ATOMIC = False

# Tiles held whole get a register cap for two 32-KB tiles per SM (NOTES v20): the channel tile of
# (64, 1024, 32, 32) bf16 (16 x 1024, 16 warps, 85 registers) ran one program per SM, 25%
# occupancy with 45% of its stalls on loads (Nsight Compute, H100); capped at 64 registers, no
# spills, two: 0.62 -> 0.79 of copy forward on the H100, 0.48 -> 0.64 on the H200. The other
# strided cases and contiguous tiles of 1024-16384 level on both.
_CUDA_TILE_FIT_BYTES = 65536

# Split tiles of bf16 (and fp16) backward rows up to 64 rows wide (128-byte pieces of each line)
# where a program then reads at most 512 exchange slots (NOTES v21): the 1024-channel NCHW
# backward 0.62 -> 0.74 of copy on the H200; wider forward tiles lost (1000 channels fp32 0.79 ->
# 0.74, the transposed bf16 forward 0.46 -> 0.33), and long columns keep 16 rows (their chunks
# are many).
_CUDA_STRIDED_SPLIT_ROWS = {("backward", 2): 64}

# Split tiles of 16 chunks or more by ticket (NOTES v22): the bf16 column of (32768, 1024), 16-row
# tiles of 32 and 64 chunks that hold 64 KB a unit (persistent under split_ticket_bytes), 0.49 /
# 0.52 -> 0.53 / 0.58 of copy on the H100 (0.40 / 0.45 -> 0.43 / 0.49 on the H200, v21). Fewer
# chunks keep their grid: the 1024-channel NCHW backward (8 chunks) fell 0.85 -> 0.82 ticketed.
_CUDA_STRIDED_TICKET_CHUNKS = 16

# bf16 and fp16 forward reductions along a strided dimension from 4096 long in slices, two
# launches (NOTES v23, H100 run 3, one pass): the (32768, 1024) column 0.53 -> 0.56 of copy,
# (16384, 2048) 0.56 -> 0.60, the transposed (4096, 8192) input 0.56 -> 0.58. Their backward keeps
# the split tiles there (0.58 -> 0.57, 0.62 -> 0.59 sliced), and so does float32 (0.75 / 0.71 ->
# 0.59 / 0.45). Other CUDA chips take this row unmeasured.
_CUDA_STRIDED_SLICES = {("forward", 2): 4096}

# Pipelined split grids measured on the H200 only (NOTES v9): the bf16 backward of long rows
# gains up to 0.09 of copy, the forward 0.01-0.02; windowed rows and few rows lose.
#
# The loss's forward alone streamed (each program its rows, blocks reduced within a thread, NOTES
# v34) in blocks of 8192 at 8 warps rather than split by arrival (NOTES v37, H200, Triton 3.6,
# one run): bf16 rows of 128256-256000 0.70-0.78 -> 0.93-0.99 of the copy floor, 8192x32000
# 0.64 -> 0.76; float32 0.92-1.01 -> 1.02-1.07. Blocks of 4096 read 0.82-0.87 in bf16, 8192 at 4
# warps 0.89-0.92, 16384 0.91-0.94. Other CUDA chips (the H100) take it unmeasured.
_CUDA_LOSS_STREAM = dict(loss_split=frozenset({"gradient"}), loss_alone_chunk=8192, loss_loop_warps=8)
# The loss's split rows of more than 16 chunks without the whole loop (``Tuning.loss_whole_chunks``;
# NOTES v47, H200, Triton 3.6, bf16 forward + backward): 4096x256000 (32 chunks) fits 5 programs an
# SM, 1.24 -> 1.16 ms; 4096x151936 (19) 0.687 -> 0.683; rows of 16 keep it (8192x128256 at 5 an SM
# without it 1.20 ms, with it at 4 1.11). The H100 takes it unmeasured.
_CUDA_LOSS_WHOLE_CHUNKS = 16
# The loss's gradient rows read through windows in chunks of 4096 (``Tuning.loss_window_chunk``;
# NOTES v48, H200, bf16 forward + backward): 8192x32001 0.60 -> 0.73 of the floor, 4096x32001 0.59
# -> 0.72 (at 10 programs an SM, as 4096x50257's chunks of 4096, which its padding picked before).
# The H100 takes it unmeasured.
_CUDA_LOSS_WINDOW_CHUNK = 4096
# The loss's gradient rows keep their chunks whatever their last chunk pads
# (``Tuning.loss_max_padding``; NOTES v49, H200, graph-timed, bf16 forward + backward, aligned
# rows in chunks of 8192: 4096x50304 0.250 -> 0.241 ms, 8192x50304 0.478 -> 0.463, 4096x57600
# 0.288 -> 0.272, float32 level; NOTES v51, rows through windows in chunks of 4096: 8192x28671
# 0.402 -> 0.293, 8192x32767 0.379 -> 0.332, float32 2%). The H100 takes it unmeasured.
_CUDA_LOSS_MAX_PADDING = 1.0
# Float32 split rows whose window needs a chunk more than the row keep their chunks whatever it
# pads (``Tuning.window_max_padding``; NOTES v51, H200, the softmax, forward / backward of copy:
# 8192x28671 0.91 / 0.99 -> 0.96 / 1.02, 8192x32767 0.91 / 0.99 -> 0.95 / 1.00, 16384x16383
# 0.87 / 0.83 -> 0.94 / 0.98). bf16 rows keep halving (8192x32767 forward 0.82 against 0.78
# unhalved, 4096x65535 0.85 against 0.80). The H100 takes it unmeasured.
_CUDA_WINDOW_MAX_PADDING = {4: 1.0}
# Split rows read through windows halve their chunks to 2048 at the narrowest
# (``Tuning.window_min_chunk``; NOTES v51, H200, bf16 softmax forward / backward of copy, rows
# that had been held tiles or twice-read ones: 16384x16383 0.61 / 0.87 -> 0.81 / 0.96, 8192x9000
# 0.62 / 0.89 -> 0.80 / 0.96, 4096x8193 0.59 / 0.84 -> 0.76 / 0.92). The H100 takes it unmeasured.
_CUDA_WINDOW_MIN_CHUNK = 2048
# bf16 and fp16 tiles of one row off 16-byte boundaries read through aligned windows at 32
# elements a thread (``Tuning.tile_windows``, ``window_tile_elements_per_thread``), and their
# backward rows of 2048 columns or more split through the split path's windows
# (``window_split_cols``). NOTES v52, H200, one A/B run, bf16 forward / backward of copy, element
# by element -> windows: 4096x4095 0.79 / 0.70 -> 0.96 / 0.86, 16384x3001 0.74 / 0.53 -> 0.90 /
# 0.91, 8192x2049 0.58 / 0.53 -> 0.71 / 0.78, 4096x6001 0.62 / 0.82 -> 0.81 / 0.94, 4096x8191 0.68
# / 0.80 -> 0.90 / 0.90, 4096x1025 0.67 / 0.91 -> 0.78 / 1.05, 32768x1023 0.81 / 0.89 -> 0.97 /
# 1.01, 8192x2047 0.80 / 0.90 -> 0.95 / 1.01; aligned rows level. float32 forward rows of more
# than 2048 columns too: 8192x2049 0.84 -> 0.96, 4096x6001 0.80 -> 0.94, 4096x8191 0.87 -> 0.96,
# 16384x3001 0.98 -> 0.96; shorter ones and the backward lost or held level (4096x781 1.01 / 1.08
# -> 0.94 / 1.03, 4096x1025 0.94 / 1.07 -> 0.89 / 1.02). At the tiles' own warps the windows'
# edges (two reductions more across 8-16 warps) lost forward (bf16 16384x3001 0.64), and windowed
# twice-read backward tiles read 0.46-0.77. The H100 takes it unmeasured.
_CUDA_TILE_WINDOWS = dict(tile_windows={("forward", 2): 0, ("backward", 4): 0, ("forward", 4): 2049},
                          window_tile_elements_per_thread=32, window_split_cols={("backward", 4): 2048})
# The backward's masked one-group tiles in the flat form (no group division, int32 offsets;
# NOTES v33, v37, H200, profiler, bf16 rows of 781): 1823 rows 3.2 -> 3.0 us a kernel, FlagGems'
# 3.0; 4096 rows 5.3 -> 5.1, FlagGems' 7.8. The forward's flat form is not measured.
CUDA_TUNING = replace(Tuning(), split_pipelined=frozenset({"forward", "backward"}), reread_cols=_CUDA_REREAD,
                      tile_wave_fill=0.85, tile_loop_occupancy=_CUDA_TILE_LOOP, dense_tiles=_CUDA_DENSE,
                      split_wait_atomic=_CUDA_WAIT_ATOMIC, tile_fit_bytes=_CUDA_TILE_FIT_BYTES,
                      strided_split_rows=_CUDA_STRIDED_SPLIT_ROWS, strided_split_slots=512,
                      strided_ticket_chunks=_CUDA_STRIDED_TICKET_CHUNKS, strided_slices=_CUDA_STRIDED_SLICES,
                      loss_gradient_pipelined=compat.LOSS_GRADIENT_PIPELINES, flat_tiles=frozenset({"backward"}),
                      loss_whole_chunks=_CUDA_LOSS_WHOLE_CHUNKS, loss_window_chunk=_CUDA_LOSS_WINDOW_CHUNK,
                      loss_max_padding=_CUDA_LOSS_MAX_PADDING, window_max_padding=_CUDA_WINDOW_MAX_PADDING,
                      window_min_chunk=_CUDA_WINDOW_MIN_CHUNK,
                      **_CUDA_LOSS_STREAM, **_CUDA_TILE_WINDOWS)
# No residency on Ascend: long rows stream through the unified buffer in 8K chunks; one program per
# vector core. The loss's forward alone streams too: triton-ascend 3.2.0 does not lower its split
# kernel by arrival (PHASE 3: `triton-adapter-opt` exits 1 at the reduction's linalg.yield,
# `ci/ascend_lowering.py`, 2026-11-28), whose other phases it lowers.
NPU_TUNING = replace(Tuning(), tile_elements=8192, row_elements=8192, loop_chunk=8192, max_warps=1, tile_waves=1,
                     tile_loop_occupancy=both_directions(2**31 - 1), loss_arrival=False)
# The interpreter runs one numpy operation per tile, so bigger tiles and few programs are fastest.
# Every call served under enable(): CPU is served only where named, to run the kernels.
INTERPRETER_TUNING = replace(Tuning(), tile_elements=65536, row_elements=65536, loop_chunk=16384, max_warps=1,
                             max_programs=4, tile_waves=1, enable_min_bytes=0)


# The H200: the H100's chip with 1.4 times its memory bandwidth wants more bytes in flight per SM
# while split programs wait (Little's law). Six 32-KB fp32 chunks per SM instead of five (NOTES
# v19, two sweeps): fp32 (256, 151936) 0.85 -> 0.89 of copy forward, 4096x262144 0.90 -> 0.95,
# 32x128256 0.84 -> 0.88; bf16 32x128256 backward 0.87 -> 0.84; the rest level. On the H100 the
# same row was level or lower (32x128256 0.95 -> 0.92 fp32, 0.89 -> 0.85 bf16): not taken there.
#
# Ticketed float32 forward grids in chunks of 4096 (NOTES v21, two passes): the per-row
# temperature's (256, 151936) 0.88 -> 0.91 of copy; the rest of the ticketed float32 rows level
# (0.94-0.97). In persistent grids too, 32x128256 lost (0.93 -> 0.86): ticketed grids only.
#
# Long bf16 and fp16 reductions along a strided dimension in slices, two launches, rather than
# held in split tiles (NOTES v23, same run): the column softmax of (32768, 1024) bf16 0.43 / 0.49
# -> 0.51 / 0.57 of copy forward / backward, of (16384, 2048) 0.43 / 0.52 -> 0.51 / 0.56; split
# tiles wait on their peers, which the H200's bandwidth makes costlier. float32 columns keep
# their split tiles (0.65 / 0.62 against 0.55 / 0.40 sliced); the H100 slices only the bf16
# forward (above). The bf16 forward from 4096 (run 8): the transposed (4096, 8192) input's
# 0.46 -> 0.51 (four slices; its backward holds whole rows); slices of 256 lost there (0.31).
_H200_STRIDED_SLICES = {("forward", 2): 4096, ("backward", 2): 16384}
# The loss's pipelined forward that writes the gradient at 4 programs a unit (NOTES v31, same
# plans otherwise, one run): bf16 rows of 16 chunks 0.77-0.78 of the floor forward + backward
# against 0.68-0.69 at the 5 that the register cap fits (102 registers), 0.69-0.70 at 3. Rows of
# more chunks leave the whole loop out and take 5 (``_CUDA_LOSS_WHOLE_CHUNKS``, NOTES v47).
#
# The loss's forward alone streamed from 2-byte logits at 5 programs a unit (a register cap: 40
# warps where 4 programs' 64 registers held 32; NOTES v41, H200, two sweeps, bf16; fp16
# unmeasured): 8192x32000 0.82 -> 0.84 of the floor, 4096x50257 0.77 -> 0.80, 4096x151936 0.95 ->
# 0.97, longer rows level (+-0.01); 6 programs lost (0.74-0.89). float32 lost at 5 (0.93-1.04 ->
# 0.84-0.95): not taken.
#
# The forward alone streamed with a program a row where the rows fill 12 waves of resident
# programs or more (NOTES v45, H200, bf16, two runs): 8192x32000 0.89 -> 0.91 of the floor,
# 8192x128256 1.00 -> 1.01, 16384x128256 1.02 -> 1.04; at 4096 rows (6 waves) it lost
# (4096x50257 0.84 -> 0.82, 4096x256000 1.00 -> 0.98), float32 level at 8192 rows.
H200_TUNING = replace(CUDA_TUNING, split_fit_bytes=196608, ticket_chunk={("forward", 4): 4096},
                      strided_slices=_H200_STRIDED_SLICES, loss_gradient_programs_per_unit=4,
                      loss_loop_fit={2: 5}, loss_alone_row_waves=12)

CUDA = register_backend(Backend("cuda", "cuda", "cuda", _cuda_normalize, _cuda_occupancy, _cuda_fit_options,
                                       cooperative_launch=True,
                                       tuning={"*": CUDA_TUNING, "NVIDIA H200": H200_TUNING}))
HIP = register_backend(Backend("hip", "hip", "cuda", _hip_normalize, _hip_occupancy, cooperative_launch=True,
                                      tuning={"*": Tuning()}))
NPU = register_backend(Backend("npu", "npu", "npu", _npu_normalize, _one_per_unit, tuning={"*": NPU_TUNING}))
INTERPRETER = register_backend(Backend("interpreter", "", "cpu", _interpreter_normalize, _one_per_unit, interpreted=True,
                                       tuning={"*": INTERPRETER_TUNING}))
