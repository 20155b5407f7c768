"""The normalized device record and the resource use of a compiled kernel: the planner's inputs."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class DeviceRecord:
    """One device, in the same terms whatever its vendor.

    Built only by a backend's ``normalize`` from the driver's raw property dictionary; fields the
    driver does not report are ``None`` rather than guesses.

    Attributes:
        backend: registry name of the backend serving the device (``cuda``, ``hip``, ``npu``,
            ``interpreter`` or a plugin's name).
        name: human-readable device name.
        arch: architecture string (``sm_90``, ``gfx942``, ``Ascend910B3``, ``cpu``).
        warp_size: threads per warp / wavefront; 0 where the notion does not apply (Ascend).
        compute_units: SMs, CUs, or Ascend vector cores: the units persistent programs fill.
        registers_per_unit: 32-bit registers per unit, as the occupancy rule counts them.
        shared_memory_per_unit: bytes of shared memory / LDS per unit (the unified buffer on Ascend).
        max_threads_per_unit: resident-thread limit per unit.
        max_programs_per_unit: resident-program (thread block) limit per unit.
        grid_limit: the most programs one launch may have along axis 0.
        supports_fp64: whether kernels may compute in float64 there.
        supports_bf16: whether bfloat16 tensors are supported there.
        residency_guaranteed: whether a grid sized from occupancy is resident all at once, so
            programs may wait on each other (the split-row path).
        cooperative_launch: whether a launch can ask the driver to refuse a grid that is not
            resident all at once. A persistent split grid, whose programs all wait on each other,
            is planned only where it can; ticketed split rows, which need only one row's chunks
            resident, do without. False unless the device says so (and, for a live device, the
            backend's launcher and Triton can pass the request on: ``device.py``).
        residency_domains: the parts of the chip that each run only the programs dealt to them,
            with their own units (MI300X: 8 XCDs, programs dealt round-robin). Programs that
            wait on each other without a cooperative launch must fit one domain's units.
    """

    backend: str
    name: str
    arch: str
    warp_size: int
    compute_units: int
    registers_per_unit: Optional[int]
    shared_memory_per_unit: Optional[int]
    max_threads_per_unit: Optional[int]
    max_programs_per_unit: Optional[int]
    grid_limit: int
    supports_fp64: bool
    supports_bf16: bool
    residency_guaranteed: bool
    # Defaults, so that records built by plugins before these fields existed stay valid: no
    # cooperative launch (so no persistent split grid), and the chip as one residency domain.
    cooperative_launch: bool = False
    residency_domains: int = 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class KernelResources:
    """What one program of a compiled kernel occupies on its unit.

    ``registers`` is per thread and ``shared_memory`` in bytes; 0 means "not reported" (Ascend
    kernels report no registers; the interpreter reports nothing). On AMD, ``registers`` is the
    code object's ``.vgpr_count``: architectural and accumulation VGPRs together where the file is
    unified (gfx90a, gfx94x, gfx950), as the HIP runtime counts them. ``sgprs`` is the scalar
    registers per wave, read from AMD code objects only (0 elsewhere: the rule ignores it).
    """

    registers: int
    shared_memory: int
    num_warps: int
    spills: int = 0
    sgprs: int = 0
