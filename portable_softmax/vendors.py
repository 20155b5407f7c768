"""The built-in backends: NVIDIA (cuda), AMD (hip), Huawei Ascend (npu) and the CPU interpreter.

Each turns its driver's raw property dictionary (``triton.runtime.driver.active.utils.
get_device_properties``) into a :class:`DeviceRecord` and states its occupancy rule. The key sets
differ by driver: CUDA reports no per-SM thread limit, HIP reports ``arch`` and
``max_threads_per_sm``, triton-ascend reports core counts only. Limits a driver does not report
come from the per-architecture tables below, which are data, not code paths.
"""
from __future__ import annotations

import math
import os
import platform
from collections.abc import Mapping
from typing import Any

from portable_softmax.backend import Backend, register_backend
from portable_softmax.record import DeviceRecord, KernelResources

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

# CDNA CUs hold 512 VGPRs per lane per SIMD (architectural plus accumulation registers):
# 4 x 64 x 512 = 131072. ROCm 6+ reports that in ``regsPerBlock``; older ROCm reported half, which
# the Triton tutorial doubles. Taking the larger of the two is right for both.
HIP_REGISTERS_PER_CU = {"gfx90a": 131072, "gfx940": 131072, "gfx941": 131072, "gfx942": 131072, "gfx950": 131072}
HIP_GRID_LIMIT = 2**31 - 1

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


def _hip_normalize(raw: Mapping[str, Any], arch: Any, name: str) -> DeviceRecord:
    gfx = _hip_arch(raw, arch)
    registers = max(int(raw["max_num_regs"]), HIP_REGISTERS_PER_CU.get(gfx, 0))
    return DeviceRecord(
        backend="hip",
        name=name,
        arch=gfx,
        warp_size=int(raw["warpSize"]),
        compute_units=int(raw["multiprocessor_count"]),
        registers_per_unit=registers,
        shared_memory_per_unit=int(raw["max_shared_mem"]),
        max_threads_per_unit=int(raw["max_threads_per_sm"]),
        max_programs_per_unit=None,
        grid_limit=HIP_GRID_LIMIT,
        supports_fp64=True,
        supports_bf16=True,
        # No split path on AMD until its wait loop is shown, in the compiled AMDGCN of every split
        # variant, to read memory on every trip: Triton 3.6+ turns the volatile loads it used
        # into buffer loads without the volatile bit, LLVM hoists them out of the loop, and a
        # program that found a peer's slot empty would spin forever (no AMD GPU was run here).
        # The loop regime never waits on another program.
        residency_guaranteed=False,
    )


def _hip_occupancy(record: DeviceRecord, kernel: KernelResources) -> int:
    """The Triton tutorial's rule: waves per CU from registers and the thread limit, per program."""
    max_waves = record.max_threads_per_unit // record.warp_size
    waves = max_waves
    if kernel.registers:
        waves = min(record.registers_per_unit // record.warp_size // kernel.registers, max_waves)
    limits = [waves // kernel.num_warps]
    shared = _shared_memory_fit(record.shared_memory_per_unit, kernel.shared_memory)
    if shared is not None:
        limits.append(shared)
    return max(0, min(limits))


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


CUDA = register_backend(Backend("cuda", "cuda", "cuda", _cuda_normalize, _cuda_occupancy, _cuda_fit_options,
                                       cooperative_launch=True))
HIP = register_backend(Backend("hip", "hip", "cuda", _hip_normalize, _hip_occupancy, cooperative_launch=True))
NPU = register_backend(Backend("npu", "npu", "npu", _npu_normalize, _one_per_unit))
INTERPRETER = register_backend(Backend("interpreter", "", "cpu", _interpreter_normalize, _one_per_unit, interpreted=True))
