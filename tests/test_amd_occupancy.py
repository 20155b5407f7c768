"""AMD occupancy by the HIP runtime's rule, cooperative launch in the device record, and the
per-XCD bound on ticketed split rows: over recorded chips and compiled kernels' figures, no GPU."""
from __future__ import annotations

import dataclasses

import pytest

from portable_softmax import amdgcn, compat, crosscompile, device, vendors
from portable_softmax.backend import get_backend
from portable_softmax.targets import plan_launch
from portable_softmax.profiles import load_profile, profile_record
from portable_softmax.record import KernelResources

# Compiled variants of the library's kernels: .vgpr_count, .agpr_count, .sgpr_count and the
# launch's LDS bytes, from `portable-softmax compile --target hip:<arch> --json` (Triton 3.9.0,
# its default shapes) at commit 5529953; `llvm` is the "; Occupancy:" (waves per SIMD) that LLVM
# printed in the same assembly (it agrees with the rule on all 192 variants that five of those
# shapes compile to on these four targets).
# `programs` is computed by hand: VGPRs rounded up to the granule (8 on gfx9x, 24 on gfx1100),
# waves per SIMD = min(max waves, VGPRs per SIMD // that, 800 // SGPRs rounded up to 16 on gfx9),
# programs = 4 SIMDs x waves // warps; `before` is what the tutorial's formula gave.
COMPILED = [
    # arch, variant, vgpr, agpr, sgpr, lds, warps, llvm, programs, before
    # gfx90a: 210 -> 216, 512 // 216 = 2 waves; 4 x 2 // 1 = 8.
    ("gfx90a", "4096x262144 fp32 backward split", 210, 0, 79, 0, 1, 2, 8, 9),
    ("gfx90a", "4096x50257 bf16 backward split", 178, 0, 84, 0, 1, 2, 8, 11),    # 184: 2 waves
    ("gfx90a", "4096x262144 bf16 forward ticketed", 115, 0, 41, 8, 2, 4, 8, 8),  # 120: 4 waves, 16 / 2
    ("gfx90a", "4096x50257 bf16 backward loop", 74, 0, 73, 16, 4, 6, 6, 6),      # 80: 6 waves, 24 / 4
    ("gfx90a", "16384x16384 fp32 forward tile", 36, 0, 48, 64, 16, 8, 2, 2),     # 40: 12 -> 8 waves, 32 / 16
    # gfx942 (the example first): 218 -> 224, 2 waves; 8 programs, not 9.
    ("gfx942", "4096x262144 fp32 backward split", 218, 0, 88, 0, 1, 2, 8, 9),
    ("gfx942", "4096x50257 fp32 forward ticketed", 130, 0, 68, 0, 1, 3, 12, 15),  # 136: 3 waves
    ("gfx942", "4096x262144 fp32 forward ticketed", 134, 0, 57, 8, 2, 3, 6, 7),   # 136: 3 waves, 12 / 2
    ("gfx942", "4096x50257 fp32 backward loop", 82, 0, 75, 16, 4, 5, 5, 6),       # 88: 5 waves, 20 / 4
    ("gfx942", "32768x4096 bf16 backward tile", 49, 0, 67, 16, 4, 8, 8, 8),       # 56: 9 -> 8 waves
    ("gfx942", "4096x50257 fp32 backward split", 220, 0, 102, 0, 1, 2, 8, 9),     # SGPRs 112: 7 waves, VGPRs 2
    # gfx950 (the mi300x profile with gfx950's architecture: a synthetic record).
    ("gfx950", "4096x50257 bf16 forward ticketed", 113, 0, 52, 0, 1, 4, 16, 18),  # 120: 4 waves
    ("gfx950", "4096x262144 bf16 backward split", 178, 0, 72, 0, 1, 2, 8, 11),    # 184: 2 waves
    ("gfx950", "4096x262144 fp32 forward split", 165, 0, 88, 8, 2, 3, 6, 6),      # 168: 3 waves, 12 / 2
    # gfx1100, wave32, WGPs as units (4 SIMDs): 1536 VGPRs per SIMD in granules of 24, SGPRs free.
    ("gfx1100", "4096x50257 bf16 forward split", 137, 0, 56, 8, 2, 10, 20, 22),   # 144: 10 waves, 40 / 2
    ("gfx1100", "4096x50257 fp32 forward split", 146, 0, 65, 8, 2, 9, 18, 21),    # 168: 9 waves, 36 / 2
    ("gfx1100", "4096x262144 fp32 forward split", 145, 0, 58, 16, 4, 9, 9, 10),   # 168: 9 waves, 36 / 4
    ("gfx1100", "4096x262144 fp32 backward split", 209, 0, 62, 8, 2, 7, 14, 14),  # 216: 7 waves, 28 / 2
    ("gfx1100", "16384x16384 bf16 forward tile", 74, 0, 58, 64, 16, 16, 4, 4),    # 96: 16 waves, 64 / 16
    ("gfx1100", "4096x262144 bf16 forward loop", 26, 0, 32, 32, 8, 16, 8, 8),     # 48: 16 waves, 64 / 8
]

# Not the library's kernels: figures that exercise what those leave untested.
CONSTRUCTED = [
    # arch, what, vgpr, agpr, sgpr, lds, warps, programs
    # A tl.dot probe compiled for gfx942 (256 x 128 fp32 accumulator, 4 warps): 256 VGPRs and 18
    # AGPRs, .vgpr_count 274 (LLVM: 1 wave). 280: 1 wave; 4 x 1 // 4 = 1.
    ("gfx942", "unified VGPRs and AGPRs", 274, 18, 48, 0, 4, 1),
    # SGPRs bind on gfx9 only: 102 -> 112, 800 // 112 = 7 waves (VGPRs allow 8).
    ("gfx942", "SGPR-bound", 64, 0, 102, 0, 1, 28),
    ("gfx942", "SGPRs not reported", 64, 0, 0, 0, 1, 32),
    ("gfx1100", "SGPRs free on gfx10+", 64, 0, 102, 0, 1, 64),  # 72: 21 -> 16 waves, 64 / 1
    # One-wave workgroups take no barrier: 32 of them per CU, past the 16 of multi-wave ones.
    ("gfx942", "one-wave workgroups", 28, 0, 47, 0, 1, 32),
    # An architecture the table lacks: gfx9's safe side, 256 VGPRs per SIMD (gfx908's file).
    ("gfx908", "unlisted gfx9", 130, 0, 40, 0, 1, 4),  # 136: 1 wave; 4 x 1 // 1
]


def _record(arch: str):
    return crosscompile.target_record(crosscompile.parse_target(f"hip:{arch}"))[0]


@pytest.mark.parametrize("arch, variant, vgpr, agpr, sgpr, lds, warps, llvm, programs, before", COMPILED,
                         ids=[f"{row[0]} {row[1]}" for row in COMPILED])
def test_compiled_variants_by_the_runtime_rule(arch, variant, vgpr, agpr, sgpr, lds, warps, llvm, programs, before):
    record = _record(arch)
    kernel = KernelResources(registers=vgpr, shared_memory=lds, num_warps=warps, sgprs=sgpr)
    assert vendors.HIP.occupancy(record, kernel) == programs
    # LLVM's own count of waves per SIMD, with 4 SIMDs per CU (per WGP on gfx1100), agrees.
    assert programs == min(4 * llvm // warps, record.max_threads_per_unit // (warps * record.warp_size))
    assert programs <= before


@pytest.mark.parametrize("arch, what, vgpr, agpr, sgpr, lds, warps, programs", CONSTRUCTED,
                         ids=[f"{row[0]} {row[1]}" for row in CONSTRUCTED])
def test_constructed_cases_by_the_runtime_rule(arch, what, vgpr, agpr, sgpr, lds, warps, programs):
    kernel = KernelResources(registers=vgpr, shared_memory=lds, num_warps=warps, sgprs=sgpr)
    assert vendors.HIP.occupancy(_record(arch), kernel) == programs


def test_lds_still_bounds_programs():
    mi300x = profile_record("mi300x")
    # 28 VGPRs allow 32 one-wave programs; 16 KiB of LDS each, 4 in 64 KiB.
    assert vendors.HIP.occupancy(mi300x, KernelResources(28, 16384, 1, sgprs=40)) == 4


# The code object metadata of the gfx942 tl.dot probe above, as Triton 3.9 prints it.
PROBE_METADATA = """
amdhsa.kernels:
  - .agpr_count:     18
    .args:
      - .address_space:  global
    .group_segment_fixed_size: 0
    .private_segment_fixed_size: 8
    .sgpr_count:     48
    .sgpr_spill_count: 0
    .vgpr_count:     274
    .vgpr_spill_count: 2
"""


def test_kernel_resources_count_unified_vgprs_once():
    usage = amdgcn.amdgcn_resources(PROBE_METADATA)
    assert usage == {"vgpr_count": 274, "agpr_count": 18, "sgpr_count": 48, "vgpr_spill_count": 2,
                     "sgpr_spill_count": 0, "private_segment_fixed_size": 8, "group_segment_fixed_size": 0}
    resources = amdgcn.kernel_resources(usage, num_warps=4, shared_memory=512)
    assert resources == KernelResources(registers=274, shared_memory=512, num_warps=4, spills=2, sgprs=48)
    with pytest.raises(RuntimeError, match="vgpr_count"):
        amdgcn.amdgcn_resources(".sgpr_count: 48")


def test_hip_tables_name_the_recorded_chips():
    assert vendors.hip_unit_limits("gfx942").vgprs_per_simd == 512
    assert vendors.hip_unit_limits("gfx1100").vgprs_per_simd == 1536
    # Unlisted: the family's safe side.
    assert vendors.hip_unit_limits("gfx908") == vendors.HIP_FAMILY_LIMITS[9]
    assert vendors.hip_unit_limits("gfx1010") == vendors.HIP_FAMILY_LIMITS[10]
    # The register file the table implies is what ROCm 7 reports (regsPerBlock).
    for name in ("mi300x", "mi250x", "rx7900xtx"):
        assert profile_record(name).registers_per_unit == load_profile(name)["properties"]["max_num_regs"]


# --------------------------------------------------------------------------------------------
# Cooperative launch
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, cooperative", [
    ("mi300x", True), ("mi250x", True), ("rx7900xtx", True), ("h100", True), ("h200", True), ("a100", True),
    ("ascend910b", False),
])
def test_profiles_record_cooperative_launch(name, cooperative):
    assert profile_record(name).cooperative_launch == cooperative
    assert not get_backend("interpreter").normalize({}, "cpu", "cpu").cooperative_launch


def test_hip_dictionary_without_the_property_claims_no_cooperative_launch():
    raw = dict(load_profile("mi300x")["properties"])
    assert vendors.HIP.normalize(raw, "gfx942", "x").cooperative_launch
    raw["cooperativeLaunch"] = 0
    assert not vendors.HIP.normalize(raw, "gfx942", "x").cooperative_launch
    del raw["cooperativeLaunch"]
    assert not vendors.HIP.normalize(raw, "gfx942", "x").cooperative_launch


def test_missing_property_is_asked_of_the_runtime(monkeypatch):
    asked = []

    def ask(index):
        asked.append(index)
        return 0

    monkeypatch.setitem(device._MISSING_PROPERTIES["hip"], "cooperativeLaunch", ask)
    raw = {k: v for k, v in load_profile("mi300x")["properties"].items() if k != "cooperativeLaunch"}
    completed = device._completed("hip", raw, 3)
    assert asked == [3] and completed["cooperativeLaunch"] == 0
    assert device._completed("hip", {**raw, "cooperativeLaunch": 1}, 3)["cooperativeLaunch"] == 1
    assert asked == [3]  # reported by the driver: not asked again
    assert "cooperativeLaunch" not in device._completed("cuda", raw, 0)


def test_runtime_query_without_a_hip_runtime_says_no():
    import torch

    if torch.cuda.is_available() and torch.version.hip is not None:
        pytest.skip("a HIP device is present: its answer is its own")
    assert device._hip_cooperative_launch(0) == 0


def test_live_record_needs_launcher_and_triton_for_cooperative_launch(monkeypatch):
    record = profile_record("mi300x")
    assert device._usable(record, vendors.HIP).cooperative_launch == compat.COOPERATIVE_LAUNCH
    monkeypatch.setattr(compat, "COOPERATIVE_LAUNCH", False)  # Triton 3.2
    assert not device._usable(record, vendors.HIP).cooperative_launch
    monkeypatch.setattr(compat, "COOPERATIVE_LAUNCH", True)
    assert device._usable(record, vendors.HIP).cooperative_launch
    assert not device._usable(record, dataclasses.replace(vendors.HIP, cooperative_launch=False)).cooperative_launch


def _resources_by_config(found: dict):
    """A resources function over compiled figures: (regime, ticketed) -> (vgpr, sgpr, lds, warps)."""
    def resources(config):
        vgpr, sgpr, lds, warps = found[(config.regime, config.ticketed)]
        assert config.num_warps == warps
        return KernelResources(vgpr, lds, warps, sgprs=sgpr)
    return resources


# Compiled gfx942 variants of 32 rows of 128256 fp32, forward: rows of 16 chunks x 8192
# (`portable-softmax compile --target hip:gfx942 --shape 32x128256 --dtype float32 --json`,
# Triton 3.9.0). 512 items are too few for a ticketed grid: the plan is the persistent one.
MI300X_FEW_ROWS = {("split", False): (165, 88, 8, 2), ("split", True): (133, 57, 8, 2), ("loop", False): (33, 46, 16, 4)}


def _with_residency(record):
    """The record as it will be once the split path is allowed on AMD (``vendors._hip_normalize``
    leaves it off until it has run on an AMD GPU): the rules below bound it then."""
    return dataclasses.replace(record, residency_guaranteed=True)


def test_no_persistent_split_without_cooperative_launch():
    mi300x = _with_residency(profile_record("mi300x"))
    resources = _resources_by_config(MI300X_FEW_ROWS)
    persistent = plan_launch(mi300x, 32, 128256, "float32", resources=resources)
    assert (persistent.regime, persistent.ticketed, persistent.programs, persistent.occupancy) == ("split", False, 512, 6)
    without = dataclasses.replace(mi300x, cooperative_launch=False)
    plan = plan_launch(without, 32, 128256, "float32", resources=resources)
    assert plan.regime == "loop" and "without a cooperative launch" in plan.reason
    # A forced grid does not bring the persistent split back.
    assert plan_launch(without, 32, 128256, "float32", resources=resources, programs=512).regime == "loop"
    # A ticketed split needs only its row's chunks resident, so it stays where it fits.
    h200 = dataclasses.replace(profile_record("h200"), cooperative_launch=False)
    four = KernelResources(registers=128, shared_memory=1024, num_warps=4)
    assert plan_launch(h200, 4096, 262144, "float32", resources=four).ticketed


# --------------------------------------------------------------------------------------------
# Ticketed rows within one XCD
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target, domains", [("gfx942", 8), ("gfx950", 8), ("gfx90a", 1), ("gfx1100", 1),
                                             ("gfx908", 8)])
def test_residency_domains_by_architecture(target, domains):
    assert _record(target).residency_domains == domains
    assert profile_record("h100").residency_domains == 1


# Compiled gfx942 variants of 64 rows of 2097152 fp32 (`portable-softmax compile --target
# hip:gfx942 --shape 64x2097152 --dtype float32 --json`, Triton 3.9.0), by direction: forward rows
# of 256 chunks x 8192, backward of 512 x 4096.
MI300X_LONG_ROWS = {
    False: {("split", False): (163, 87, 8, 2), ("split", True): (136, 58, 8, 2), ("loop", False): (33, 46, 16, 4)},
    True: {("split", False): (220, 88, 0, 1), ("split", True): (190, 61, 0, 1), ("loop", False): (47, 50, 16, 4)},
}


@pytest.mark.parametrize("backward", [False, True])
def test_ticketed_rows_fit_one_xcd_on_mi300x(backward):
    """64 rows of 2097152 fp32: forward rows of 256 chunks against 38 CUs x 6 = 228 programs per
    XCD (136 VGPRs, 2 warps), backward 512 against 38 x 8 = 304; both once planned ticketed
    against the whole chip (304 x 6, 304 x 8). Now the persistent split, under a cooperative
    launch, holds every chunk resident."""
    mi300x = _with_residency(profile_record("mi300x"))
    resources = _resources_by_config(MI300X_LONG_ROWS[backward])
    plan = plan_launch(mi300x, 64, 2097152, "float32", backward=backward, resources=resources)
    assert plan.regime == "split" and not plan.ticketed
    assert plan.chunks == (512 if backward else 256)
    assert plan.chunks > mi300x.compute_units // 8 * plan.occupancy
    assert plan.programs <= mi300x.compute_units * plan.occupancy and plan.programs % plan.chunks == 0
    # One domain (as on MI250X): the same row is ticketed again.
    whole = dataclasses.replace(mi300x, residency_domains=1)
    assert plan_launch(whole, 64, 2097152, "float32", backward=backward, resources=resources).ticketed
    # No cooperative launch either: nothing left but the loop.
    alone = dataclasses.replace(mi300x, cooperative_launch=False)
    assert plan_launch(alone, 64, 2097152, "float32", backward=backward, resources=resources).regime == "loop"


def test_ticketed_rows_that_fit_one_xcd_stay_ticketed():
    # 4096 rows of 262144 fp32: 32 chunks of 8192 (134 VGPRs: 6 programs per CU) fit 38 x 6.
    mi300x = _with_residency(profile_record("mi300x"))
    resources = {True: KernelResources(134, 8, 2, sgprs=57), False: KernelResources(166, 8, 2, sgprs=88)}
    plan = plan_launch(mi300x, 4096, 262144, "float32", resources=lambda config: resources[config.ticketed])
    assert plan.ticketed and plan.chunks == 32 and plan.occupancy == 6
