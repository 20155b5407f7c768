"""Cross-compiling the kernel variants the plans use, for one NVIDIA and one AMD target, on a
machine without either GPU (``portable_softmax.crosscompile``, ``portable-softmax compile``).

Needs Triton with its nvidia and amd backends (upstream wheels carry both); no device. A target
whose toolchain is missing here is skipped with the reason (``crosscompile.toolchain_missing``):
Triton 3.2 to 3.4 link AMD code with an external ld.lld.
"""
from __future__ import annotations

import pytest

from portable_softmax import cli, crosscompile, kernel_resources
from portable_softmax.crosscompile.cases import loss_configs
from portable_softmax.record import DeviceRecord
from portable_softmax.tuning import tuning_for

# A short tile row (rows packed into 16-row tiles), a long row with few rows, which the plan
# splits across co-resident programs (its no-split fallback is the streaming loop), and an odd
# long row, whose split kernels read aligned windows (ALIGN > 1).
SMALL_TILE = (1024, 256)
# More tiles than the chip holds at once: each gets a program of its own (no wave bound).
MANY_TILES = (32768, 256)
SPLIT_ROW = (64, 65536)
ODD_SPLIT_ROW = (64, 50257)
# Rows of more chunks (48 forward, 96 backward) than a warp has lanes, pipelined on cuda.
LONG_SPLIT_ROW = (4096, 393216)
# A column softmax of a (32768, 1024) tensor: 1024 rows side by side, split into chunks of
# tiles that span adjacent rows (BLOCK_M > 1).
STRIDED_SPLIT = (1024, 32768)
# A rank's slice of rows sharded across ranks (distributed.py): the four streamed kernels.
SHARDED = (64, 75968)
# The fused variants (a scale tensor, a bool mask, causal): rows in tiles, split rows (pipelined on
# cuda) and odd rows split in windows (and their loop fallback).
FUSED = [(64, 2048), SPLIT_ROW, ODD_SPLIT_ROW]
# The odd long row sliced from a padded vocabulary: windows follow the input, the contiguous
# output is written unaligned (SHIFTED).
SLICED = ODD_SPLIT_ROW
TARGETS = ("cuda:90", "hip:gfx942")


@pytest.fixture(scope="module")
def missing():
    """Why each target cannot be compiled here (absent where it can)."""
    reasons = {t: crosscompile.toolchain_missing(crosscompile.parse_target(t)) for t in TARGETS}
    return {t: reason for t, reason in reasons.items() if reason is not None}


@pytest.fixture(scope="module")
def report(missing):
    available = [t for t in TARGETS if t not in missing]
    if not available:
        pytest.skip(f"no target's toolchain here: {missing}")
    cases = crosscompile.cases_for([SMALL_TILE, MANY_TILES, SPLIT_ROW, ODD_SPLIT_ROW, LONG_SPLIT_ROW], ["bfloat16"],
                                   [False], [STRIDED_SPLIT], [SHARDED], FUSED, [SLICED])
    result = crosscompile.run([crosscompile.parse_target(t) for t in available], cases, jobs=2, timeout=300)
    return {t["target"]: t for t in result["targets"]}, result


@pytest.fixture(params=TARGETS)
def target(request, missing, report):
    if request.param in missing:
        pytest.skip(f"{request.param}: {missing[request.param]}")
    return report[0][request.param]


def test_every_variant_compiles(report, target):
    failed = [(v["kernel"], v["constexprs"], v["status"], v.get("error", "")) for v in target["variants"]
              if v["status"] != "ok"]
    assert not failed, f"{target['target']}: variants that did not compile: {failed}"
    kernels = {v["kernel"] for v in target["variants"]}
    expected = {f"softmax_{d}_{r}" for d in ("forward", "backward") for r in ("tile", "split", "loop")}
    expected |= {f"softmax_{phase}" for phase in ("forward_partials", "forward_normalize", "backward_partials",
                                                  "backward_normalize")}
    assert kernels == expected, (f"{target['target']}: the small set should exercise every kernel "
                                 f"(tile, split and its loop fallback, both directions); got {sorted(kernels)}")
    assert report[1]["ok"], crosscompile.format_report(report[1])


def test_fused_variants_compile_in_every_regime(target):
    fused = {(v["kernel"], v["constexprs"].get("ALIGN", 1) > 1) for v in target["variants"]
             if v["constexprs"].get("SCALE") == 2 and v["constexprs"]["MASK"] == 1 and v["constexprs"]["CAUSAL"]}
    kernels = {kernel for kernel, _ in fused}
    assert kernels == {f"softmax_{d}_{r}" for d in ("forward", "backward") for r in ("tile", "split", "loop")}
    assert ("softmax_forward_split", True) in fused and ("softmax_backward_split", True) in fused, "windowed"
    if target["target"].startswith("cuda"):
        pipelined = {v["kernel"] for v in target["variants"] if v["constexprs"].get("SCALE") == 2
                     and v["constexprs"].get("STAGES", 1) > 1}
        assert pipelined == {"softmax_forward_split", "softmax_backward_split"}


def test_fused_variants_compile_for_strided_rows(target):
    """A fused softmax over a strided dimension (a scale tensor and a bool mask) compiles the
    split kernels of several adjacent rows, both directions."""
    tiles = {v["kernel"] for v in target["variants"] if v["kernel"].endswith("_split") and v["status"] == "ok"
             and v["constexprs"]["BLOCK_M"] > 1 and v["constexprs"].get("SCALE") == 2
             and v["constexprs"]["MASK"] == 1 and not v["constexprs"]["CAUSAL"]}
    assert tiles == {"softmax_forward_split", "softmax_backward_split"}


def test_odd_rows_compile_windowed_split_kernels(target):
    """The window code runs only where the split path does (GPUs): here it is at least built."""
    windowed = {v["kernel"] for v in target["variants"] if v["constexprs"].get("ALIGN", 1) == 8 and v["status"] == "ok"}
    assert windowed == {"softmax_forward_split", "softmax_backward_split"}


def test_loss_forward_alone_compiles_a_windowed_loop(missing):
    """The loss's forward alone over odd rows (4096x50257) streams through aligned windows
    (``kernels/loss.py``: ALIGN 8 in bf16, 4 in float32) where it streams: the plan's on cuda, the
    arrival form's loop alternative on hip. Built for each target, its resources read."""
    from portable_softmax.crosscompile.cases import loss_configs

    available = [t for t in TARGETS if t not in missing]
    if not available:
        pytest.skip(f"no target's toolchain here: {missing}")
    specs = []
    for name in available:
        target = crosscompile.parse_target(name)
        record, _, _ = crosscompile.target_record(target)
        for dtype, align in (("bfloat16", 8), ("float32", 4)):
            case = crosscompile.Case(4096, 50257, dtype, False, False, loss=True)
            loops = [(role, config) for role, config in loss_configs(record, case)
                     if config.regime == "loop" and role.startswith("no grad")]
            assert [config.align for _, config in loops] == [align], (name, loops)
            specs += [crosscompile.variant_spec(target, record, config, case, role) for role, config in loops]
    results = crosscompile.compile_all(specs, jobs=2, timeout=300)
    for spec, result in zip(specs, results):
        assert spec["constexprs"]["ALIGN"] > 1 and not spec["constexprs"]["WRITE_GRAD"]
        assert result["status"] == "ok", (spec["target"], spec["constexprs"], result.get("error", ""))
        assert result["registers"] > 0, result


def test_sliced_rows_compile_shifted_split_kernels(target):
    """Rows sliced from a padded vocabulary, written contiguous: the split kernels' unaligned
    output (``kernels.windows._window_store``, both branches) is built in both directions, in windows."""
    shifted = {v["kernel"] for v in target["variants"] if v["constexprs"].get("SHIFTED") and v["status"] == "ok"
               and v["constexprs"]["ALIGN"] == 8}
    assert shifted == {"softmax_forward_split", "softmax_backward_split"}
    plans = [p for p in target["plans"] if "sliced" in p["case"] and "note" not in p]
    assert plans and not any(p["problems"] for p in plans), plans


def test_strided_rows_compile_split_kernels_of_several_rows(target):
    """A reduction along a strided dimension splits tiles of adjacent rows: the split kernels'
    exchange for several rows (``kernels.exchange._gather_tile``) is built, unpipelined, for both
    directions (its wait loop is checked with the others below)."""
    tiles = {v["kernel"] for v in target["variants"] if v["kernel"].endswith("_split") and v["status"] == "ok"
             and v["constexprs"]["BLOCK_M"] > 1 and v["num_stages"] == 1}
    assert tiles == {"softmax_forward_split", "softmax_backward_split"}
    plans = [p for p in target["plans"] if "over dim 0" in p["case"] and "note" not in p]
    assert plans and all(p["block_m"] > 1 and not p["problems"] for p in plans), plans


def test_a_program_per_tile_is_within_the_plan_checks(target):
    """32768 rows of 256 take 8192 tiles: more programs than an H100 holds at once (132 SMs x 32),
    which the report once flagged as exceeding the tile waves."""
    plans = [p for p in target["plans"] if (p["rows"], p["cols"]) == MANY_TILES and "note" not in p]
    assert plans and all(p["allowed_waves"] is None and not p["problems"] for p in plans)
    if target["target"].startswith("cuda"):
        assert all(p["programs"] > p["resident_limit"] for p in plans)


def test_called_functions_use_no_shared_memory(target):
    """Pipelined split kernels call their row wait; Triton gives a called function the caller's
    shared memory, in-flight pipeline buffers included, so it must use none."""
    pipelined = [v for v in target["variants"] if v["kernel"].endswith("_split") and v["num_stages"] > 1]
    if target["target"].startswith("cuda"):
        assert pipelined, "the cuda tuning pipelines the split rows of this set"
    for v in target["variants"]:
        assert v["called_shared"] == [], f"{target['target']} {v['kernel']} {v['constexprs']}: {v['called_shared']}"


def test_every_wait_loop_reads_memory(target):
    """The split kernels' spin-waits, found in the final machine code (SASS, AMDGCN) by the
    source line of their ``while``, re-read memory on every trip: a read hoisted out of the loop
    (AMD's volatile loads on Triton 3.6+) would hang a waiting program."""
    from packaging.version import Version

    from portable_softmax import compat

    split = [v for v in target["variants"] if v["kernel"].endswith("_split")]
    assert {v["kernel"] for v in split} == {"softmax_forward_split", "softmax_backward_split"}
    # Triton 3.2's AMDGCN peels the atomic wait and leaves a loop that re-reads nothing (seen on
    # gfx942): there only the report's note is asked for, since HIP plans no split path.
    lossy = target["target"].startswith("hip") and compat.TRITON_VERSION < Version("3.3")
    for v in split:
        where = (f"{target['target']} {v['kernel']} {v['constexprs']}: {v['wait_loops']} wait loops, reads "
                 f"{v['wait_loop_reads']}")
        assert v["wait_loops"] >= 1, where
        if lossy and not v["wait_loop_reads_memory"]:
            assert v["notes"] and not v["problems"], where
        else:
            assert v["wait_loop_reads_memory"], where


def test_a_hoisted_wait_read_is_caught(missing):
    """The check itself: on AMD with Triton 3.6+, the volatile-load wait loses its read (the hang
    the atomic read prevents), and the report says so; the atomic keeps it."""
    from portable_softmax import compat
    from packaging.version import Version

    if "hip:gfx942" in missing:
        pytest.skip(missing["hip:gfx942"])
    if compat.TRITON_VERSION < Version("3.6"):
        pytest.skip("the volatile read is hoisted on AMD from Triton 3.6 on")
    target = crosscompile.parse_target("hip:gfx942")
    record, _, _ = crosscompile.target_record(target)
    case = crosscompile.Case(*SPLIT_ROW, "bfloat16", False, False)
    config = next(c for role, c in crosscompile.case_configs(record, case) if c.regime == "split")
    found = {}
    for atomic in (False, True):
        spec = crosscompile.variant_spec(target, record, config, case)
        spec["constexprs"]["WAIT_ATOMIC"] = atomic
        found[atomic] = crosscompile.compile_all([spec], jobs=1, timeout=300)[0]
    assert found[False]["status"] == found[True]["status"] == "ok"
    assert found[False]["wait_loops"] >= 1 and not found[False]["wait_loop_reads_memory"]
    assert found[True]["wait_loop_reads_memory"]


def test_called_shared_memory_is_found():
    llir = "\n".join(["define ptx_kernel void @k(ptr %0) {", "  load @global_smem", "}",
                      'define internal fastcc float @"wait"(ptr %0) {', "  store @global_smem", "}",
                      "define internal float @clean(ptr %0) {", "  ret", "}"])
    assert crosscompile.called_shared_memory(llir) == ['"wait"']
    # Triton 3.2 writes an NVIDIA kernel as a plain function, marked in !nvvm.annotations.
    plain = llir.replace("define ptx_kernel void @k", "define void @k")
    assert crosscompile.called_shared_memory(plain) == ["k", '"wait"']
    assert crosscompile.called_shared_memory(plain, "k") == ['"wait"']


def test_registers_read_without_a_driver(target):
    for v in target["variants"]:
        assert v["registers"] > 0, f"{target['target']} {v['kernel']}: no register count read"
        ceiling = 255 if target["target"].startswith("cuda") else 512
        assert v["registers"] <= ceiling, f"{target['target']} {v['kernel']}: {v['registers']} registers?"


def test_no_spills_at_a_small_tile(target):
    rows, cols = SMALL_TILE
    used = {p["variant"] for p in target["plans"] if (p["rows"], p["cols"]) == SMALL_TILE}
    variants = [v for v in target["variants"] if v["id"] in used]
    assert variants and all(v["kernel"].endswith("_tile") for v in variants)
    for v in variants:
        assert v["spills"] == 0, f"{target['target']} {v['kernel']} {v['constexprs']}: {v['spills']} spilled words"
        assert v["detail"].get("vgpr_spill_count", 0) == 0
        assert v["detail"].get("local", 0) == 0


def test_spills_under_a_register_cap_are_counted(missing):
    """ptxas spills to the stack frame, which the driver counts in n_spills (an H200: STACK 96,
    208, 280 bytes read 24, 52, 70, NOTES v21): the report counts it too. The column softmax's
    split tile holds 64 elements a thread: at 64 registers it spills."""
    if "cuda:90" in missing:
        pytest.skip(f"cuda:90: {missing['cuda:90']}")
    target = crosscompile.parse_target("cuda:90")
    record, _, _ = crosscompile.target_record(target)
    case = crosscompile.Case(*STRIDED_SPLIT, "float32", False, False, strided=True)
    config = next(config for role, config in crosscompile.planned_configs(record, case) if role == "ticketed")
    spec = crosscompile.variant_spec(target, record, config, case)
    spec["options"]["maxnreg"] = 64
    result = crosscompile.compile_variant(spec)
    assert result["registers"] <= 64 and result["spills"] > 0
    assert result["spills"] * 4 == result["detail"].get("stack", 0) + result["detail"].get("local", 0)


def test_the_split_loss_holds_no_more_for_label_smoothing(missing):
    """The split loss that writes the gradient holds a chunk's exponentials across the exchange;
    label smoothing's sum over the chunk's logits is formed before them, so the logits are not
    held beside them (formed after them: sm_90, Triton 3.6, bf16 rows of 50257 in chunks of 4096
    at 2 warps, 241 registers against the plain form's 168; NOTES v53). Compiled uncapped, the
    smoothing form takes no more than a few registers beyond the plain one."""
    if "cuda:90" in missing:
        pytest.skip(f"cuda:90: {missing['cuda:90']}")
    target = crosscompile.parse_target("cuda:90")
    record, _, _ = crosscompile.target_record(target)
    case = crosscompile.Case(*ODD_SPLIT_ROW, "bfloat16", False, False, loss=True)
    role, config = next((role, config) for role, config in loss_configs(record, case)
                        if role == "grad")
    assert config.regime == "split"
    registers = {}
    for smoothing in (False, True):
        spec = crosscompile.variant_spec(target, record, config, case, role)
        spec["constexprs"]["SMOOTHING"] = smoothing
        registers[smoothing] = crosscompile.compile_variant(spec)["registers"]
    assert registers[True] <= registers[False] + 8, registers


def test_the_shipped_table_holds_what_this_triton_compiles(target):
    """The package's table of known resources for this target and Triton (``kernel_resources``)
    holds, for each variant both have, what a fresh compile reads: a table left behind by a
    kernel change is caught here (regenerate it: ``portable_softmax/kernel_resources/README.md``)."""
    import triton

    record = target["record"]
    table = kernel_resources.table_for(record["backend"], record["arch"], triton.__version__)
    if not table.rows:
        pytest.skip(f"no table of known resources for {record['backend']} {record['arch']} and Triton "
                    f"{triton.__version__}")
    compared, stale = 0, []
    for v in target["variants"]:
        row = table.get(v["table_key"])
        if v["status"] != "ok" or row is None:
            continue
        compared += 1
        if (row.registers, row.shared_memory, row.spills) != (v["registers"], v["shared"], v["spills"]):
            stale.append((v["kernel"], v["constexprs"], (row.registers, row.shared_memory, row.spills),
                          (v["registers"], v["shared"], v["spills"])))
    assert compared, f"{target['target']}: the table holds none of the variants compiled here"
    assert not stale, f"{target['target']}: rows that differ from this Triton's compile (table, now): {stale[:3]}"


def test_shared_memory_within_the_target_limit(target):
    limit = target["record"]["shared_memory_per_unit"]
    assert limit and limit > 0
    for v in target["variants"]:
        assert v["shared_ok"] and v["shared"] + v["static_shared"] <= limit, (
            f"{target['target']} {v['kernel']}: {v['shared']} + {v['static_shared']} bytes > {limit}")


def test_programs_fit_units_times_occupancy(target):
    units = target["record"]["compute_units"]
    tile_waves = tuning_for(DeviceRecord(**target["record"])).tile_waves
    planned = [p for p in target["plans"] if "programs" in p]
    # HIP plans no split path until its wait loops are shown to read memory (vendors._hip_normalize).
    assert {p["regime"] for p in planned} >= ({"tile", "split"} if target["record"]["residency_guaranteed"] else {"tile"})
    for p in planned:
        assert p["occupancy"] >= 1, f"{target['target']} {p['case']}: occupancy 0"
        assert p["compute_units"] == units and p["resident_limit"] == units * p["occupancy"]
        # Persistent split programs wait on each other: all must be resident at once, with the
        # compiled kernel's occupancy. Tile and loop grids may queue up to tile_waves waves;
        # ticketed split grids and a program per tile have no bound (allowed_waves None).
        if p["regime"] == "split" and p["allowed_waves"] is not None:
            assert p["allowed_waves"] == 1
        elif p["regime"] == "loop":
            assert p["allowed_waves"] == tile_waves
        waves = p["allowed_waves"]
        assert 1 <= p["programs"] <= units * p["occupancy"] * (waves or p["programs"]), (
            f"{target['target']} {p['case']} ({p['regime']}): {p['programs']} programs > {waves} x {units} units "
            f"x occupancy {p['occupancy']}")
        if p["regime"] == "split":
            chunks = next(v for v in target["variants"] if v["id"] == p["variant"])["constexprs"]["CHUNKS"]
            assert p["programs"] % chunks == 0


@pytest.mark.parametrize("text", ["npu:Ascend910B", "rocm:gfx942", "gfx942", "cuda:gfx942", "hip:sm_90", "cuda:"])
def test_unknown_target_is_a_clear_error(text, capsys):
    with pytest.raises(ValueError, match=r"unknown target .*(cuda:|hip:)"):
        crosscompile.parse_target(text)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["compile", "--target", text])
    assert exit_info.value.code == 2
    assert f"unknown target {text!r}" in capsys.readouterr().err



def test_a_missing_amd_linker_is_named(monkeypatch):
    """Triton 3.2 to 3.4 link AMD code with an external ld.lld: where Triton's own lookup finds
    none, the reason says so and how to give it one."""
    from portable_softmax import compat

    amd = pytest.importorskip("triton.backends.amd.compiler")

    def not_found():
        raise Exception("ROCm linker /opt/rocm/llvm/bin/ld.lld not found. Set 'TRITON_HIP_LLD_PATH' to its path.")

    monkeypatch.setattr(amd.HIPBackend, "path_to_rocm_lld", staticmethod(not_found), raising=False)
    reason = compat.missing_toolchain("hip")
    assert reason and "ld.lld" in reason and "none is found" in reason and "TRITON_HIP_LLD_PATH" in reason


@pytest.mark.parametrize("needed, refused", [(15, True), (None, False)])
def test_an_amd_linker_too_old_is_named(monkeypatch, tmp_path, needed, refused):
    """Triton 3.3 and 3.4 write code objects v5, which LLD 14 cannot link."""
    from portable_softmax import compat

    amd = pytest.importorskip("triton.backends.amd.compiler")
    lld = tmp_path / "ld.lld"
    lld.write_text("#!/bin/sh\necho 'Debian LLD 14.0.6 (compatible with GNU linkers)'\n")
    lld.chmod(0o755)
    monkeypatch.setattr(amd.HIPBackend, "path_to_rocm_lld", staticmethod(lambda: lld), raising=False)
    monkeypatch.setattr(compat, "AMD_LLD_MIN_MAJOR", needed)
    reason = compat.missing_toolchain("hip")
    if refused:
        assert reason and "LLD 14" in reason and "15 or newer" in reason
    else:
        assert reason is None


def test_a_target_without_its_toolchain_is_reported_not_compiled(monkeypatch):
    # Where the run looks them up.
    monkeypatch.setattr(crosscompile.report, "toolchain_missing",
                        lambda target: "no linker here" if target.backend == "hip" else None)
    monkeypatch.setattr(crosscompile.report, "compile_all",
                        lambda specs, **kwargs: [{"status": "error", "error": "x"}] * len(specs))
    cases = crosscompile.cases_for([SMALL_TILE], ["bfloat16"], [False])
    result = crosscompile.run([crosscompile.parse_target("hip:gfx942")], cases)
    (entry,) = result["targets"]
    assert result["compiles"] == 0 and not result["ok"]
    assert entry["unavailable"] == "no linker here" and not entry["variants"] and not entry["plans"]
    assert "NOT COMPILED: no linker here" in crosscompile.format_report(result)


# PTX instructions that touch global memory: what a kernel launched to overlap the one before it
# must not issue before its wait (``kernels/dependency.py``).
_MEMORY_PTX = ("ld.global", "st.global", "atom.", "red.", "cp.async", "ld.volatile", "ld.relaxed", "ld.acquire")


def _first(ptx: str, needles) -> int:
    found = [ptx.find(n) for n in needles]
    return min((i for i in found if i >= 0), default=-1)


def test_overlapping_kernels_wait_before_touching_memory(missing):
    """On sm_90 every loss kernel that the device launches to overlap the kernel before it (the
    forward in each regime, the stats, the sum, the rescale) releases the next one and waits for
    the one before before its first access to memory; on gfx942 none holds the instructions."""
    import triton
    from triton.backends.compiler import GPUTarget

    from portable_softmax import compat, kernels, variants
    from portable_softmax.crosscompile.cases import loss_configs

    if "cuda:90" in missing:
        pytest.skip(missing["cuda:90"])
    target = crosscompile.parse_target("cuda:90")
    record, _, _ = crosscompile.target_record(target)
    assert record.dependent_launch
    gfx, _, _ = crosscompile.target_record(crosscompile.parse_target("hip:gfx942"))
    assert not gfx.dependent_launch
    ptx = {}
    for shape, role, regime in (((8192, 32000), "grad", "split"), ((16384, 2048), "grad", "tile"),
                                ((4096, 50257), "no grad", "loop")):
        case = crosscompile.Case(*shape, "bfloat16", False, False, loss=True)
        config = next(c for r, c in loss_configs(record, case) if r == role and c.regime == regime)
        spec = crosscompile.variant_spec(target, record, config, case, role)
        assert spec["constexprs"]["DEPENDENT"]
        ptx[regime] = crosscompile.compiled_variant(spec)[0].asm["ptx"]
    small = {variants.STATS_KERNEL: ({"target_ptr": "*i64", "weight_ptr": "*fp32", "kept_ptr": "*fp32",
                                      "stats_ptr": "*fp32"}, {"BLOCK": 1024, "WEIGHT": False, "ACC_FP64": False}),
             variants.SUM_KERNEL: ({"terms_ptr": "*fp32", "target_ptr": "*i64", "out_ptr": "*bf16"},
                                   {"BLOCK": 1024, "ACC_FP64": False, "COUNTED": True}),
             variants.GRAD_SCALE_KERNEL: ({"grad_ptr": "*bf16", "dloss_ptr": "*bf16"},
                                          {"BLOCK": variants.GRAD_SCALE_BLOCK, "ACC_FP64": False})}
    for name, (pointers, constexprs) in small.items():
        fn = getattr(kernels, name)
        constexprs = {**constexprs, "DEPENDENT": True}
        signature = {p.name: "constexpr" if p.is_constexpr else pointers.get(p.name, "i32") for p in fn.params}
        source = compat.ast_source(fn, signature, constexprs, [])
        ptx[name] = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "enable_fp_fusion": True}).asm["ptx"]
    for name, text in ptx.items():
        release, wait = text.find("griddepcontrol.launch_dependents"), text.find("griddepcontrol.wait")
        memory = _first(text, _MEMORY_PTX)
        assert 0 <= release < wait < memory, (name, release, wait, memory)
