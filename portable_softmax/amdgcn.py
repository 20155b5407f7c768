"""What a compiled AMD kernel occupies, read from the code object metadata in its AMDGCN assembly.

One reader for both places that need it: the cross-compile report (no GPU) and launches on a live
device (``launch.py``), where Triton's HIP driver reports VGPRs (``n_regs``) but not SGPRs, which
also bound occupancy on gfx9 (``vendors._hip_occupancy``).
"""
from __future__ import annotations

import re
from collections.abc import Mapping

from portable_softmax.record import KernelResources

AMDGCN_KEYS = ("vgpr_count", "agpr_count", "sgpr_count", "vgpr_spill_count", "sgpr_spill_count",
               "private_segment_fixed_size", "group_segment_fixed_size")


def amdgcn_resources(asm: str) -> dict[str, int]:
    """The register, spill, scratch and LDS figures of the code object metadata in AMDGCN assembly.

    Raises:
        RuntimeError: the assembly has no ``.vgpr_count`` (not an AMDGCN kernel's).
    """
    found: dict[str, int] = {}
    for key in AMDGCN_KEYS:
        match = re.search(rf"^\s*-?\s*\.{key}:\s+(\d+)\s*$", asm, re.MULTILINE)
        if match:
            found[key] = int(match.group(1))
    if "vgpr_count" not in found:
        raise RuntimeError("no .vgpr_count in the AMDGCN code object metadata")
    return found


def kernel_resources(usage: Mapping[str, int], num_warps: int, shared_memory: int) -> KernelResources:
    """``KernelResources`` from ``amdgcn_resources``' figures, as the HIP runtime counts them.

    ``.vgpr_count`` already holds the accumulation registers where the file is unified (gfx90a,
    gfx94x, gfx950: the architectural VGPRs rounded up to 4, plus ``.agpr_count``), and is what
    ``hipFuncGetAttribute(HIP_FUNC_ATTRIBUTE_NUM_REGS)`` and the runtime's occupancy read; the
    AGPRs are not added again. Spills are the private segment in 32-bit words, as Triton's
    ``n_spills``. ``shared_memory``: the launch's dynamic LDS (``metadata.shared``).
    """
    return KernelResources(registers=usage["vgpr_count"], shared_memory=shared_memory, num_warps=num_warps,
                           spills=usage.get("private_segment_fixed_size", 0) // 4, sgprs=usage.get("sgpr_count", 0))
