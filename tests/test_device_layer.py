"""Device layer and planner over recorded chips: no hardware needed."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import portable_softmax
from portable_softmax import row_layout, plan_grid, planner, targets, variants, vendors
from portable_softmax.backend import get_backend
from portable_softmax.planner import window_align
from portable_softmax.targets import plan_launch, select_config, split_fit, tile_fill, ticketed_forms
from portable_softmax.profiles import load_profile, profile_names, profile_record
from portable_softmax.record import KernelResources
from portable_softmax.tuning import TUNING, replace, tuning_for

REQUIRED_PROFILES = {"h100", "a100", "mi300x", "mi250x", "rx7900xtx", "ascend910b"}
# Labelled with the path each exercises on a GPU with residency.
SHAPES = [
    (32768, 256),     # tile, many rows per tile
    (4096, 4096),     # tile, one row per tile
    (1823, 781),      # tile, odd width
    (16384, 65536),   # split: row longer than a program holds
    (4096, 50257),    # split, odd width
    (32, 128256),     # split: few rows
    (1, 1),           # one element
]


def test_required_profiles_are_recorded():
    assert REQUIRED_PROFILES <= set(profile_names())


@pytest.mark.parametrize("name", sorted(REQUIRED_PROFILES))
def test_profile_normalizes_from_its_raw_key_set(name):
    profile = load_profile(name)
    raw, record = profile["properties"], profile_record(name)
    backend = profile["target"]["backend"]
    assert record.backend == backend and record.compute_units > 0
    if backend == "cuda":
        assert "max_threads_per_sm" not in raw  # CUDA's driver does not report it ...
        assert record.max_threads_per_unit in (1024, 1536, 2048)  # ... the arch table does
        assert record.arch == f"sm_{profile['target']['arch']}" and record.warp_size == 32
        assert record.residency_guaranteed
    elif backend == "hip":
        assert record.arch.startswith("gfx") and ":" not in record.arch
        assert record.max_threads_per_unit == raw["max_threads_per_sm"]
    else:
        assert record.warp_size == 0 and record.grid_limit == 65535
        assert record.compute_units == raw["num_vectorcore"]
        assert record.shared_memory_per_unit != raw.get("max_shared_mem")  # the placeholder is not used
        assert not record.supports_fp64 and not record.residency_guaranteed


def test_cdna_register_file_counts_once():
    mi300x, rdna = profile_record("mi300x"), profile_record("rx7900xtx")
    assert mi300x.registers_per_unit == 131072
    assert rdna.warp_size == 32


@pytest.mark.parametrize("name", sorted(REQUIRED_PROFILES))
@pytest.mark.parametrize("rows,cols", SHAPES)
@pytest.mark.parametrize("backward", [False, True])
def test_plan_stays_within_what_the_chip_holds(name, rows, cols, backward):
    record = profile_record(name)
    plan = plan_launch(record, rows, cols, "bfloat16", backward=backward)
    assert 1 <= plan.programs <= record.grid_limit
    assert plan.block_n & (plan.block_n - 1) == 0 and plan.block_m >= 1
    if plan.regime == "split":
        assert record.residency_guaranteed
        assert plan.programs % plan.chunks == 0
        if plan.ticketed:
            # A program per item; only a row's chunks need to be resident at once, within the
            # units of one residency domain (an XCD on MI300X).
            domain = record.compute_units // record.residency_domains
            assert plan.programs == plan.items and plan.chunks <= domain * plan.occupancy
        else:
            # Every program waits on the others: the driver must enforce the residency.
            assert record.cooperative_launch
            assert plan.programs <= record.compute_units * plan.occupancy
        assert plan.chunks * plan.block_n >= cols > (plan.chunks - 1) * plan.block_n
    elif plan.regime == "tile":
        assert plan.block_n >= cols
        # Tile programs never wait on each other: a grid of few resident programs per unit loops
        # over a few waves of tiles; one of many, or of twice-read tiles, gets a program per tile,
        # and is compiled without the loop over tiles.
        tuning = tuning_for(record)
        if plan.occupancy >= tuning.tile_loop_occupancy["backward" if backward else "forward"] or plan.reread:
            assert plan.programs == plan.tiles
        else:
            assert plan.programs <= record.compute_units * max(plan.occupancy, 1) * tuning.tile_waves
        assert plan.per_tile == (plan.programs == plan.tiles)
    else:
        assert plan.regime == "loop"
    if record.backend == "npu":
        assert plan.regime != "split" and plan.programs <= min(record.compute_units, 65535)


def test_long_rows_split_on_residency_and_stream_elsewhere():
    assert plan_launch(profile_record("h100"), 4096, 262144, "float32").regime == "split"
    assert plan_launch(profile_record("ascend910b"), 4096, 262144, "float32").regime == "loop"
    interpreter = get_backend("interpreter").normalize({}, "cpu", "cpu")
    assert plan_launch(interpreter, 4, 262144, "float32").regime == "loop"
    assert plan_launch(profile_record("h100"), 64, 262144, "float64").regime == "loop"


@pytest.mark.parametrize("name", ["mi300x", "mi250x", "rx7900xtx"])
@pytest.mark.parametrize("rows,cols,dtype", [(4, 131072, "float32"), (64, 2097152, "float32"), (4096, 50257, "bfloat16"),
                                             (32, 128256, "bfloat16")])
@pytest.mark.parametrize("backward", [False, True])
def test_amd_chips_never_plan_a_waiting_regime(name, rows, cols, dtype, backward):
    # Every one of these planned a persistent or ticketed split on these chips before, whose wait
    # loop compiled for AMD without a memory read: a hang on hardware.
    plan = plan_launch(profile_record(name), rows, cols, dtype, backward=backward)
    assert plan.regime in ("tile", "loop") and not plan.ticketed, plan.reason


def test_odd_widths_pad_to_the_narrowest_chunk():
    config = select_config(profile_record("h100"), 4096, 50257, "bfloat16")
    assert config.regime == "split"
    assert config.chunks * config.block_n - 50257 < config.block_n


@pytest.mark.parametrize("name, registers, shared, expected", [
    # H100, 4 warps (128 threads): 2048 threads / 128 = 16 blocks, under the 32-block limit; no
    # register or shared-memory count (0: unknown) bounds it.
    ("h100", 0, 0, 16),
    # 32 registers x 32 lanes = 1024 per warp: 65536 / (1024 x 4) x 4 = 64 warps, 16 blocks.
    ("h100", 32, 0, 16),
    # 232448 / (4096 + 1024 reserved) = 45 blocks: the thread limit (16) is tighter.
    ("h100", 0, 4096, 16),
    # 255 registers round to 256 a thread, 8192 a warp: 8 warps, 2 blocks; 232448 / 201024: 1.
    ("h100", 255, 200000, 1),
    # MI300X (gfx942), 4 waves of 64: 4 SIMDs x 8 waves / 4 = 8, and 2048 threads / 256 = 8.
    ("mi300x", 0, 0, 8),
    # 32 VGPRs: 512 / 32 = 16 waves a SIMD, capped at 8: still 8.
    ("mi300x", 32, 0, 8),
    # 65536 bytes of LDS / 4096 = 16 programs: the waves (8) are tighter.
    ("mi300x", 0, 4096, 8),
    # 255 VGPRs round to 256: 2 waves a SIMD, 2 programs; 200000 bytes of LDS do not fit at all: 0.
    ("mi300x", 255, 200000, 0),
])
def test_occupancy_guards(name, registers, shared, expected):
    """Each vendor's rule (CUDA's occupancy calculator, the HIP runtime's) on the recorded chips:
    counts of 0 (unknown) bound nothing, and a program that cannot fit gets 0, not a negative or
    a guess."""
    record = profile_record(name)
    assert get_backend(record.backend).occupancy(record, KernelResources(registers, shared, 4)) == expected


def test_cuda_occupancy_from_registers_and_shared_memory():
    h100 = profile_record("h100")
    occupancy = vendors.CUDA.occupancy
    # 64 registers x 32 lanes = 2048 per warp; 8 warps = 16384 per block: 4 blocks in 65536.
    assert occupancy(h100, KernelResources(64, 0, 8)) == 4
    # 255 registers round up to 256: one 8-warp block needs all 65536.
    assert occupancy(h100, KernelResources(255, 0, 8)) == 1
    # Shared memory bounds it too (1 KiB reserved per block).
    assert occupancy(h100, KernelResources(32, 100 * 1024, 4)) == 2
    # The thread limit (2048 on sm_90) bounds tiny kernels.
    assert occupancy(h100, KernelResources(16, 0, 4)) == 16


def test_split_register_caps_from_the_most_programs_down():
    """The caps a split launch tries (launch.py keeps the first that spills within the tuning's
    limit): most programs first, each cap letting that many blocks share an SM; none for tiles
    or where the compiler has no cap (the AMD backend here)."""
    h100 = profile_record("h100")
    config = select_config(h100, 4096, 262144, "bfloat16")
    caps = split_fit(h100, config, 2)
    wanted = -(-tuning_for(h100).split_fit_bytes // (config.block_n * 2))
    assert [programs for programs, _ in caps] == list(range(wanted, 0, -1))
    occupancy = vendors.CUDA.occupancy
    for programs, options in caps:
        assert occupancy(h100, KernelResources(options["maxnreg"], 0, config.num_warps)) >= programs
    assert [options["maxnreg"] for _, options in caps] == sorted(options["maxnreg"] for _, options in caps)
    assert split_fit(h100, select_config(h100, 32768, 256, "bfloat16"), 2) == []
    mi300x = profile_record("mi300x")
    assert split_fit(mi300x, select_config(mi300x, 4096, 262144, "bfloat16"), 2) == []


def test_tile_register_caps_for_the_bytes_a_unit_wants():
    """Held tiles get caps as split chunks do, from the programs that hold the tuning's
    ``tile_fit_bytes`` down (the H100's 16 x 1024 bf16 channel tile: two, at 64 registers, NOTES
    v20); none for twice-read tiles, split chunks, a tuning that asks for none, or a compiler
    with no cap."""
    h100 = profile_record("h100")
    config = select_config(h100, 65536, 1024, "bfloat16", strided=True, rows_per_group=1024)
    assert (config.regime, config.block_m, config.block_n, config.num_warps) == ("tile", 16, 1024, 16)
    caps = tile_fill(h100, config, 2)
    wanted = -(-tuning_for(h100).tile_fit_bytes // (config.block_m * config.block_n * 2))
    assert wanted == 2 and [programs for programs, _ in caps] == [2, 1]
    assert caps[0][1] == {"maxnreg": 64}
    occupancy = vendors.CUDA.occupancy
    for programs, options in caps:
        assert occupancy(h100, KernelResources(options["maxnreg"], 0, config.num_warps)) >= programs
    assert tile_fill(h100, dataclasses.replace(config, reread=True), 2) == []
    assert tile_fill(h100, select_config(h100, 4096, 262144, "bfloat16"), 2) == []
    mi300x = profile_record("mi300x")
    assert tile_fill(mi300x, select_config(mi300x, 65536, 1024, "bfloat16", strided=True, rows_per_group=1024),
                     2) == []


def test_ticketed_float32_forward_chunks_of_the_h200_row():
    """The H200's row narrows ticketed float32 forward grids to chunks of 4096 (NOTES v21); its
    persistent grids, its backward and bfloat16 keep theirs, and the H100 (no such row) keeps
    8192. Fails with ``ticket_chunk`` empty or applied to every grid."""
    h200, h100 = profile_record("h200"), profile_record("h100")
    plan = plan_launch(h200, 256, 151936, "float32")
    assert plan.ticketed and (plan.block_n, plan.chunks, plan.num_warps) == (4096, 38, 2)
    assert not plan_launch(h200, 256, 151936, "bfloat16").ticketed
    persistent = plan_launch(h200, 32, 128256, "float32")
    assert not persistent.ticketed and persistent.block_n == 8192
    assert plan_launch(h100, 256, 151936, "float32").block_n == 8192
    forms = ticketed_forms(h200, select_config(h200, 256, 151936, "float32"), 151936, False, 4)
    assert [(form.block_n, form.chunks, form.num_stages) for form in forms] == [(4096, 38, 1), (8192, 19, 1)]
    forms = ticketed_forms(h200, select_config(h200, 256, 151936, "bfloat16"), 151936, False, 2)
    assert [(form.block_n, form.ticketed, form.num_stages) for form in forms] == [(8192, True, 1)]


def test_wide_bf16_backward_split_tiles_where_their_chunks_are_few():
    """CUDA's row widens bf16 backward split tiles to 64 rows while a program reads at most 512
    exchange slots (NOTES v21): the 1024-channel NCHW backward, not the long column (whose
    chunks are many), not the forward, not float32. Fails with ``strided_split_rows`` empty."""
    h100 = profile_record("h100")
    nchw = dict(rows_per_group=1024, strided=True)
    wide = plan_launch(h100, 64 * 1024, 1024, "bfloat16", backward=True, **nchw)
    assert (wide.regime, wide.block_m, wide.chunks) == ("split", 64, 8)
    assert wide.block_m * wide.chunks <= tuning_for(h100).strided_split_slots
    assert plan_launch(h100, 1024, 32768, "bfloat16", backward=True, strided=True).block_m == 16
    assert plan_launch(h100, 64 * 1024, 1024, "float32", backward=True, **nchw).block_m == 32
    assert plan_launch(h100, 64 * 1024, 1024, "bfloat16", **nchw).block_m == 16


def test_strided_split_tiles_of_many_chunks_take_tickets():
    """CUDA's row tickets split tiles of 16 chunks or more (NOTES v22): the bf16 column of (32768,
    1024) in both directions, which hold too little a unit for ``split_ticket_bytes``; not the
    1024-channel NCHW backward (8 chunks) nor the transposed forward (4). The bf16 forward of these
    rows is sliced there (``strided_slices``) unless the call is fused: planned as a fused call.
    Fails with ``strided_ticket_chunks`` unset."""
    h100 = profile_record("h100")
    assert tuning_for(h100).strided_ticket_chunks == 16
    for backward in (False, True):
        column = plan_launch(h100, 1024, 32768, "bfloat16", backward=backward, strided=True, sliceable=False)
        assert column.regime == "split" and column.block_m == 16 and column.chunks >= 16 and column.ticketed
    nchw = plan_launch(h100, 64 * 1024, 1024, "bfloat16", backward=True, rows_per_group=1024, strided=True)
    assert nchw.regime == "split" and nchw.chunks < 16 and not nchw.ticketed
    transposed = plan_launch(h100, 8192, 4096, "bfloat16", strided=True, sliceable=False)
    assert transposed.regime == "split" and transposed.chunks < 16 and not transposed.ticketed


@pytest.mark.parametrize("name, shape, dtype, backward, regime, programs", [
    ("h100", (16384, 8192), "float32", False, "tile", 132 * 2 * 4),   # 132 SMs x 2 resident x 4 waves
    ("h100", (65536, 262144), "float64", True, "loop", 132 * 2 * 4),
    ("mi300x", (65536, 262144), "float32", False, "loop", 304 * 2 * 4),  # 304 CUs
])
def test_looping_grids_hold_waves_of_resident_programs(name, shape, dtype, backward, regime, programs):
    """A grid that loops over its tiles (too few resident programs a unit for a program per tile)
    is ``Tuning.tile_waves`` (4) waves of the resident programs: units x occupancy x waves, here
    at 2 programs a unit (128 registers, 8 warps; 128 VGPRs of gfx942: 4 waves a SIMD)."""
    record = profile_record(name)
    assert tuning_for(record).tile_waves == 4
    two = KernelResources(registers=128, shared_memory=0, num_warps=8)
    plan = plan_launch(record, *shape, dtype, backward=backward, resources=two)
    assert (plan.regime, plan.occupancy, plan.per_tile) == (regime, 2, False), plan.reason
    assert plan.programs == programs < plan.tiles


def test_rows_of_2_31_elements_are_planned_without_the_tensor():
    """The planning of a row of 2**31 elements or more, on meta tensors (tests/test_torch_native.py
    runs such a row on GPUs): a contiguous one is walked in place and streams through the loop
    regime on every recorded chip, with 64-bit offsets (not dense), even where a tuning row would
    let its chunks be resident (the split kernels count columns in 32 bits); one element shorter
    splits there. A strided row that spans 2**31 elements has no row view: it is copied first."""
    long = 2**31 + 64
    contiguous = torch.empty(long, device="meta")
    view = row_layout.row_view((long,), 0, contiguous, contiguous)
    assert view is not None and view.n_cols == long and not view.narrow
    for name in sorted(REQUIRED_PROFILES):
        for backward in (False, True):
            plan = plan_launch(profile_record(name), 1, long, "float32", backward=backward, narrow=view.narrow)
            assert plan.regime == "loop" and not plan.dense, (name, plan.reason)
    h100 = profile_record("h100")
    target = targets.target_for(h100)
    resident = plan_grid.Target(h100, replace(target.tuning, split_chunk=2**22), target.occupancy, target.fit_options)
    small = KernelResources(registers=32, shared_memory=0, num_warps=4)
    for backward in (False, True):
        assert planner.plan_launch(resident, 4, 2**31 - 1, "float32", backward=backward,
                                   resources=small).regime == "split"
        assert planner.plan_launch(resident, 4, 2**31, "float32", backward=backward,
                                   resources=small).regime == "loop"
    strided = torch.empty_strided((long,), (2,), device="meta")
    assert row_layout.row_view((long,), 0, strided, contiguous) is None
    short = 2**30  # spans (2**30 - 1) * 2 < 2**31 elements
    assert row_layout.row_view((short,), 0, torch.empty_strided((short,), (2,), device="meta"),
                        torch.empty(short, device="meta")) is not None


def test_unsafe_forced_program_count_is_refused():
    h100 = profile_record("h100")
    plan = plan_launch(h100, 4096, 262144, "float32")
    with pytest.raises(ValueError, match="unsafe for the split-row path"):
        plan_launch(h100, 4096, 262144, "float32", programs=plan.programs + 1)
    assert plan_launch(h100, 4096, 1024, "float32", programs=7).programs == 7


def test_backend_override_names_the_known_backends(monkeypatch):
    monkeypatch.setenv("PORTABLE_SOFTMAX_BACKEND", "nosuch")
    with pytest.raises(ValueError, match="cuda, hip, interpreter, npu"):
        portable_softmax.device_info("cpu")


def test_cpu_record_without_a_gpu_driver():
    info = portable_softmax.device_info("cpu")
    assert info["backend"] == "interpreter" and not info["residency_guaranteed"]


def test_cli_plan_json_for_recorded_chips(capsys):
    from portable_softmax.cli import main
    import json

    for name in sorted(REQUIRED_PROFILES):
        assert main(["plan", "--profile", name, "--shape", "4096x50257", "--dtype", "bfloat16", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert {"backend", "programs", "block_m", "block_n", "num_warps", "regime"} <= set(out)
        assert out["backend"] == profile_record(name).backend


@pytest.mark.parametrize("case, align", [
    (dict(rows=4, cols=781, strides=[(0, 781, 1)] * 2, sizes=[2, 2]), 8),       # bf16 rows off 16 bytes
    (dict(rows=4, cols=781, strides=[(0, 781, 1)] * 2, sizes=[4, 4]), 4),       # fp32
    (dict(rows=4, cols=781, strides=[(0, 781, 1)] * 2, sizes=[2, 4]), 8),       # bf16 in, fp32 out (dtype=)
    (dict(rows=4, cols=50264, strides=[(0, 50264, 1)] * 2, sizes=[2, 2]), 8),   # aligned, but Triton cannot tell
    (dict(rows=4, cols=1024, strides=[(0, 1024, 1)] * 2, sizes=[2, 2]), 1),     # Triton proves these aligned
    (dict(rows=1, cols=784, strides=[(0, 0, 1)] * 2, sizes=[2, 2]), 1),         # one row starts at the pointer
    (dict(rows=1, cols=781, strides=[(0, 0, 1)] * 2, sizes=[2, 2]), 8),         # ... but ends off 16 bytes
    (dict(rows=4, cols=50257, strides=[(0, 50304, 1)] * 2, sizes=[2, 2]), 8),   # sliced from a padded vocabulary
    (dict(rows=4, cols=8, strides=[(0, 9, 1)] * 2, sizes=[2, 2]), 1),           # a row within one group
    (dict(rows=4, cols=781, strides=[(0, 800, 1), (0, 781, 1)], sizes=[2, 2]), 1),  # rows start differently
    (dict(rows=4, cols=781, strides=[(0, 1, 4)] * 2, sizes=[2, 2]), 1),         # columns not contiguous
    (dict(rows=4, cols=781, strides=[(0, 781, 1)] * 2, sizes=[2, 2], aligned=False), 1),  # pointer off 16 bytes
    (dict(outer=3, rows=4, cols=781, strides=[(3200, 800, 1), (3124, 781, 1)], sizes=[2, 2]), 1),
    (dict(outer=3, rows=4, cols=781, strides=[(3128, 781, 1)] * 2, sizes=[2, 2]), 8),
])
def test_window_align_only_where_one_window_fits_every_tensor(case, align):
    assert window_align(case.get("outer", 1), case["rows"], case["cols"], case["strides"], case["sizes"],
                        case.get("aligned", True)) == align


def test_split_grids_are_ticketed_where_the_resident_programs_hold_enough():
    """A split launch gives each item a program taken by ticket where its resident programs hold
    ``split_ticket_bytes`` of input per unit and the items fill ``split_ticket_waves`` resident
    grids; otherwise, and in directions the tuning table leaves out, the grid is persistent."""
    record = profile_record("h200")
    tuning = tuning_for(record)
    four = KernelResources(registers=128, shared_memory=1024, num_warps=4)  # 4 programs of 4 warps per unit
    fp32 = plan_launch(record, 4096, 262144, "float32", resources=four)
    assert fp32.regime == "split" and fp32.ticketed and fp32.programs == fp32.items and "ticket" in fp32.reason
    assert 4 * fp32.block_n * 4 >= tuning.split_ticket_bytes
    bf16 = plan_launch(record, 4096, 262144, "float32", resources=four, input_bytes=2)
    assert bf16.regime == "split" and not bf16.ticketed and bf16.programs <= record.compute_units * 4
    assert plan_launch(record, 4096, 262144, "float32", resources=four, backward=True, input_bytes=8).ticketed
    assert not plan_launch(record, 4096, 262144, "float32", resources=four, backward=True, input_bytes=4).ticketed
    few = plan_launch(record, 32, 128256, "float32", resources=four)
    assert few.regime == "split" and not few.ticketed  # 512 items: not two resident grids
    forced = plan_launch(record, 4096, 262144, "float32", resources=four, programs=512)
    assert not forced.ticketed and forced.programs == 512


def test_tuning_rows_by_device_name_then_architecture_then_default(monkeypatch):
    """The H200 (the H100's sm_90 with 1.4 times the memory bandwidth) has its own CUDA row, found
    by the device's name; the H100 and A100 take the backend's default. Rows set in TUNING win
    over the backend's own, by name first."""
    h100, h200 = profile_record("h100"), profile_record("h200")
    assert h200.name == "NVIDIA H200" and h200.arch == h100.arch
    assert tuning_for(h200) == vendors.H200_TUNING != vendors.CUDA_TUNING
    assert tuning_for(h100) == tuning_for(profile_record("a100")) == vendors.CUDA_TUNING
    assert tuning_for(h200).split_fit_bytes > tuning_for(h100).split_fit_bytes
    # The fit follows the row: more programs asked of the H200 on a long-row split.
    config = select_config(h200, 4096, 262144, "float32")
    assert len(split_fit(h200, config, 4)) > len(split_fit(h100, select_config(h100, 4096, 262144, "float32"), 4))
    monkeypatch.setitem(TUNING, ("cuda", "*"), replace(vendors.CUDA_TUNING, split_fit_bytes=1))
    assert tuning_for(h200).split_fit_bytes == tuning_for(h100).split_fit_bytes == 1
    monkeypatch.setitem(TUNING, ("cuda", "NVIDIA H200"), replace(vendors.CUDA_TUNING, split_fit_bytes=2))
    assert tuning_for(h200).split_fit_bytes == 2 and tuning_for(h100).split_fit_bytes == 1


def test_split_tickets_only_in_the_directions_the_tuning_table_names(monkeypatch):
    record = profile_record("h200")
    four = KernelResources(registers=128, shared_memory=1024, num_warps=4)
    key = (record.backend, "*")
    monkeypatch.setitem(TUNING, key, replace(TUNING[key], split_tickets=frozenset({"backward"})))
    assert not plan_launch(record, 4096, 262144, "float32", resources=four).ticketed
    assert plan_launch(record, 4096, 262144, "float32", resources=four, backward=True, input_bytes=8).ticketed


def test_split_windows_where_the_tuning_table_takes_them(monkeypatch):
    """Windows are offered by the tensors (align) and taken by the split path in the directions
    the tuning table names; a window spans up to ALIGN - 1 columns before its row, so the plan
    must cover them, with a chunk more where the row alone fills whole chunks but for a few
    columns (unwindowed, such rows read an element an instruction: half the speed, NOTES v51)."""
    record = profile_record("h200")
    key = (record.backend, "*")
    monkeypatch.setitem(TUNING, key, replace(TUNING[key], split_windows=frozenset({"backward"})))
    plan = plan_launch(record, 4096, 50257, "float32", backward=True, align=8)
    assert plan.align == 8 and plan.chunks * plan.block_n >= 50257 + 7 and "aligned windows" in plan.reason
    assert plan_launch(record, 4096, 50257, "float32", backward=True, align=1).align == 1
    assert plan_launch(record, 4096, 50257, "float32", align=8).align == 1
    assert plan_launch(record, 4096, 1001, "float32", backward=True, align=8).align == 1  # a float32 tile
    # 65542 columns through windows: 17 chunks of 4096 where the row alone fills 16.
    edge = plan_launch(record, 64, 65535, "float32", backward=True, align=8)
    assert edge.align == 8 and edge.chunks * edge.block_n >= 65535 + 7


def test_tiles_of_one_row_take_windows_where_the_tuning_table_names_their_form(monkeypatch):
    """bf16 tiles of one row off 16-byte boundaries read through aligned windows (``kernels/tile_windows.py``:
    H200 4096x4095 0.79 of copy forward unwindowed, 0.96 through them, NOTES v52) at the tuning's
    elements a thread (CUDA: 32, 4 warps a row of 4096), held and twice-read, where the tuning
    names their direction and the bytes a column reads (CUDA: not float32's, level or lower
    there, but for forward rows of more than 2048 columns). Tiles of several rows, float64 (its
    edges would be float32) and causal rows (their
    tiles' ladder) read element by element. Windowed tiles keep one row: the wave fill's taller
    tiles would have none. CUDA's bf16 backward rows of 2048 or more split through windows
    (``Tuning.window_split_cols``)."""
    record = profile_record("h200")
    held = plan_launch(record, 4096, 4095, "bfloat16", align=8)
    assert (held.regime, held.block_m, held.align, held.num_warps) == ("tile", 1, 8, 4), held.reason
    assert "aligned windows of 8" in held.reason
    split = plan_launch(record, 4096, 4095, "bfloat16", backward=True, align=8)
    assert (split.regime, split.align) == ("split", 8), split.reason
    short = plan_launch(record, 4096, 2047, "bfloat16", backward=True, align=8)
    assert (short.regime, short.align, short.num_warps) == ("tile", 8, 2), short.reason
    fp32 = plan_launch(record, 4096, 4095, "float32", align=4)
    assert (fp32.regime, fp32.align, fp32.num_warps) == ("tile", 4, 4), fp32.reason
    assert plan_launch(record, 4096, 2047, "float32", align=4).align == 1
    assert plan_launch(record, 4096, 4095, "float32", backward=True, align=4).align == 1
    assert plan_launch(record, 32768, 255, "bfloat16", align=8).align == 1  # tiles of several rows
    assert plan_launch(record, 4096, 4095, "float64", align=2).align == 1
    assert plan_launch(record, 4096, 4095, "bfloat16", align=8, causal=True).align == 1
    assert plan_launch(record, 4096, 4095, "bfloat16", align=1).align == 1
    # 3000x1025: one row a tile, though its waves are 0.71 full (the fill tries taller tiles).
    filled = plan_launch(record, 3000, 1025, "bfloat16", align=8)
    assert (filled.block_m, filled.align) == (1, 8), filled.reason
    key = (record.backend, "*")
    monkeypatch.setitem(TUNING, key, replace(TUNING[key], reread_cols={("forward", 2): frozenset({4096})}))
    reread = plan_launch(record, 4096, 4095, "bfloat16", align=8)
    assert (reread.regime, reread.align, reread.reread, reread.num_warps) == ("tile", 8, True, 4), reread.reason
    monkeypatch.setitem(TUNING, key, replace(TUNING[key], reread_cols={}, tile_windows={("backward", 4): 0}))
    assert plan_launch(record, 4096, 4095, "bfloat16", align=8).align == 1
    assert plan_launch(record, 4096, 2047, "bfloat16", backward=True, align=8).align == 8


def test_rows_off_16_bytes_that_a_twice_read_tile_would_take_split_through_windows():
    """bf16 backward rows of 16385-32768 columns take the twice-read tile on CUDA, which has no
    windows: rows off 16-byte boundaries (32001, Llama's vocabulary and a token) would be read an
    element an instruction (H200: 8192x32001 0.56 of copy; split through windows 0.95, NOTES v51).
    Aligned rows keep the tile, and so do rows shorter than the tuning's ``window_split_cols``
    (CUDA's bf16 backward: 2048)."""
    record = profile_record("h200")
    for rows, cols in ((8192, 32001), (16384, 16385), (1024, 32001)):
        odd = plan_launch(record, rows, cols, "bfloat16", backward=True, align=8)
        assert odd.regime == "split" and odd.align == 8 and odd.chunks * odd.block_n >= cols + 7, (rows, cols)
    aligned = plan_launch(record, 8192, 32000, "bfloat16", backward=True, align=1)
    assert aligned.regime == "tile" and aligned.reread
    short = plan_launch(record, 8192, 2047, "bfloat16", backward=True, align=8)
    assert (short.regime, short.align) == ("tile", 8)  # a held tile's windows


def test_float32_rows_whose_window_needs_a_chunk_more_keep_their_chunks():
    """A window up to ALIGN - 1 columns wider than its row can need a chunk more, nearly all
    padding: float32 rows then keep their chunks of 4096 (``Tuning.window_max_padding``; NOTES
    v51, H200: softmax 8192x28671 forward 0.91 -> 0.96 of copy), where bf16 rows halve them, and
    rows whose own padding halves them (10001) keep the row's rule."""
    record = profile_record("h200")
    for cols, chunks in ((28671, 8), (32767, 9)):
        fp32 = plan_launch(record, 8192, cols, "float32", align=4)
        assert (fp32.align, fp32.block_n, fp32.chunks) == (4, 4096, chunks), cols
        assert plan_launch(record, 8192, cols, "float32", align=8, input_bytes=2).block_n == 2048, cols
    backward = plan_launch(record, 8192, 28671, "float32", backward=True, align=4)
    assert (backward.block_n, backward.chunks) == (4096, 8)
    assert plan_launch(record, 8192, 10001, "float32", align=4).block_n == 2048


def test_held_tiles_of_rows_off_16_bytes_split_through_windows_in_chunks_of_2048_or_more():
    """bf16 forward rows of 8193-16384 columns are held as one tile on CUDA, which has no windows:
    off 16-byte boundaries they split through windows instead, their padding halving chunks to
    2048 at the narrowest (``Tuning.window_min_chunk``; NOTES v51, H200, forward / backward of
    copy: 8192x9000 0.52 / 0.88 -> 0.80 / 0.96, 4096x8193 0.49 / 0.81 -> 0.75 / 0.91). Aligned
    rows keep the tile; rows too short to split keep theirs."""
    record = profile_record("h200")
    for rows, cols in ((8192, 9000), (4096, 8193), (16384, 16383)):
        forward = plan_launch(record, rows, cols, "float32", align=8, input_bytes=2)
        backward = plan_launch(record, rows, cols, "float32", backward=True, align=8, input_bytes=4)
        for plan in (forward, backward):
            assert plan.regime == "split" and plan.align == 8 and plan.block_n == 2048, (rows, cols)
    aligned = plan_launch(record, 8192, 16384, "float32", align=1, input_bytes=2)
    assert aligned.regime == "tile"
    assert plan_launch(record, 8192, 8191, "float32", align=8, input_bytes=2).regime == "tile"


def test_twice_read_tiles_where_the_tuning_table_names_them():
    """H100 (CUDA's table): rows of 16384 read twice for the fp32 forward and the 16-bit backward,
    not for the bf16 forward or fp32 backward, nor for fewer rows than units (those split)."""
    record = profile_record("h100")
    reread = plan_launch(record, 16384, 16384, "float32")
    assert reread.regime == "tile" and reread.reread and reread.block_m == 1 and reread.num_warps == 32
    # launch.py plans every dtype but float64 as float32 and says what a column reads.
    assert plan_launch(record, 16384, 16384, "float32", backward=True, input_bytes=4).reread
    assert plan_launch(record, 16384, 16000, "float32", backward=True, input_bytes=4).reread
    assert not plan_launch(record, 16384, 16384, "float32", input_bytes=2).reread
    assert not plan_launch(record, 16384, 16384, "float32", backward=True).reread
    assert not plan_launch(record, 16384, 32768, "float32").reread
    assert plan_launch(record, 64, 16384, "float32").regime == "split"
    assert not plan_launch(profile_record("mi300x"), 16384, 16384, "float32").reread
    # The 16-bit backward of 4096 and 32768 too, but not of 8192 (held tiles read faster there).
    assert plan_launch(record, 32768, 4096, "float32", backward=True, input_bytes=4).reread
    assert plan_launch(record, 16384, 32768, "float32", backward=True, input_bytes=4).reread
    assert not plan_launch(record, 16384, 8192, "float32", backward=True, input_bytes=4).reread


def test_causal_tiles_get_warps_for_the_half_they_read():
    """A fused causal forward reads the kept part of its rows, half on average: its tiles get half
    the warps of a plain call's; its backward (which reads y and dy whole) and split rows keep them."""
    record = profile_record("h100")
    for rows, cols in [(4 * 32 * 4096, 4096), (4 * 32 * 2048, 2048)]:
        plain = plan_launch(record, rows, cols, "float32", input_bytes=2)
        causal = plan_launch(record, rows, cols, "float32", input_bytes=2, causal=True)
        assert plain.regime == causal.regime == "tile" and plain.num_warps > 1
        assert causal.num_warps == plain.num_warps // 2 and causal.block_n == plain.block_n
        backward = dict(backward=True, input_bytes=4)
        assert (plan_launch(record, rows, cols, "float32", causal=True, **backward).num_warps
                == plan_launch(record, rows, cols, "float32", **backward).num_warps)
    split = dict(input_bytes=4)
    assert plan_launch(record, 256, 151936, "float32", causal=True, **split) == \
        plan_launch(record, 256, 151936, "float32", **split)


def test_twice_read_tiles_are_dense_where_the_call_allows():
    """H100: the kernels' DENSE form (int32 offsets, no masks, no group division) only for one
    group of rows that fill their tiles and whose offsets fit in int32."""
    record = profile_record("h100")
    common = dict(backward=True, input_bytes=4)
    dense = plan_launch(record, 16384, 32768, "float32", narrow=True, **common)
    assert dense.reread and dense.dense and dense.per_tile and "dense" in dense.reason
    assert not plan_launch(record, 16384, 32768, "float32", **common).dense  # offsets beyond int32
    assert not plan_launch(record, 16384, 30000, "float32", narrow=True, **common).dense  # masked columns
    assert not plan_launch(record, 16384, 32768, "float32", narrow=True, rows_per_group=4096, **common).dense
    # Held tiles too in the directions the table names (CUDA: both), not on HIP's default table.
    assert plan_launch(record, 16384, 8192, "float32", narrow=True).dense
    assert plan_launch(record, 32768, 128, "float32", narrow=True).dense
    assert not plan_launch(record, 32760, 128, "float32", narrow=True).dense  # rows do not fill 8-row tiles
    assert not plan_launch(profile_record("mi300x"), 16384, 8192, "float32", narrow=True).dense


def test_flat_tiles_where_the_tuning_table_asks(monkeypatch):
    """H100: masked tiles of one group with int32 offsets take the kernels' flat form (``DENSE`` 2:
    no group division, int32 offsets, masks kept) in the directions ``Tuning.flat_tiles`` names;
    tiles that may be dense stay dense; several groups or 64-bit offsets keep the general form."""
    record = profile_record("h100")
    key = (record.backend, "*")
    backward = dict(backward=True, input_bytes=4)
    assert TUNING[key].flat_tiles == frozenset({"backward"})  # the CUDA rows' (NOTES v37)
    monkeypatch.setitem(TUNING, key, replace(TUNING[key], flat_tiles=frozenset()))
    assert not plan_launch(record, 1823, 781, "float32", narrow=True, **backward).flat  # not named
    monkeypatch.setitem(TUNING, key, replace(TUNING[key], flat_tiles=frozenset({"backward"})))
    flat = plan_launch(record, 1823, 781, "float32", narrow=True, **backward)
    assert flat.regime == "tile" and flat.flat and not flat.dense and "flat" in flat.reason
    assert variants.constexprs(flat.config, variants.CallFacts(log=False))["DENSE"] == variants.FLAT
    assert not plan_launch(record, 1823, 781, "float32", narrow=True).flat  # forward not named
    assert not plan_launch(record, 1823, 781, "float32", **backward).flat  # offsets beyond int32
    assert not plan_launch(record, 1822, 781, "float32", narrow=True, rows_per_group=911, **backward).flat
    dense = plan_launch(record, 8192, 1024, "float32", narrow=True, **backward)
    assert dense.dense and not dense.flat
    assert variants.constexprs(dense.config, variants.CallFacts(log=False))["DENSE"] is True
    # Taller tiles whose rows no longer fill them fall back from dense to flat, not to the general form.
    config = plan_grid.KernelConfig("tile", 16, 256, 1, 2, dense=True)
    assert not targets.dense_form(record, config, 32764, 256, 32764, True, True)
    assert targets.flat_form(record, dataclasses.replace(config, dense=False), 32764, 32764, True, True)


def test_tile_grids_fill_their_waves_where_the_tuning_table_asks():
    """H100, fp32 backward of 32768 rows of 128: tiles of 8 rows at 20 programs per SM take 4096
    programs, 1.55 waves of 2640; tiles of 16 at 16 per SM take 2048, one wave of 2112."""
    registers = {8: 48, 16: 64, 32: 128}
    resources = lambda config: KernelResources(registers=registers[config.block_m], shared_memory=0, num_warps=2)
    record = profile_record("h100")
    plan = plan_launch(record, 32768, 128, "float32", backward=True, resources=resources)
    assert (plan.block_m, plan.programs, plan.occupancy) == (16, 2048, 16) and "waves 0.97 full" in plan.reason
    assert plan_launch(record, 32768, 128, "float32", backward=True, resources=resources, programs=4096).block_m == 8
    spilling = lambda config: KernelResources(registers=registers[config.block_m], shared_memory=0, num_warps=2,
                                              spills=0 if config.block_m == 8 else 64)
    assert plan_launch(record, 32768, 128, "float32", backward=True, resources=spilling).block_m == 8
    assert plan_launch(profile_record("mi300x"), 32768, 128, "float32", backward=True).block_m == 8



def test_tile_grids_fill_their_waves_in_the_form_they_launch():
    """H100, bf16 backward of 32768 rows of 256 (registers as Triton 3.9 gave them): the dense form
    holds fewer registers than the masked one, so its 4-row tiles fill their waves (24 a unit, 2.59
    waves of 3168) where the masked ones did not (20 a unit, 3.1 of 2640). Judged in the masked form,
    16-row tiles won (8 a unit, 1.94 waves of 1056) and then launched dense at 12 a unit, 1.29 waves."""
    registers = {(4, False): 48, (8, False): 70, (16, False): 114, (4, True): 38, (8, True): 56, (16, True): 80}
    resources = lambda config: KernelResources(registers=registers[config.block_m, config.dense], shared_memory=0,
                                               num_warps=config.num_warps)
    record = profile_record("h100")
    target = targets.target_for(record)
    common = dict(backward=True, input_bytes=4, resources=resources)
    plan = plan_launch(record, 32768, 256, "float32", narrow=True, **common)
    assert (plan.block_m, plan.dense, plan.programs) == (4, True, 8192)
    assert planner.wave_fill(target, plan) >= tuning_for(record).tile_wave_fill
    # Where the call allows no dense form, the masked tiles fill their waves as before.
    masked = plan_launch(record, 32768, 256, "float32", **common)
    assert (masked.block_m, masked.dense) == (16, False) and "waves 0.97 full" in masked.reason
    # Taller tiles whose rows no longer fill them (32764 rows: 4-row tiles do, 16-row ones not) are
    # judged, and launched, masked: here the dense 4-row form holds as many registers as the masked.
    registers[4, True] = 48
    odd = plan_launch(record, 32764, 256, "float32", narrow=True, **common)
    assert (odd.block_m, odd.dense) == (16, False) and "waves 0.97 full" in odd.reason
