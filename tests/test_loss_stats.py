"""The stats of a 'mean' of class targets formed by one launch (``cross_entropy_stats``, called by
``loss_reduction.stats``) against the torch operations that formed them before (still the path of a
strided target), and the losses built on them against torch's (``test_loss.py``: every regime);
the reduced loss summed and cast by one launch (``cross_entropy_sum``, ``loss_reduction.reduced``).

The kernel runs through Triton's interpreter on CPU: a few hundred targets, two blocks where the
case needs more than one (``variants.STATS_BLOCK``)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import portable_softmax as ps
from portable_softmax import loss_arguments, loss_launch, loss_reduction, variants

# The values kept (smoothing, z-loss, softcap) are copied, not recomputed: float64 stats are exact.
TOLERANCE = {torch.float32: 1e-6, torch.float64: 1e-15}


def _options(n_classes, weighted, ignore_index=-100, smoothing=0.1, z_loss=0.01, softcap=7.0):
    return loss_arguments.Options(n_classes, False, "mean", ignore_index, smoothing, z_loss, softcap, weighted)


def _torch_stats(monkeypatch, x, target, weight, options):
    """The stats as the torch operations form them (the kernel's launch left out)."""
    with monkeypatch.context() as patch:
        patch.setattr(loss_reduction, "_launched_stats", lambda *args: None)
        return loss_reduction.stats(x, target, weight, options)


def _launched(x, target, weight, options):
    """The kernel's stats, and whether the call launched it (its layout kept with a record)."""
    before = dict(loss_launch.calls)
    stats = loss_reduction.stats(x, target, weight, options)
    kept = [found for key, found in loss_launch.calls.items() if key[0] == "stats" and key not in before]
    return stats, bool(kept) and kept[0][0] is not None


@pytest.mark.parametrize("acc", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("target_dtype", [torch.int64, torch.int32, torch.int16, torch.uint8])
@pytest.mark.parametrize("weighted", [False, True], ids=["counted", "weighted"])
def test_stats_match_the_torch_operations(monkeypatch, acc, target_dtype, weighted):
    torch.manual_seed(0)
    n_classes = 40
    x = torch.empty(300, n_classes, dtype=acc)
    target = torch.randint(0, n_classes, (300,))
    # ignore_index inside the classes for uint8 (it cannot hold -100: torch counts every target then).
    ignore_index = 3 if target_dtype == torch.uint8 else -100
    target[torch.rand(300) < 0.3] = ignore_index
    target = target.to(target_dtype)
    weight = torch.rand(n_classes, dtype=acc) + 0.5 if weighted else None
    options = _options(n_classes, weighted, ignore_index)
    ours, launched = _launched(x, target, weight, options)
    theirs = _torch_stats(monkeypatch, x, target, weight, options)
    assert launched
    assert ours.dtype == theirs.dtype == acc and ours.shape == (len(variants.LOSS_STATS),)
    torch.testing.assert_close(ours, theirs, rtol=TOLERANCE[acc], atol=0.0)
    # The count exact; the kept values copied bit for bit.
    assert ours[1].item() == int((target.long() != ignore_index).sum())
    assert torch.equal(ours[3:], theirs[3:])


@pytest.mark.parametrize("weighted", [False, True], ids=["counted", "weighted"])
def test_stats_over_several_blocks_of_targets_and_classes(monkeypatch, weighted):
    torch.manual_seed(1)
    n_classes = variants.STATS_BLOCK + 52
    positions = variants.STATS_BLOCK + 300
    # Only its shape, dtype and device are read: one element, expanded (not 1.1 GB).
    x = torch.empty(()).expand(positions, n_classes)
    target = torch.randint(0, n_classes, (positions,))
    target[torch.rand(positions) < 0.2] = -100
    weight = torch.rand(n_classes) + 0.5 if weighted else None
    options = _options(n_classes, weighted)
    ours, launched = _launched(x, target, weight, options)
    assert launched
    torch.testing.assert_close(ours, _torch_stats(monkeypatch, x, target, weight, options), rtol=1e-6, atol=0.0)


@pytest.mark.parametrize("shape", [(variants.STATS_BLOCK + 300, 7), (3, variants.STATS_BLOCK + 52)],
                         ids=["targets", "classes"])
@pytest.mark.parametrize("weighted", [False, True], ids=["counted", "weighted"])
def test_losses_over_several_blocks_of_targets_or_classes(shape, weighted):
    # Against torch: the count and summed weights over every block of targets, W over every block
    # of classes (the smoothing's term reads it).
    # (With the gradient: the forward alone of an unweighted 'mean' forms no stats, below.)
    torch.manual_seed(3)
    x = torch.randn(shape, requires_grad=True)
    target = torch.randint(0, shape[1], (shape[0],))
    target[torch.rand(shape[0]) < 0.3] = -100
    target[0] = 1
    weight = torch.rand(shape[1]) + 0.5 if weighted else None
    before = dict(loss_launch.calls)
    ours = ps.cross_entropy(x, target, weight, label_smoothing=0.1)
    assert [found[0] is not None for key, found in loss_launch.calls.items()
            if key[0] == "stats" and key not in before] == [True]
    theirs = F.cross_entropy(x.detach().double(), target, None if weight is None else weight.double(),
                             label_smoothing=0.1)
    assert abs(ours.item() - theirs.item()) <= 1e-5 * abs(theirs.item())


@pytest.mark.parametrize("weighted", [False, True], ids=["counted", "weighted"])
def test_stats_of_no_counted_target(weighted):
    x = torch.empty(5, 9)
    weight = torch.rand(9) + 0.5 if weighted else None
    for target in (torch.full((5,), -100), torch.zeros(0, dtype=torch.long)):
        stats, launched = _launched(x[:target.numel()], target, weight, _options(9, weighted))
        assert launched and stats[0].item() == 0.0 and stats[1].item() == 0.0
        assert stats[2].item() == pytest.approx(weight.sum().item() if weighted else 9.0)


def test_a_target_out_of_range_reads_no_weight():
    # (On CPU a call raises on it before: ``_check_targets``; an accelerator's loss there is NaN.)
    x = torch.empty(4, 6)
    weight = torch.tensor([100.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    target = torch.tensor([1, 6, -7, 2])
    stats, launched = _launched(x, target, weight, _options(6, True))
    assert launched
    # Its weight 0, read from nowhere (the torch operations read class 0's); counted all the same.
    assert stats[:3].tolist() == [3.0, 4.0, 115.0]


def test_a_strided_target_takes_the_torch_operations():
    torch.manual_seed(2)
    x = torch.randn(6, 11, requires_grad=True)
    target = torch.randint(0, 11, (6, 2))[:, 0]
    target[1] = -100
    weight = torch.rand(11) + 0.5
    for options in (dict(), dict(weight=weight, label_smoothing=0.1)):
        before = dict(loss_launch.calls)
        ours = ps.cross_entropy(x, target, **options)
        kept = [found for key, found in loss_launch.calls.items() if key[0] == "stats" and key not in before]
        assert kept and kept[0][0] is None
        torch.testing.assert_close(ours.double(), F.cross_entropy(x.double(), target, **{
            k: v.double() if torch.is_tensor(v) else v for k, v in options.items()}), rtol=1e-5, atol=0.0)


def test_sum_and_probability_targets_keep_their_constants():
    x = torch.empty(3, 5)
    before = len(loss_launch.calls)
    for options in (loss_arguments.Options(5, False, "sum", -100, 0.0, 0.0, None, False),
                    loss_arguments.Options(5, True, "mean", -100, 0.0, 0.0, None, False)):
        target = torch.zeros(3, dtype=torch.long) if not options.prob_target else torch.full((3, 5), 0.2)
        first, again = loss_reduction.stats(x, target, None, options), loss_reduction.stats(x, target, None, options)
        # The same kept tensor each call: no launch, no operation.
        assert first is again
    assert len(loss_launch.calls) == before


def _sum_block(wide: bool, counted: bool) -> int:
    """The sum kernel's one block on this machine (``loss_planner.plan_sum``)."""
    from portable_softmax import loss_planner
    from portable_softmax.device import device_record
    from portable_softmax.targets import target_for

    return loss_planner.plan_sum(target_for(device_record(torch.device("cpu"))), variants.SUM_BLOCK, wide,
                                 counted).block_n


@pytest.mark.parametrize("terms_dtype, dtype", [(torch.float32, torch.bfloat16), (torch.float32, torch.float32),
                                               (torch.float64, torch.float64)], ids=["bf16", "fp32", "fp64"])
def test_reduced_loss_is_one_launch_up_to_a_block_and_rounds_once(monkeypatch, terms_dtype, dtype):
    # Terms of both signs and mixed magnitudes, a block's worth less a few, the largest last: a sum
    # that drops a term, or rounds to the loss's dtype before the end, is off by far more than one
    # rounding. One more block's worth takes torch's sum (no launch kept).
    torch.manual_seed(5)
    options = _options(7, False)
    n_terms = _sum_block(torch.float64 in (terms_dtype, dtype), False) - 3
    terms = (torch.randn(n_terms, dtype=terms_dtype)
             * torch.logspace(-3, 3, 7).repeat(n_terms // 7 + 1)[:n_terms].to(terms_dtype))
    terms[-1] = 1000.0
    # No layout kept from other tests: this call builds its record and launches it.
    monkeypatch.setattr(loss_launch, "calls", {})
    ours = loss_reduction.reduced(terms, dtype, options)
    assert [found[0] is not None for key, found in loss_launch.calls.items() if key[0] == "sum"] == [True]
    expected = terms.double().sum().to(dtype)
    assert ours.dtype == dtype and ours.shape == ()
    tolerance = {torch.bfloat16: 0.0, torch.float32: 1e-5, torch.float64: 1e-12}[dtype]
    assert abs(ours.double() - expected.double()) <= tolerance * abs(expected.double()), (ours, expected)
    more = torch.cat([terms, terms])
    assert loss_reduction.reduced(more, dtype, options).double() == more.sum().to(dtype).double()
    assert [found[0] is None for key, found in loss_launch.calls.items()
            if key[0] == "sum" and key[2] == more.numel()] == [True]


def _kept_since(before, kind):
    """Whether each layout of ``kind`` ("stats", "sum") kept since ``before`` has a record."""
    return [found[0] is not None for key, found in loss_launch.calls.items() if key[0] == kind and key not in before]


@pytest.mark.parametrize("target_dtype", [torch.int64, torch.int32, torch.uint8], ids=["int64", "int32", "uint8"])
@pytest.mark.parametrize("options", [dict(), dict(label_smoothing=0.1, z_loss=1e-2, softcap=5.0)],
                         ids=["plain", "every-option"])
def test_the_forward_alone_of_a_counted_mean_divides_in_the_sum(monkeypatch, target_dtype, options):
    # An unweighted 'mean' with no gradient: its terms unscaled (no stats launched), the count of
    # the counted targets and the sum in the sum's one launch; torch's loss in float64, with the
    # z-loss's composite. A sum not divided, divided by the positions, or by the count of all
    # but one, is off by far more than the tolerance.
    torch.manual_seed(7)
    ignore_index = 3 if target_dtype == torch.uint8 else -100
    x = torch.randn(37, 50) * 3
    target = torch.randint(0, 50, (37,))
    target[torch.rand(37) < 0.3] = ignore_index
    target = target.to(target_dtype)
    monkeypatch.setattr(loss_launch, "calls", {})
    ours, lse = ps.cross_entropy(x, target, ignore_index=ignore_index, return_lse=True, **options)
    # The first call takes torch's division (the sum's kernel compiled beside), the second the kernel's.
    again = ps.cross_entropy(x, target, ignore_index=ignore_index, **options)
    assert _kept_since({}, "stats") == [] and _kept_since({}, "sum") == [True]
    x64, wide = x.double(), target.long()
    z = x64 if "softcap" not in options else 5.0 * torch.tanh(x64 / 5.0)
    counted = wide != ignore_index
    expected = F.cross_entropy(z, wide, ignore_index=ignore_index, label_smoothing=options.get("label_smoothing", 0.0))
    expected = expected + options.get("z_loss", 0.0) * (torch.logsumexp(z, 1)[counted] ** 2).mean()
    for found in (ours, again):
        assert found.dtype == x.dtype and abs(found.double() - expected) <= 1e-6 * abs(expected), (found, expected)
    torch.testing.assert_close(lse.double(), torch.logsumexp(z, 1), rtol=1e-6, atol=0.0)


def test_the_forward_alone_of_a_counted_mean_over_no_counted_target_is_nan(monkeypatch):
    monkeypatch.setattr(loss_launch, "calls", {})
    x, target = torch.randn(6, 9), torch.full((6,), -100)
    for _ in range(2):  # torch's division, then the kernel's
        assert torch.isnan(ps.cross_entropy(x, target)) and torch.isnan(F.cross_entropy(x, target))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64], ids=["bf16", "fp32", "fp64"])
def test_counted_mean_up_to_a_block_and_beyond(monkeypatch, dtype):
    # Terms and targets a block's worth less a few (one launch), then more than a block (torch's
    # operations): the sum of the terms over the counted targets, rounded once.
    torch.manual_seed(8)
    options = _options(7, False)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    monkeypatch.setattr(loss_launch, "calls", {})
    block = _sum_block(dtype == torch.float64, True)
    for n in (block - 3, block + 5):
        terms = torch.rand(n, dtype=acc) * 10
        target = torch.randint(0, 7, (n,))
        target[torch.rand(n) < 0.4] = -100
        target[-1] = 2
        ours = loss_reduction.counted_mean(terms, target, dtype, options)
        ours = loss_reduction.counted_mean(terms, target, dtype, options)  # the first compiled beside
        expected = terms.double().sum() / (target != -100).sum()
        tolerance = {torch.bfloat16: 2 ** -8, torch.float32: 1e-6, torch.float64: 1e-12}[dtype]
        assert ours.dtype == dtype and abs(ours.double() - expected) <= tolerance * expected, (n, ours, expected)
    assert [key[2] for key, found in loss_launch.calls.items() if key[0] == "sum" and found[0] is not None] == [
        block - 3]
