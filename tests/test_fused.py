"""The fused variants (``scale=``, ``mask=``, ``causal=``) against torch's composite of the same
definition in float64, forward and backward: rows in tiles and rows longer than a tile (the fused
kernels of every regime), and calls that are composed (a softmax over another dimension, a mask
whose leading strides do not merge), over the last dimension and others."""
from __future__ import annotations

import math

import pytest
import torch

import portable_softmax as ps
from portable_softmax import launch, launch_plan, tuning
from portable_softmax.selfcheck import relative_error, tolerance
from regimes import SPLIT_REGIMES, force_regime, interpreted, regime_of


def _reference(x, scale=None, mask=None, causal=False, log=False, dim=-1):
    """The definition in float64: x * scale, masked (bool: kept where True; floating: added),
    causal j > i masked; a row the bool mask leaves empty gives 0 (log: -inf)."""
    z = x.double()
    if scale is not None:
        z = z * (scale.double() if isinstance(scale, torch.Tensor) else scale)
    empty = None
    if mask is not None and mask.dtype == torch.bool:
        kept = mask.expand(z.shape)
        if causal:
            kept = kept & torch.ones(z.shape[-2], z.shape[-1], dtype=torch.bool, device=z.device).tril()
        empty = ~kept.any(dim, keepdim=True)
        z = z.masked_fill(~kept, -math.inf)
    else:
        if mask is not None:
            z = z + mask.double()
        if causal:
            z = z.masked_fill(torch.ones(z.shape[-2], z.shape[-1], dtype=torch.bool, device=z.device).triu(1),
                              -math.inf)
    y = (torch.log_softmax if log else torch.softmax)(z, dim)
    if empty is not None:
        y = torch.where(empty, -math.inf if log else 0.0, y)
    return y


def _compare(ours, expected, dtype, device):
    assert torch.equal(torch.isnan(ours), torch.isnan(expected)) and torch.equal(torch.isinf(ours), torch.isinf(expected))
    finite = torch.isfinite(expected)
    floor = tolerance(dtype, 0.0, device)
    assert relative_error(ours[finite], expected[finite]) <= floor


def _check_both_directions(x, kwargs, log, dtype, device, dim=-1):
    """Ours against the float64 definition, forward and the gradient of x through autograd."""
    function = ps.log_softmax if log else ps.softmax
    y = function(x, dim, **kwargs)
    assert y.dtype == dtype and y.shape == x.shape
    _compare(y, _reference(x.detach(), log=log, dim=dim, **kwargs), dtype, device)
    dy = torch.randn(x.shape, device=device).to(dtype)
    (dx,) = torch.autograd.grad(y, x, dy)
    reference_x = x.detach().double().requires_grad_()
    reference = _reference(reference_x, log=log, dim=dim, **kwargs)
    (expected_dx,) = torch.autograd.grad(reference, reference_x, dy.double())
    # Masked positions take no gradient (the composite's masked_fill gives them none either).
    kept = torch.isfinite(reference)
    assert not dx[~kept].any() and not expected_dx[~kept].any()
    assert relative_error(dx[kept], expected_dx[kept]) <= tolerance(dtype, 0.0, device) * 2


# A tile; a row longer than a tile (the loop kernels on the interpreter, split or loop on GPUs).
SHAPES = [(2, 3, 5, 7), (1, 2, 2, 70000)]


@pytest.mark.parametrize("shape", SHAPES, ids=["tile", "long"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("variant", ["scale", "bool_mask", "additive_mask", "causal", "all"])
def test_fused_variants_match_the_composite(device, shape, dtype, log, variant):
    x = (torch.randn(shape, device=device) * 3).to(dtype).requires_grad_()
    kwargs = {}
    if variant in ("scale", "all"):
        # Both signs: a negative scale must leave a block's padding out (one-row blocks skip the
        # select where they hold no padding, _fused_input).
        kwargs["scale"] = -0.37 if log else 0.37
    if variant in ("bool_mask", "all"):
        kwargs["mask"] = torch.rand(shape[0], 1, 1, shape[-1], device=device) > 0.3
    if variant == "additive_mask":
        kwargs["mask"] = torch.randn(1, 1, shape[-2], shape[-1], device=device)
    if variant in ("causal", "all"):
        kwargs["causal"] = True
    _check_both_directions(x, kwargs, log, dtype, device)


@pytest.mark.parametrize("regime", ["tile", "split", "ticketed", "pipelined", "loop", "windows"])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("variant", ["scale_tensor_bool_mask_causal", "number_additive_mask"])
def test_fused_variants_in_every_regime(device, monkeypatch, regime, log, variant):
    """Each regime's fused kernels (forced on rows of 1001: chunks of 128 where split, rows off
    16-byte boundaries in bf16 where windowed) against the float64 composite, forward and
    backward, with a row the bool mask leaves empty, and scales of both signs (a negative one
    must not turn the tile's padding into +inf). 20 rows (2 x 2 heads x 5 queries); the split
    regimes 10 rows of 129 on the interpreter (one head: 2 chunks forward, 3 backward; with
    fewer queries, causal rows keep too few keys for float32's error to stay within the bound:
    torch's own backward went past it for 3% of draws on 2 queries of 301 keys, none on these)."""
    forced = "split" if regime == "windows" else regime
    force_regime(monkeypatch, forced, device)
    key = (ps.device_info(device)["backend"], "*")
    if regime == "loop":
        # Chunks of 256, not force_regime's 128: still several a row, a partial last one, and
        # chunks causal masks whole, in half the interpreted steps (their fused terms made these
        # four cases a seventh of the CPU suite's time).
        monkeypatch.setitem(tuning.TUNING, key, tuning.replace(tuning.TUNING[key], loop_chunk=256))
    dtype = torch.float32
    if regime == "windows":
        monkeypatch.setitem(tuning.TUNING, key, tuning.replace(tuning.TUNING[key],
                                                               split_windows=frozenset({"forward", "backward"})))
        dtype = torch.bfloat16
    plans = _spy_plans(monkeypatch)
    shape = (2, 1, 5, 129) if forced in SPLIT_REGIMES and interpreted(device) else (2, 2, 5, 1001)
    batch, heads, queries, keys = shape
    x = (torch.randn(shape, device=device) * 3).to(dtype).requires_grad_()
    if variant == "scale_tensor_bool_mask_causal":
        mask = torch.rand(batch, 1, queries, keys, device=device) > 0.3
        mask[1, 0, queries - 2] = False
        kwargs = dict(scale=_signed_scale((batch, heads, queries, 1), device), mask=mask, causal=True)
    else:
        kwargs = dict(scale=-0.37, mask=torch.randn(1, 1, queries, keys, device=device))
    _check_both_directions(x, kwargs, log, dtype, device)
    # Both directions ran the forced regime's fused kernels (none composed).
    assert len(plans) == 2 and all(plan is not None for plan in plans)
    assert {regime_of(plan) for plan in plans} == {"split" if regime == "windows" else regime}
    if regime == "windows":
        assert all(plan.align == 8 for plan in plans)


def _signed_scale(shape, device) -> torch.Tensor:
    """Scales of magnitude 0.5-1.5, about half of them negative (a softmin, per row)."""
    sign = torch.where(torch.rand(shape, device=device) < 0.5, -1.0, 1.0)
    return (torch.rand(shape, device=device) + 0.5) * sign


def _spy_plans(monkeypatch) -> list:
    """The plans of the launches built from here on (a composed call builds none of its own)."""
    plans = []
    build = launch.build_record

    def spy(*args, **kwargs):
        record = build(*args, **kwargs)
        plans.append(record.plan)
        return record
    monkeypatch.setattr(launch, "build_record", spy)
    return plans


# Softmax over a dimension that is not the contiguous one: the fused terms at the rows of the
# strided path, numbered as x.movedim(dim, -1)'s. (shape, dim, arguments on a device.)
OTHER_DIMS = {
    # Channels of NCHW: a temperature per pixel (of both signs), a bool mask per image and
    # channel (one row of channels masked whole: it gives 0).
    "channels": ((3, 37, 4, 5), 1, lambda d: dict(
        scale=_signed_scale((3, 1, 4, 5), d),
        mask=torch.rand(3, 37, 1, 5, device=d).index_fill_(0, torch.tensor([1], device=d), 0) > 0.3)),
    # A column softmax with a mask per column entry and a number scale.
    "column": ((300, 8), 0, lambda d: dict(scale=0.37, mask=torch.rand(300, 1, device=d) > 0.2)),
    # The middle dim of three, an additive mask over the last two dims.
    "middle": ((2, 50, 7), 1, lambda d: dict(mask=torch.randn(50, 7, device=d))),
}


@pytest.mark.parametrize("case", OTHER_DIMS)
@pytest.mark.parametrize("regime", ["tile", "split", "loop"])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_fused_variants_over_other_dimensions(device, monkeypatch, case, regime, log):
    """Fused calls over a dimension with a stride run the strided path's fused kernels (tiles of
    rows side by side, split or streamed where forced), forward and backward, against the float64
    definition."""
    shape, dim, arguments = OTHER_DIMS[case]
    if regime != "tile":
        force_regime(monkeypatch, regime, device)
    plans = _spy_plans(monkeypatch)
    x = (torch.randn(shape, device=device) * 3).requires_grad_()
    _check_both_directions(x, arguments(device), log, torch.float32, device, dim)
    assert len(plans) == 2 and {regime_of(plan) for plan in plans} == {regime}


@pytest.mark.parametrize("keys, causal", [(2100, False), (5000, False), (5000, True)],
                         ids=["2100", "5000", "5000-causal"])
@pytest.mark.parametrize("dtype, mask_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16),
                                               (torch.float32, torch.float32), (torch.float64, torch.float64),
                                               (torch.bfloat16, None)],
                         ids=["bf16", "fp32-bf16-mask", "fp32", "fp64", "bf16-no-mask"])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_streamed_rows_reduced_in_lane_rows(device, monkeypatch, keys, causal, dtype, mask_dtype, log):
    """Blocks of 4096 stream in lane rows (``kernels.rows._online_stats``: as many as the narrowest
    element read has bytes: 2 of 2048 for bf16 or a bf16 mask, 4 of 1024 for float32, 8 of 512 for
    float64), each reduced within a thread before the lanes are: 2100 keys end in the first block,
    5000 leave the second block's later lane rows all padding; causal rows keep a few keys of
    their first lane row. Through a per-row scale tensor and an additive mask, rows of every
    extreme: a +inf and a NaN (NaN, as torch), one finite value among -inf, values far below
    zero, a maximum that arrives late (every lane's sum rescaled), a row of -inf only (NaN).
    Without the mask the scale alone is applied, without a select in the output pass
    (``kernels.fused._fused_load_rows``): the statistics pass must still see -inf in the
    padding, whatever the scale's sign (the last row's is negative)."""
    force_regime(monkeypatch, "loop", device)
    key = (ps.device_info(device)["backend"], "*")
    monkeypatch.setitem(tuning.TUNING, key, tuning.replace(tuning.TUNING[key], loop_chunk=4096))
    plans = _spy_plans(monkeypatch)
    shape = (1, 2, 4, keys)
    x = (torch.randn(shape, device=device) * 3).to(dtype)
    rows = x.view(-1, keys)
    rows[1, 3000 % keys] = math.inf
    rows[2, 2050] = math.nan
    rows[3] = -math.inf
    rows[3, 17] = 0.0
    rows[4] -= 1000.0
    rows[5, keys // 2:] += 30.0
    rows[6] = -math.inf
    # Positive but for the last row's (a softmin): a negative scale turns +inf into -inf.
    scale = torch.rand(1, 2, 4, 1, device=device) + 0.5
    scale[0, 1, 3] *= -1
    mask = torch.randn(1, 1, 4, keys, device=device).to(mask_dtype) if mask_dtype else None
    function = torch.log_softmax if log else torch.softmax
    y = (ps.log_softmax if log else ps.softmax)(x, -1, scale=scale, mask=mask, causal=causal)
    expected = _reference(x, scale=scale, mask=mask, causal=causal, log=log)
    assert torch.equal(y.isnan(), expected.isnan()) and torch.equal(y.isinf(), expected.isinf())
    # Judged against torch's composite in the dtype ours computes in (float32 for 16-bit x):
    # x * scale + mask rounds there as in ours, an error near |x| * 2**-24 on the rows far below
    # zero.
    wide = torch.promote_types(dtype, torch.float32)
    z = x.to(wide) * scale.to(wide) + (mask.to(wide) if mask is not None else 0)
    if causal:
        z = z.masked_fill(torch.ones(4, keys, dtype=torch.bool, device=device).triu(1), -math.inf)
    finite = expected.isfinite()
    torch_error = relative_error(function(z, -1).to(dtype)[finite], expected[finite])
    assert relative_error(y[finite], expected[finite]) <= tolerance(dtype, torch_error, device)
    assert len(plans) == 1 and regime_of(plans[0]) == "loop"
    assert (plans[0].block_m, plans[0].block_n) == (1, 4096)


def test_a_learnable_scale_over_another_dimension(device):
    """A per-pixel temperature of a channel softmax takes its gradient summed over the channels."""
    x = torch.randn(2, 9, 3, 4, device=device).requires_grad_()
    temperature = (torch.rand(2, 1, 3, 4, device=device) + 0.5).requires_grad_()
    y = ps.log_softmax(x, 1, scale=1 / temperature)
    reference_x = x.detach().double().requires_grad_()
    reference_t = temperature.detach().double().requires_grad_()
    reference = torch.log_softmax(reference_x / reference_t, 1)
    assert relative_error(y, reference) < 1e-5
    dy = torch.randn(x.shape, device=device)
    dx, dt = torch.autograd.grad(y, (x, temperature), dy)
    expected_dx, expected_dt = torch.autograd.grad(reference, (reference_x, reference_t), dy.double())
    assert relative_error(dx, expected_dx) < 1e-5 and relative_error(dt, expected_dt) < 1e-5


def test_causal_calls_plan_for_what_they_read(device, monkeypatch):
    """The launch tells the planner which calls are causal (their forward tiles read half)."""
    asked = []
    real = launch_plan.plan_launch
    monkeypatch.setattr(launch_plan, "plan_launch", lambda *a, **k: asked.append(k["causal"]) or real(*a, **k))
    x = torch.randn(2, 3, 5, 40, device=device)
    ps.softmax(x, -1, causal=True)
    ps.softmax(x, -1, scale=0.5)
    # (A call plans again where its compiled kernel's resources differ from the known ones.)
    assert asked[0] is True and asked[-1] is False and asked == sorted(asked, reverse=True)


def test_a_per_row_temperature_and_its_gradient(device):
    """A learnable per-row scale (CLIP's logit_scale, a temperature per row): the gradient reaches
    it as the composite's does."""
    x = torch.randn(6, 33, device=device).requires_grad_()
    temperature = (torch.rand(6, 1, device=device) + 0.5).requires_grad_()
    y = ps.softmax(x, -1, scale=1 / temperature)
    reference_x = x.detach().double().requires_grad_()
    reference_t = temperature.detach().double().requires_grad_()
    reference = torch.softmax(reference_x / reference_t, -1)
    assert relative_error(y, reference) < 1e-5
    dy = torch.randn(6, 33, device=device)
    dx, dt = torch.autograd.grad(y, (x, temperature), dy)
    expected_dx, expected_dt = torch.autograd.grad(reference, (reference_x, reference_t), dy.double())
    assert relative_error(dx, expected_dx) < 1e-5 and relative_error(dt, expected_dt) < 1e-5


def test_empty_and_all_negative_infinity_rows(device):
    x = torch.randn(3, 8, device=device)
    mask = torch.ones(3, 8, dtype=torch.bool, device=device)
    mask[1] = False
    assert torch.equal(ps.softmax(x, -1, mask=mask)[1], torch.zeros(8, device=device))
    assert torch.isneginf(ps.log_softmax(x, -1, mask=mask)[1]).all()
    additive = torch.zeros(3, 8, device=device)
    additive[2] = -math.inf
    y = ps.softmax(x, -1, mask=additive)
    assert torch.isnan(y[2]).all() and torch.isnan(torch.softmax(x + additive, -1)[2]).all()


def test_other_dimensions_and_causal_rectangles(device):
    x = torch.randn(4, 6, 5, device=device)
    mask = torch.rand(4, 1, 5, device=device) > 0.2
    _compare(ps.softmax(x, 1, scale=2.0, mask=mask), _reference(x, 2.0, mask, dim=1), torch.float32, device)
    wide = torch.randn(2, 3, 9, device=device)  # more keys than queries: top-left aligned
    _compare(ps.softmax(wide, -1, causal=True), _reference(wide, causal=True), torch.float32, device)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_causal_tiles_as_wide_as_their_rows_reach(device, log):
    """A causal tile computes only as wide as its rows keep (a quarter, a half or the whole
    block: rows of 1024 keys and 600 queries take all three; with 257 queries a tile of rows
    ends one past a quarter), and the rest of each row gets what a masked element gives: 0
    (log: -inf), 0 for a row the bool mask empties, NaN for a row an additive mask makes all
    -inf, as torch's composite."""
    function = ps.log_softmax if log else ps.softmax
    for queries in (600, 257):
        x = torch.randn(1, 2, queries, 1024, device=device, requires_grad=True)
        additive = torch.zeros(queries, 1024, device=device)
        additive[[3, 200, queries - 10]] = -math.inf
        for kwargs in (dict(causal=True), dict(causal=True, scale=0.5, mask=additive)):
            expected = _reference(x.detach(), log=log, **kwargs)
            assert torch.isnan(expected[0, :, 200]).all() == ("mask" in kwargs)
            _compare(function(x, -1, **kwargs), expected, torch.float32, device)
    mask = torch.rand(1, 1, queries, 1024, device=device) > 0.1
    mask[..., [5, 200, queries - 5], :] = False
    _check_both_directions(x, dict(causal=True, scale=0.5), log, torch.float32, device)
    _check_both_directions(x, dict(causal=True, mask=mask), log, torch.float32, device)


def test_meta_tensors_and_errors():
    x = torch.empty(2, 3, 4, device="meta")
    assert ps.softmax(x, -1, causal=True).shape == x.shape
    with pytest.raises(ValueError):
        ps.softmax(torch.randn(4), -1, causal=True)
    with pytest.raises(ValueError):
        ps.softmax(torch.randn(3, 4), 0, causal=True)
    with pytest.raises(ValueError):
        ps.softmax(torch.randn(3, 4), -1, mask=torch.ones(5, dtype=torch.bool))
    with pytest.raises(TypeError):
        ps.softmax(torch.randn(3, 4), -1, mask=torch.ones(3, 4, dtype=torch.int64))
    with pytest.raises(ValueError):
        ps.softmax(torch.randn(3, 4), -1, scale=torch.ones(3, 4))
    with pytest.raises(TypeError):
        ps.softmax(torch.randn(3, 4), -1, scale="hot")
