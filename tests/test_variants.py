"""The table of kernel variants (``portable_softmax.variants``) against the kernel source: every
kernel's parameters in the table's order, and exactly the constexprs the table gives it."""
from __future__ import annotations

import dataclasses
import inspect
import types

import pytest

from portable_softmax import kernels, variants


def _config(regime: str, **changes) -> types.SimpleNamespace:
    values = dict(regime=regime, block_m=1, block_n=1024, chunks=4 if regime == "split" else 1, chunks_p2=4,
                  num_stages=1, align=1, ticketed=False, reread=False, per_tile=False, dense=False, phased=False,
                  arrival=False, flat=False, whole=False, whole_loop=False)
    return types.SimpleNamespace(**{**values, **changes})


@pytest.mark.parametrize("direction", variants.DIRECTIONS)
@pytest.mark.parametrize("regime", variants.REGIMES)
def test_the_table_matches_the_kernel_source(direction, regime):
    kernel = getattr(kernels, variants.kernel_name(direction, regime))
    declared = [p.name for p in kernel.params if not p.is_constexpr]
    constexprs = [p.name for p in kernel.params if p.is_constexpr]
    assert list(variants.parameter_names(direction, regime)) == declared
    given = variants.constexprs(_config(regime), variants.CallFacts(log=True))
    # Constexprs with defaults (the tiles' windows) are named only where a config takes them.
    defaults = {name for name, p in inspect.signature(kernel.fn).parameters.items()
                if p.default is not inspect.Parameter.empty}
    assert sorted(given) == sorted(set(constexprs) - defaults)
    windowed = variants.constexprs(_config(regime, align=8), variants.CallFacts(log=True))
    assert sorted(windowed) == sorted(constexprs)
    strides = [(0, 7, 1)] * len(variants.TENSORS[direction])
    scalars = variants.scalar_arguments(_config(regime), 1, 10, 1000, strides)
    tensors = len(variants.tensor_names(direction, regime)) + (len(variants.SCRATCH) if regime == "split" else 0)
    assert len(scalars) + tensors == len(declared)


@pytest.mark.parametrize("direction, regime", [("forward", "tile"), ("forward", "split"), ("forward", "loop"),
                                               ("backward", "loop")])
def test_the_loss_table_matches_the_kernel_source(direction, regime):
    # The cross-entropy kernels (the split one's scratch and its split constexprs among them).
    kernel = getattr(kernels, variants.loss_kernel_name(direction, regime))
    declared = [p.name for p in kernel.params if not p.is_constexpr]
    constexprs = [p.name for p in kernel.params if p.is_constexpr]
    assert list(variants.loss_parameter_names(direction, regime)) == declared
    # Constexprs with defaults (the backward's windows) are named only where a config takes them.
    defaults = {name for name, p in inspect.signature(kernel.fn).parameters.items()
                if p.default is not inspect.Parameter.empty}
    given = variants.loss_constexprs(direction, _config(regime), variants.LossFacts())
    assert sorted(given) == sorted(set(constexprs) - defaults)
    windowed = variants.loss_constexprs(direction, _config(regime, align=8), variants.LossFacts())
    assert sorted(windowed) == sorted(constexprs)
    strides = [(0, 7, 1)] * len(variants.loss_row_tensors(direction))
    scalars = variants.loss_scalar_arguments(_config(regime), 1, 10, 1000, strides, (-100,))
    tensors = len(variants.LOSS_TENSORS[direction]) + (len(variants.SCRATCH) if regime == "split" else 0)
    assert len(scalars) + tensors == len(declared)
    # A split kernel's items are its rows' chunks.
    assert scalars[0] == (40 if regime == "split" else 10)
    with pytest.raises(ValueError):
        variants.loss_kernel_name("backward", "split")


def test_scalar_arguments_count_tiles_and_items():
    # 10 rows in tiles of 4: 3 tiles per group, 2 groups; a split row of 4 chunks: 24 items.
    assert variants.scalar_arguments(_config("tile", block_m=4), 2, 10, 64, [(640, 64, 1)] * 2)[:4] == (6, 3, 10, 64)
    assert variants.scalar_arguments(_config("split"), 2, 10, 4096, [(0, 4096, 1)] * 2)[:2] == (80, 10)


@pytest.mark.parametrize("changes, one_row", [({}, True), ({"ticketed": True}, False), ({"align": 8}, False)],
                         ids=["persistent", "ticketed", "windowed"])
def test_a_split_loss_of_one_group_takes_its_rows_as_groups_of_one(changes, one_row):
    # 10 rows of 1000 in one group, 4 chunks a row: (items, tiles a group, rows a group, columns,
    # the logits' strides (group, row, column), the targets'). As groups of one row, the 1s are
    # constants to Triton, and a group's stride is the row's.
    scalars = variants.loss_scalar_arguments(_config("split", **changes), 1, 10, 1000, [(0, 1000, 1), (0, 1, 0)],
                                             (-100,))
    assert scalars[:10] == ((40, 1, 1, 1000, 1000, 1000, 1, 1, 1, 0) if one_row
                            else (40, 10, 10, 1000, 0, 1000, 1, 0, 1, 0))
    # Groups of their own (N, C, d) keep them, as the tile and loop regimes always do.
    assert variants.loss_scalar_arguments(_config("split", **changes), 2, 10, 1000, [(10000, 1, 10)], (-100,))[:3] \
        == (80, 10, 10)
    assert variants.loss_scalar_arguments(_config("tile"), 1, 10, 1000, [(0, 1000, 1)], (-100,))[:3] == (10, 10, 10)


def test_options_ask_cooperation_only_for_persistent_split_grids():
    assert variants.options(_config("split"), 4, True)["launch_cooperative_grid"]
    assert "launch_cooperative_grid" not in variants.options(_config("split", ticketed=True), 4, True)
    assert "launch_cooperative_grid" not in variants.options(_config("split"), 4, False)
    assert "launch_cooperative_grid" not in variants.options(_config("tile"), 4, True)
    # By arrival no program waits: none either.
    assert "launch_cooperative_grid" not in variants.options(_config("split", arrival=True), 4, True)


def test_options_overlap_every_launch_but_a_cooperative_one():
    """``launch_pdl`` where asked (``kernels/dependency.py``), except on a cooperative grid, which
    the driver starts only after the kernel ahead of it ends (NOTES v42)."""
    assert variants.options(_config("tile"), 4, True, overlap=True)["launch_pdl"]
    assert variants.options(_config("split", ticketed=True), 4, True, overlap=True)["launch_pdl"]
    assert variants.options(_config("split"), 4, False, overlap=True)["launch_pdl"]
    assert "launch_pdl" not in variants.options(_config("split"), 4, True, overlap=True)
    assert "launch_pdl" not in variants.options(_config("tile"), 4, True)


def test_split_phases_launch_the_exchange_once_or_twice():
    """A split config waits in one launch, or (``phased``) publishes, then reads, in two: the
    PHASE each launch's constexprs give the kernel, as ``kernels.exchange`` numbers them."""
    from portable_softmax.kernels import exchange

    assert (variants.EXCHANGE_WAIT, variants.EXCHANGE_PUBLISH, variants.EXCHANGE_READ) == (
        exchange.EXCHANGE_WAIT.value, exchange.EXCHANGE_PUBLISH.value, exchange.EXCHANGE_READ.value)
    facts = variants.CallFacts(log=False)
    assert variants.launch_phases(_config("split")) == (variants.EXCHANGE_WAIT,)
    assert variants.constexprs(_config("split"), facts)["PHASE"] == variants.EXCHANGE_WAIT
    phased = _config("split", phased=True)
    assert variants.launch_phases(phased) == (variants.EXCHANGE_PUBLISH, variants.EXCHANGE_READ)
    assert [variants.constexprs(phased, facts, phase)["PHASE"] for phase in variants.launch_phases(phased)] == [1, 2]
    assert variants.constexprs(phased, facts)["PHASE"] == variants.EXCHANGE_PUBLISH
    with pytest.raises(ValueError, match="phase=0"):
        variants.constexprs(phased, facts, variants.EXCHANGE_WAIT)
    # Nothing waits in a phased grid: no cooperative launch.
    assert "launch_cooperative_grid" not in variants.options(phased, 4, True)
    assert variants.launch_phases(_config("tile", phased=True)) == (variants.EXCHANGE_WAIT,)


def test_an_arrival_split_config_exchanges_in_one_launch():
    # The loss's forward alone (``KernelConfig.arrival``): one launch, PHASE=EXCHANGE_ARRIVE (the
    # kernel's number too), whatever ``phased`` says; only that phase; no other regime has one.
    from portable_softmax.kernels import exchange

    assert variants.EXCHANGE_ARRIVE == exchange.EXCHANGE_ARRIVE.value == 3
    facts = variants.LossFacts()
    for phased in (False, True):
        arrival = _config("split", arrival=True, phased=phased)
        assert variants.launch_phases(arrival) == (variants.EXCHANGE_ARRIVE,)
        assert variants.loss_constexprs("forward", arrival, facts)["PHASE"] == variants.EXCHANGE_ARRIVE
        with pytest.raises(ValueError, match="arrival"):
            variants.loss_constexprs("forward", arrival, facts, variants.EXCHANGE_WAIT)
    assert variants.launch_phases(_config("tile", arrival=True)) == (variants.EXCHANGE_WAIT,)


def test_a_split_loss_grid_counts_its_targets_only_where_it_is_resident_and_writes_the_gradient():
    # COUNTED (``kernels/grid_count.py``): a persistent or two-launch split grid that writes the
    # gradient of a 'mean' asked to count; never a ticketed grid (its later programs start only as
    # earlier ones end), one by arrival (no gradient), another regime or a call not asked.
    asked = variants.LossFacts(write_grad=True, counted=True)
    assert variants.loss_constexprs("forward", _config("split"), asked)["COUNTED"]
    assert variants.loss_constexprs("forward", _config("split", phased=True), asked, variants.EXCHANGE_READ)["COUNTED"]
    for config, facts in ((_config("split", ticketed=True), asked), (_config("split", arrival=True), asked),
                          (_config("split"), dataclasses.replace(asked, write_grad=False)),
                          (_config("split"), dataclasses.replace(asked, counted=False))):
        assert not variants.loss_counts(config, facts)
    for regime in ("tile", "loop"):
        assert not variants.loss_counts(_config(regime), asked)
        assert "COUNTED" not in variants.loss_constexprs("forward", _config(regime), asked)
    # One int32 word: a count below 2**19, fewer than 2**12 arrivals; the kernel's constant the same.
    assert variants.grid_count_fits(2**19 - 1, 2**12 - 1)
    assert not variants.grid_count_fits(2**19, 528) and not variants.grid_count_fits(8192, 2**12)
    from portable_softmax.kernels import grid_count

    assert grid_count.ARRIVAL.value == 1 << variants.GRID_COUNT_BITS
    assert (2**12 - 1) * grid_count.ARRIVAL.value + grid_count.ARRIVAL.value - 1 == 2**31 - 1


def test_unknown_variants_are_refused():
    with pytest.raises(ValueError):
        variants.kernel_name("sideways", "tile")


@pytest.mark.parametrize("phase", variants.SHARDED_PHASES)
def test_the_sharded_table_matches_the_kernel_source(phase):
    kernel = getattr(kernels, variants.sharded_kernel_name(phase))
    declared = [p.name for p in kernel.params if not p.is_constexpr]
    constexprs = [p.name for p in kernel.params if p.is_constexpr]
    assert list(variants.sharded_parameter_names(phase)) == declared
    assert sorted(variants.sharded_constexprs(phase, _config("loop"), True, False, 3)) == sorted(constexprs)
    strides = [(0, 7, 1)] * len(variants.sharded_row_tensors(phase))
    scalars = variants.sharded_scalar_arguments(phase, _config("loop"), 1, 10, 1000, strides, 3)
    assert len(scalars) + len(variants.SHARDED_TENSORS[phase]) == len(declared)
    assert variants.sharded_constexprs("forward_normalize", _config("loop"), False, False, 3)["RANKS_P2"] == 4


def test_options_choose_floating_point_fusion():
    """The compile options say whether to fuse multiply-adds (Triton 3.9 warns on the first compile
    of a process that leaves it unset; 3.10 turns it off): none of them warns when a GPU backend
    reads them."""
    import importlib
    import warnings

    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend

    for config in (_config("tile"), _config("split")):
        options = variants.options(config, 4, True)
        assert options["enable_fp_fusion"] is True
        # A compile earlier in this process may have warned once (triton._utils: Triton 3.9; older
        # ones neither have it nor warn).
        utils = importlib.util.find_spec("triton._utils") and importlib.import_module("triton._utils")
        if utils and hasattr(utils, "warn_once"):
            utils.warn_once.cache_clear()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert CUDABackend(GPUTarget("cuda", 90, 32)).parse_options(options).enable_fp_fusion
