"""portable_softmax.cross_entropy, logsumexp and the nn modules against torch in float64.

Each case compares the loss and the input's gradient (relative error of the whole tensor) with
torch's ``F.cross_entropy`` of the same logits in float64; z-loss and softcap with their torch
composites. Cases are paired options, not their product (every kernel runs through Triton's
interpreter on the CPU): each option appears with several others, in every reduction, dtype and
target kind. Shapes are labelled with the path they take.
"""
from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

import portable_softmax as ps
from portable_softmax import launch, loss_launch, loss_ops, tuning, variants
from portable_softmax.selfcheck import relative_error
from regimes import SPLIT_REGIMES, force_regime, interpreted

# Relative error of the whole tensor allowed per dtype: the output's rounding (loss and gradient
# are rounded once to it), float32 for float32, near-exact for float64.
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def reference(x, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0, z_loss=0.0,
              softcap=None):
    """torch's loss in float64 of the same logits (a float64 leaf of them), with the z-loss and
    softcap as their definitions compose: z = softcap * tanh(x / softcap); + z_loss * lse^2 per
    counted position, reduced as the issue states ('mean': over the counted positions)."""
    leaf = x.detach().double().requires_grad_()
    z = softcap * torch.tanh(leaf / softcap) if softcap is not None else leaf
    prob = target.is_floating_point()
    t = target.double() if prob else target.long()
    w = weight.double() if weight is not None else None
    loss = F.cross_entropy(z, t, w, ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing)
    if z_loss:
        lse = torch.logsumexp(z, 0 if z.dim() == 1 else 1)
        counted = torch.ones_like(lse) if prob else (t != ignore_index).double()
        # An ignored position adds nothing, whatever its logits (a NaN or +inf lse times 0 is NaN).
        extra = torch.where(counted > 0, z_loss * lse**2, 0.0)
        if reduction == "mean":
            extra = extra.sum() / counted.sum()
        elif reduction == "sum":
            extra = extra.sum()
        loss = loss + extra
    return loss, leaf


def check(x, target, dtype_tol=None, grad_output=None, with_lse=False, **options):
    """Our loss and input gradient (``with_lse``: and lse) against ``reference``'s, within the
    dtype's tolerance."""
    tol = dtype_tol or TOLERANCE[x.dtype]
    ours_x = x.detach().clone().requires_grad_()
    ours = ps.cross_entropy(ours_x, target, return_lse=with_lse, **options)
    theirs, leaf = reference(x, target, **options)
    if with_lse:
        ours, lse = ours
        z = leaf.detach()
        if options.get("softcap") is not None:
            z = options["softcap"] * torch.tanh(z / options["softcap"])
        assert relative_error(lse, torch.logsumexp(z, 0 if z.dim() == 1 else 1)) < 1e-6
    assert ours.dtype == x.dtype and ours.shape == theirs.shape
    assert relative_error(ours, theirs) <= tol, (relative_error(ours, theirs), options)
    upstream = torch.randn_like(theirs) if grad_output is None else grad_output
    ours.backward(upstream.to(ours.dtype))
    theirs.backward(upstream.to(ours.dtype).double())
    assert ours_x.grad.dtype == x.dtype
    assert relative_error(ours_x.grad, leaf.grad) <= tol, (relative_error(ours_x.grad, leaf.grad), options)
    return ours_x.grad


def class_targets(shape, n_classes, device, ignored=0.0, dtype=torch.long):
    target = torch.randint(0, n_classes, shape, device=device)
    if ignored:
        target[torch.rand(shape, device=device) < ignored] = -100
    return target.to(dtype)


def logits(shape, dtype, device, spread=3.0):
    return (torch.randn(shape, device=device) * spread).to(dtype)


# (shape, dtype, target, options): every option with others, every reduction and dtype.
CASES = [
    pytest.param((5, 781), torch.float32, "class", dict(), id="plain-781-held"),
    pytest.param((5, 781), torch.bfloat16, "class", dict(reduction="sum", weight=True, label_smoothing=0.1),
                 id="bf16-sum-weight-smoothing-held"),
    pytest.param((4, 781), torch.float64, "class", dict(reduction="none", weight=True, ignored=0.3),
                 id="fp64-none-weight-ignored"),
    pytest.param((4, 1), torch.float32, "class", dict(label_smoothing=0.3), id="one-class"),
    pytest.param((3, 781), torch.float16, "class", dict(ignored=0.4, z_loss=1e-3, softcap=5.0),
                 id="fp16-ignored-zloss-softcap"),
    pytest.param((6, 33), torch.float32, "class", dict(weight=True, label_smoothing=0.2, ignored=0.3, z_loss=0.01),
                 id="mean-weight-smoothing-ignored-zloss"),
    pytest.param((2, 32001), torch.bfloat16, "class", dict(reduction="none", label_smoothing=0.1, softcap=30.0),
                 id="bf16-32001-none-smoothing-softcap"),
    pytest.param((2, 50257), torch.bfloat16, "class", dict(weight=True, label_smoothing=0.1),
                 id="bf16-50257-streamed-weight-smoothing"),
    pytest.param((5, 33), torch.float32, "prob", dict(weight=True, label_smoothing=0.1), id="prob-weight-smoothing"),
    pytest.param((4, 33), torch.float64, "prob", dict(reduction="sum", z_loss=0.01, softcap=4.0),
                 id="prob-fp64-sum-zloss-softcap"),
    pytest.param((3, 33), torch.bfloat16, "prob", dict(reduction="none"), id="prob-bf16-none"),
    pytest.param((3, 5, 4, 2), torch.float32, "class", dict(weight=True, label_smoothing=0.1, ignored=0.3),
                 id="spatial-classes-on-dim1"),
    pytest.param((2, 7, 3), torch.float64, "prob", dict(reduction="none", label_smoothing=0.2, weight=True),
                 id="spatial-prob-none"),
    pytest.param((2, 6, 5), torch.float32, "class", dict(reduction="none", z_loss=0.1, ignored=0.3),
                 id="spatial-none-zloss"),
]


def _case(shape, dtype, kind, options, device):
    options = dict(options)
    n_classes = shape[1] if len(shape) > 1 else shape[0]
    x = logits(shape, dtype, device) + options.pop("shift", 0.0)
    if kind == "prob":
        target = torch.softmax(torch.randn(shape, device=device) * 2, 1).to(dtype)
    else:
        target = class_targets((shape[0], *shape[2:]), n_classes, device, options.pop("ignored", 0.0))
    if options.pop("weight", False):
        options["weight"] = torch.rand(n_classes, device=device, dtype=dtype) + 0.5
    return x, target, options


@pytest.mark.parametrize("shape, dtype, kind, options", CASES)
def test_matches_torch(device, shape, dtype, kind, options):
    x, target, options = _case(shape, dtype, kind, options, device)
    check(x, target, **options)


@pytest.mark.parametrize("regime", ["tile", "loop"])
def test_every_option_in_each_regime(device, monkeypatch, regime):
    # 781 classes: a held tile row; forced to stream in chunks of 128 for "loop".
    force_regime(monkeypatch, regime, device)
    x, target, options = _case((4, 781), torch.float32, "class",
                               dict(weight=True, label_smoothing=0.15, ignored=0.3, z_loss=0.02, softcap=6.0),
                               device)
    for reduction in ("mean", "none"):
        check(x, target, reduction=reduction, **options)
    check(x, target, grad_output=torch.tensor(2.5), reduction="sum", **options)
    # Forward with and without the gradient, and the backward of 'none': each in the regime.
    assert {record.plan.regime for record in loss_launch._records.values() if record.plan.tiles > 1} == {regime}


@pytest.mark.parametrize("n_classes", [2100, 5000])
@pytest.mark.parametrize("kind", ["class", "prob"])
@pytest.mark.parametrize("block", [4096, 8192])
def test_streamed_blocks_reduced_in_lane_rows(device, monkeypatch, n_classes, kind, block):
    # Blocks of 4096 stream as 2 lane rows of 2048 (kernels.common._lane_columns), each reduced within
    # a thread into one running value a run of its vector's lanes (_vector_update): 2100 classes end inside the first block's second lane row, 5000
    # leave the second block's second lane row all padding. Blocks of 8192 (the CUDA rows' forward
    # alone, 4 lane rows at 8 warps): 5000 classes end in the third lane row, the fourth all
    # padding. Rows of every kind of extreme: a +inf and a NaN logit (NaN, as torch), a row of -inf
    # but its target, values far below zero.
    force_regime(monkeypatch, "loop", device)
    key = (ps.device_info(device)["backend"], "*")
    monkeypatch.setitem(tuning.TUNING, key, tuning.replace(tuning.TUNING[key], loop_chunk=4096, loss_alone_chunk=block,
                                                           loss_loop_warps=8))
    loss_launch._records.clear()
    x, target, options = _case((6, n_classes), torch.float32, kind,
                               dict(weight=True, label_smoothing=0.15, z_loss=0.02, softcap=6.0), device)
    x[1, 3000 % n_classes] = float("inf")
    x[2, 2050] = float("nan")
    x[3] = -float("inf")
    x[3, 17] = 0.0
    x[4] -= 1000.0
    if kind == "class":
        target[3] = 17
    for reduction in ("none", "sum"):
        ours = ps.cross_entropy(x, target, reduction=reduction, **options)
        expected, _ = reference(x, target, reduction=reduction, **options)
        assert torch.equal(ours.isnan(), expected.isnan()), (ours, expected)
    finite = [0, 3, 4, 5]
    check(x[finite], target[finite], reduction="mean", **options)
    assert {record.plan.regime for record in loss_launch._records.values()} == {"loop"}
    # The forward alone in its blocks; the passes that write the gradient (the check's) in 4096.
    alone = min(block, 4096 if n_classes < 4096 else 8192)
    assert {record.plan.block_n for record in loss_launch._records.values()} == {4096, alone}


@pytest.mark.parametrize("options", [{}, dict(weight=True, label_smoothing=0.15, z_loss=0.02, softcap=6.0)],
                         ids=["plain", "every-option"])
@pytest.mark.parametrize("layout", ["odd-stride", "sliced"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64], ids=["bf16", "fp32", "fp64"])
def test_streamed_forward_alone_reads_aligned_windows(device, monkeypatch, dtype, layout, options):
    # Rows off 16-byte boundaries: the forward alone (no gradient) streams them through aligned
    # windows (kernels.loss: ALIGN the elements in 16 bytes), the edge elements (at most
    # 2 (ALIGN - 1) a row, in the groups shared with the neighbouring rows) loaded apart and folded
    # into the row's maximum and sum, the smoothing's sum and the class weights (at the row's own
    # columns; float64 edges stay float64). Rows of 301 classes in blocks of 128: three window
    # chunks, a head edge in the first, a tail edge in the third. "odd-stride": rows 307 apart
    # from an aligned start, so their leads take every value; "sliced": rows of a padded
    # vocabulary (320), each starting aligned: a tail edge only. Extremes in the edges: a row's
    # largest logit, a +inf and a NaN (NaN, as torch), a row of -inf but its target; a +inf at
    # both edges of a row, and one beside a NaN in the head edge: lse as torch's logsumexp's
    # (+inf, or NaN with a NaN).
    force_regime(monkeypatch, "loop", device)
    n_rows, n_cols = 9, 301
    stride = 307 if layout == "odd-stride" else 320
    x = logits((n_rows * stride,), dtype, device).view(n_rows, stride)[:, :n_cols]
    target = class_targets((n_rows,), n_cols, device, ignored=0.2)
    x[1, 0] = 40.0
    x[1, -1] = 30.0
    x[2, -1] = float("inf")
    x[3, -2] = float("nan")
    x[4] = -float("inf")
    x[4, 0] = 0.0
    target[4] = 0
    x[5, 0], x[5, -1] = float("inf"), float("inf")
    x[6, 0], x[6, 1] = float("nan"), float("inf")
    options = dict(options)
    if options.pop("weight", False):
        options["weight"] = torch.rand(n_cols, device=device, dtype=dtype) + 0.5
    ours, lse = ps.cross_entropy(x, target, reduction="none", return_lse=True, **options)
    z = x.double()
    if options.get("softcap") is not None:
        z = options["softcap"] * torch.tanh(z / options["softcap"])
    _same_lse(lse, torch.logsumexp(z, 1))
    expected, _ = reference(x, target, reduction="none", **options)
    assert torch.equal(ours.isnan(), expected.isnan()), (ours, expected)
    finite = ~expected.isnan()
    assert relative_error(ours[finite], expected[finite]) <= TOLERANCE[dtype], relative_error(ours[finite],
                                                                                                expected[finite])
    plans = {(record.plan.regime, record.plan.align) for record in loss_launch._records.values()}
    assert plans == {("loop", 16 // x.element_size())}, plans


@pytest.mark.parametrize("options", [{}, dict(weight=True, label_smoothing=0.15, z_loss=0.02, softcap=6.0)],
                         ids=["plain", "every-option"])
@pytest.mark.parametrize("layout", ["contiguous", "odd-stride-inplace", "sliced"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64], ids=["bf16", "fp32", "fp64"])
def test_streamed_backward_reads_and_writes_aligned_windows(device, monkeypatch, dtype, layout, options):
    # reduction='none''s backward streams each row once, from the saved lse: rows off 16-byte
    # boundaries are read and their gradient written through aligned windows (kernels.loss:
    # ALIGN), the edges (in the groups shared with the neighbouring rows) apart, where the
    # gradient's rows lie as far past their windows as the logits' rows: a contiguous gradient
    # of contiguous logits (301 columns: leads 0, 5, 2, 7, ... in bf16), or the logits themselves
    # (``inplace_backward``, rows 307 apart). Rows sliced from a padded vocabulary (320) start
    # aligned, their new gradient does not: element by element. New buffers are poisoned (NaN):
    # an element the windows miss fails. Targets on a row's first and last column (its edges),
    # a row's largest logit in its head edge, a row of -inf but its target.
    force_regime(monkeypatch, "loop", device)
    loss_launch._records.clear()
    real_empty_like = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda t, **kw: real_empty_like(t, **kw).fill_(float("nan")))
    n_rows, n_cols = 9, 301
    stride = {"contiguous": n_cols, "odd-stride-inplace": 307, "sliced": 320}[layout]
    base = logits((n_rows * stride,), dtype, device)
    x = base.view(n_rows, stride)[:, :n_cols]
    target = class_targets((n_rows,), n_cols, device, ignored=0.2)
    target[1], target[2] = 0, n_cols - 1
    x[3, 0] = 40.0
    x[4] = -float("inf")
    x[4, 7] = 0.0
    target[4] = 7
    options = dict(options)
    if options.pop("weight", False):
        options["weight"] = torch.rand(n_cols, device=device, dtype=dtype) + 0.5
    inplace = layout == "odd-stride-inplace"
    source = base.clone().requires_grad_()
    # In place, the gradient goes into a buffer of its own (``source * 1.0``), not into a leaf's.
    given = ((source * 1.0) if inplace else source).view(n_rows, stride)[:, :n_cols]
    upstream = torch.randn(n_rows, device=device, dtype=dtype)
    ps.cross_entropy(given, target, reduction="none", inplace_backward=inplace, **options).backward(upstream)
    expected, reference_leaf = reference(x, target, reduction="none", **options)
    expected.backward(upstream.double())
    grad = source.grad.view(n_rows, stride)[:, :n_cols]
    assert torch.equal(grad.isnan(), reference_leaf.grad.isnan())
    finite = ~reference_leaf.grad.isnan()
    assert relative_error(grad[finite], reference_leaf.grad[finite]) <= TOLERANCE[dtype]
    windowed = {record.plan.align for key, record in loss_launch._records.items() if key[0] == "backward"}
    assert windowed == {1 if layout == "sliced" else 16 // x.element_size()}, windowed


def _forward_regimes() -> set:
    """The regimes (``regimes.regime_of``'s names) of the forward records the calls so far planned."""
    from regimes import regime_of

    return {regime_of(record.plan) for key, record in loss_launch._records.items() if key[0] == "forward"}


def _split(monkeypatch, device, regime="split", **changes):
    """Force ``regime`` (one of ``regimes.SPLIT_REGIMES``) for the loss's rows: on the interpreter
    its exchange in two launches. ``changes``: the tuning fields that size the chunks (the forced
    chunks of 128 elsewhere)."""
    force_regime(monkeypatch, regime, device)
    if changes:
        key = (ps.device_info(device)["backend"], "*")
        from portable_softmax import tuning

        monkeypatch.setitem(tuning.TUNING, key, tuning.replace(tuning.TUNING[key], **changes))
    loss_launch._records.clear()


# Split rows (``kernels/loss_split.py``), each case a few rows of a few chunks on the interpreter
# (an item is interpreted twice, ``regimes.interpreted``): (shape, dtype, options, tuning changes).
SPLIT_CASES = [
    # 3 chunks of 128, the last 44 long; every option; the gradient written in the forward.
    pytest.param("split", (3, 300), torch.float32, dict(weight=True, label_smoothing=0.15, ignored=0.3, z_loss=0.02,
                                                        softcap=6.0), {}, id="every-option-mean"),
    # 'sum' with an incoming gradient of 2.5: the held gradient rescaled.
    pytest.param("split", (2, 300), torch.bfloat16, dict(reduction="sum", ignored=0.3, softcap=3.0, weight=True), {},
                 id="bf16-sum"),
    # The forward alone (split: by arrival, the row's last chunk writing its terms) and the
    # streamed backward of 'none'.
    pytest.param("split", (3, 300), torch.float32, dict(reduction="none", weight=True, label_smoothing=0.1,
                                                        ignored=0.3, z_loss=0.01), {}, id="arrival-none"),
    # The forward alone with the waiting exchange (``loss_arrival`` off): a ticketed grid; pipelined
    # (a persistent grid whose next chunks load while it waits), rows read unaligned.
    pytest.param("ticketed", (3, 300), torch.float32, dict(reduction="none", weight=True, label_smoothing=0.1,
                                                           ignored=0.3, z_loss=0.01), {"loss_arrival": False},
                 id="ticketed-none"),
    pytest.param("pipelined", (3, 300), torch.bfloat16, dict(reduction="none", ignored=0.3, softcap=3.0),
                 {"loss_arrival": False}, id="pipelined-bf16-none"),
    # Odd vocabularies: rows off 16-byte boundaries in aligned windows (their edges apart).
    pytest.param("split", (2, 50257), torch.bfloat16, dict(weight=True, label_smoothing=0.1), {"split_chunk": 8192},
                 id="bf16-50257-windows"),
    pytest.param("split", (2, 32001), torch.float32, dict(reduction="none", z_loss=0.01, softcap=30.0,
                                                          label_smoothing=0.05), {"split_chunk": 8192},
                 id="fp32-32001-none"),
    # The gradient form pipelined (a persistent grid whose next chunks load while it waits; its
    # target's column stored behind a called barrier), every option the pipelined form is planned
    # with (class weights under smoothing are not: ``loss_planner.split_form``), in windows.
    pytest.param("pipelined", (3, 300), torch.bfloat16, dict(label_smoothing=0.1, ignored=0.3, z_loss=0.01, softcap=3.0),
                 {}, id="pipelined-bf16-grad"),
    pytest.param("pipelined", (3, 300), torch.float32, dict(weight=True, ignored=0.3, softcap=3.0), {},
                 id="pipelined-fp32-weight-grad"),
    pytest.param("pipelined", (2, 50257), torch.float32, dict(reduction="sum"), {"split_chunk": 8192},
                 id="pipelined-fp32-50257-grad"),
    # 16-bit logits: negative rows, fp16 with a softcap, in windows.
    pytest.param("split", (3, 300), torch.bfloat16, dict(reduction="sum", weight=True, label_smoothing=0.1,
                                                         ignored=0.3, z_loss=0.01, shift=-50.0), {}, id="bf16-negative"),
    pytest.param("ticketed", (2, 300), torch.float16, dict(softcap=3.0), {}, id="fp16-softcap"),
    pytest.param("split", (2, 50257), torch.bfloat16, dict(ignored=0.3), {"split_chunk": 8192}, id="bf16-50257-windows-plain"),
    # Rows a column short of 3 whole chunks of 128 through windows, a chunk more: the first row's
    # last chunk holds nothing, the next rows' their last few columns and the row's edges.
    pytest.param("split", (3, 383), torch.bfloat16, dict(weight=True, label_smoothing=0.1, ignored=0.3), {},
                 id="bf16-383-windows-a-chunk-more"),
]


def _forward_phases() -> set:
    """The PHASE of each launch of the forward records the calls so far planned, a tuple each."""
    return {tuple(c["PHASE"] for c in record.launches) for key, record in loss_launch._records.items()
            if key[0] == "forward"}


def _waiting_phases(device) -> tuple:
    """The PHASEs of the waiting exchange on ``device``: two launches on the interpreter."""
    return (1, 2) if interpreted(device) else (0,)


@pytest.mark.parametrize("regime, shape, dtype, options, changes", SPLIT_CASES)
def test_split_rows_match_torch(device, monkeypatch, regime, shape, dtype, options, changes):
    # Loss, lse and gradient against torch in float64, the rows held by several programs each; the
    # forward alone ('none': the gradient streamed after) by arrival unless ``loss_arrival`` is off.
    _split(monkeypatch, device, regime, **changes)
    x, target, options = _case(shape, dtype, "class", options, device)
    target[0] = shape[1] - 1  # the last column: in the last chunk, past the last whole group of a window
    check(x, target, with_lse=True, **options)
    alone = options.get("reduction") == "none" and changes.get("loss_arrival", True)
    assert _forward_regimes() == {"arrival" if alone else regime}
    assert _forward_phases() == {(3,) if alone else _waiting_phases(device)}
    if regime != "pipelined" and not alone:
        # Rows Triton cannot prove 16-byte aligned (a row stride not a multiple of 16) through
        # windows, a chunk more where the window needs it (``planner.window_align``).
        windowed = {record.launches[0]["ALIGN"] for key, record in loss_launch._records.items() if key[0] == "forward"}
        assert windowed == {1 if shape[1] % 16 == 0 else 16 // x.element_size()}
    if regime == "pipelined":
        # Pipelined, waiting or writing the gradient; by arrival a program an item, unpipelined.
        pipelined = {record.plan.num_stages > 1 for key, record in loss_launch._records.items() if key[0] == "forward"}
        assert pipelined == {not alone}


@pytest.mark.parametrize("inplace", [False, True], ids=["new-buffer", "inplace"])
def test_split_window_rows_with_targets_on_their_edges(device, monkeypatch, inplace):
    # bf16 rows of 301 classes start 0, 5, 2 and 7 elements into their aligned windows, so each but
    # the first has a first group shared with the row before, and each a last one shared with the
    # row after: the elements there (the edges) are worked apart, by the chunk that holds the
    # row's last element. Each row's target is one of its edge elements, first group or last: its
    # gradient's one-hot term must land after the edges' own values (one program writes both), and
    # in place the target's logit must be read before anything overwrites it.
    _split(monkeypatch, device)
    x, _, options = _case((4, 301), torch.bfloat16, "class", dict(weight=True, label_smoothing=0.1), device)
    target = torch.tensor([300, 0, 1, 0], device=device)
    for reduction, upstream in (("mean", None), ("sum", torch.tensor(2.5))):
        theirs, leaf = reference(x, target, reduction=reduction, **options)
        ours_x = x.detach().clone().requires_grad_()
        logits = ours_x * 1.0  # a non-leaf: the in-place gradient goes into its storage
        ours = ps.cross_entropy(logits, target, reduction=reduction, inplace_backward=inplace, **options)
        assert relative_error(ours, theirs) <= TOLERANCE[torch.bfloat16]
        ours.backward(None if upstream is None else upstream.to(ours.dtype))
        theirs.backward(None if upstream is None else upstream.double())
        assert relative_error(ours_x.grad, leaf.grad) <= TOLERANCE[torch.bfloat16], reduction
    assert _forward_regimes() == {"split"}
    windowed = {record.launches[0]["ALIGN"] for key, record in loss_launch._records.items() if key[0] == "forward"}
    assert windowed == {8}


def _stats_launched() -> bool:
    """Whether a call so far formed its stats by the stats kernel's launch (a kept layout of it)."""
    return any(key[0] == "stats" and found[0] is not None for key, found in loss_launch.calls.items())


@pytest.mark.parametrize("regime, grid", [("split", None), ("pipelined", None), ("split", "one"),
                                         ("pipelined", "wide"), ("split", "blocks")],
                         ids=["split", "pipelined", "one-program", "wider-than-its-items", "partials-in-blocks"])
def test_split_rows_count_their_targets_and_sum_their_loss(device, monkeypatch, regime, grid):
    # The default 'mean' with the gradient, its rows split: the forward's grid counts the targets
    # that are not ignored itself (``kernels/grid_count.py``; its stats hold 1), no stats launch,
    # and sums the loss itself (``kernels/grid_sum.py``), no sum launch after it. Calls back to
    # back, each ignoring another share (a count left over from the call before, or a counter not
    # reset, scales the loss and gradient wrongly; a loss left unwritten holds what its fresh
    # buffer held). ``grid``: one program (the
    # interpreter's: a resident grid is a multiple of its chunks) walking a slice of 40 positions,
    # more than a block of 32; or a grid wider than its items (2 rows of 3 chunks on 9 programs:
    # the plan's own grid widened after the first call, since no plan outnumbers its items and the
    # loss takes no forced grid), three programs that take no item, arrive nowhere and are neither
    # waited for nor counted out (a pipelined grid reads the count before its item loop, whatever
    # it takes), nor summed; or the last program's sum of 5 programs' partials in blocks of 2 (the
    # plan's grid widened to 5 as above; the block's size the interpreter's: it reads it as it runs).
    if grid in ("one", "blocks") and not interpreted(device):
        pytest.skip("the interpreter's grid (a resident split grid is a multiple of its chunks) and block")
    changes = {"max_programs": 1} if grid == "one" else {}
    if grid == "blocks":
        from portable_softmax.interpreter import interpreted_kernels

        monkeypatch.setattr(interpreted_kernels().grid_sum, "SUM_BLOCK", 2)
    _split(monkeypatch, device, regime, **changes)
    loss_launch.calls.clear()
    rows = {None: 7, "one": 40, "wide": 2, "blocks": 7}[grid]
    for step, ignored in enumerate((0.0, 0.5, 0.8, 0.2)):
        x = logits((rows, 300), torch.float32, device)
        target = class_targets((rows,), 300, device, ignored)
        target[0] = 1  # one counted at least: the 'mean' of none is NaN (its own test)
        check(x, target)
        if grid in ("wide", "blocks") and step == 0:
            for key, record in loss_launch._records.items():
                if key[0] == "forward":
                    record.plan = dataclasses.replace(record.plan, programs=9 if grid == "wide" else 5)
    counting = [record for key, record in loss_launch._records.items() if key[0] == "forward"]
    assert counting and all(loss_launch.counts(record) and loss_launch.sums(record) for record in counting)
    assert not _stats_launched() and not any(key[0] == "sum" for key in loss_launch.calls)
    if grid:
        assert {record.plan.programs for record in counting} == {{"one": 1, "wide": 9, "blocks": 5}[grid]}
    # The counters the grid used are left at 0 for the next launch.
    for pool in (launch._scratch, launch._phased_scratch):
        for _, counters in pool._buffers.values():
            assert not counters.any()


@pytest.mark.parametrize("regime", ["split", "pipelined"])
def test_split_rows_whose_programs_hold_whole_chunks(device, monkeypatch, regime):
    # A grid that is a multiple of its rows' chunks gives each program one chunk of every row, the
    # chunks of each group of programs rotated by the group's number; a program whose chunk lies
    # inside every row runs its loop with no column mask (``kernels/loss_split.py``). Rows of 320
    # in chunks of 128 (the last 64 long), 16-byte aligned (no windows), on 6 programs: two groups
    # of 3, rotated by 0 and 1 (the plan's own grid set after the first call, as above). The
    # logits are the first 7 rows of an 8-row buffer, their gradient written over them
    # (``inplace_backward``): a last chunk taken as whole reads and writes the next row's columns.
    _split(monkeypatch, device, regime)
    for step in range(3):
        h = logits((8, 320), torch.bfloat16, device).requires_grad_()
        target = class_targets((7,), 320, device, 0.3)
        target[:3] = torch.tensor([0, 127, 319])  # in the first, a whole and the last chunk
        reference = h.detach()[:7].double().requires_grad_()
        expected = F.cross_entropy(reference, target, label_smoothing=0.1)
        expected.backward()
        loss = ps.cross_entropy((h * 1.0)[:7], target, label_smoothing=0.1, inplace_backward=True)
        loss.backward()
        assert relative_error(loss, expected) <= TOLERANCE[torch.bfloat16]
        assert relative_error(h.grad[:7], reference.grad) <= TOLERANCE[torch.bfloat16]
        assert not h.grad[7].any()
        if step == 0:
            for key, record in loss_launch._records.items():
                if key[0] == "forward":
                    record.plan = dataclasses.replace(record.plan, programs=6)
    plans = [record.plan for key, record in loss_launch._records.items() if key[0] == "forward"]
    assert [(p.chunks, p.align, p.ticketed, p.programs, p.config.whole) for p in plans] == [(3, 1, False, 6, True)]


def test_split_rows_exchange_slots_lie_a_power_of_two_apart(device, monkeypatch):
    # A row's slots lie CHUNKS_P2 apart (``kernels.exchange._row_slots``), so that no row shares a
    # 128-byte line with another's polls. Rows of 300 in 3 chunks: slots 4 apart, the fourth never
    # written. The interpreter's two launches leave their slots full: each row's 3 hold partials,
    # the fourth and every slot past the rows stay empty (-1); a grid that waits empties its own
    # (a cleanup at another layout would leave some full).
    _split(monkeypatch, device)
    for pool in ("_scratch", "_phased_scratch"):
        monkeypatch.setattr(launch, pool, launch._Scratch())
    x = logits((5, 300), torch.bfloat16, device).requires_grad_()
    target = class_targets((5,), 300, device, 0.0)
    reference = x.detach().double().requires_grad_()
    F.cross_entropy(reference, target).backward()
    ps.cross_entropy(x, target).backward()
    assert relative_error(x.grad, reference.grad) <= TOLERANCE[torch.bfloat16]
    (record,) = [record for key, record in loss_launch._records.items() if key[0] == "forward"]
    assert record.plan.chunks == 3
    if interpreted(device):
        ((slots, _),) = launch._phased_scratch._buffers.values()
        rows = slots[:20].view(5, 4).cpu()
        assert (rows[:, :3] != -1).all() and (rows[:, 3] == -1).all() and (slots[20:] == -1).all()
    else:
        ((slots, _),) = launch._scratch._buffers.values()
        assert (slots == -1).all()


@pytest.mark.parametrize("regime", ["split", "pipelined"])
def test_split_rows_give_the_same_loss_and_gradient_every_call(device, monkeypatch, regime):
    # The grid sums its programs' partials in one fixed order (``kernels/grid_sum.py``: no float
    # atomics), so the same logits give the same bits every call, as torch's loss does; a sum in
    # the order programs finish would not (on a GPU).
    _split(monkeypatch, device, regime)
    x = logits((7, 300), torch.bfloat16, device)
    target = class_targets((7,), 300, device, 0.3)
    target[0] = 1
    results = []
    for _ in range(3):
        leaf = x.clone().requires_grad_()
        loss = ps.cross_entropy(leaf, target, label_smoothing=0.1)
        loss.backward()
        results.append((loss.detach(), leaf.grad))
    summing = [loss_launch.sums(record) for key, record in loss_launch._records.items() if key[0] == "forward"]
    assert summing and all(summing)
    for loss, grad in results[1:]:
        assert torch.equal(loss, results[0][0]) and torch.equal(grad, results[0][1])


def test_split_rows_with_every_target_ignored(device, monkeypatch):
    _split(monkeypatch, device)
    x = logits((2, 300), torch.float32, device).requires_grad_()
    target = torch.full((2,), -100, device=device)
    for reduction, options in (("mean", dict(label_smoothing=0.1)), ("sum", dict(z_loss=0.1))):
        ours = ps.cross_entropy(x, target, reduction=reduction, **options)
        theirs, _ = reference(x, target, reduction=reduction, **options)
        # 'mean' over no counted target: NaN, as torch's; 'sum': 0.
        assert torch.equal(ours.isnan(), theirs.isnan()) and (reduction == "mean" or ours.item() == 0.0)
        (grad,) = torch.autograd.grad(ours, x)
        assert torch.equal(grad, torch.zeros_like(grad))
    assert _forward_regimes() == {"split"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("regime", ["tile", "loop", "split", "pipelined"])
def test_ignored_rows_of_infinite_logits_have_a_zero_gradient(device, monkeypatch, regime, dtype):
    # Ignored rows whose exponentials are NaN (a +inf logit, a NaN, a row of -inf only): their
    # loss and their gradient are 0, exactly, in every regime. Every other factor is folded into one coefficient a
    # row (loss_terms._grad_of), which a NaN exponential would turn into NaN: the zeros are selected
    # there, or, for a 16-bit gradient of the split kernel, stored apart (loss_split._write_gradient).
    if regime in SPLIT_REGIMES:
        _split(monkeypatch, device, regime)
    else:
        force_regime(monkeypatch, regime, device)
    x = logits((4, 300), torch.float32, device)
    x[1, 7] = float("inf")
    x[2] = -float("inf")
    x[3, 250] = float("nan")
    x = x.to(dtype)
    target = torch.tensor([299, -100, -100, -100], device=device)
    # Their loss is 0 too, as torch's: an ignored row's +inf logit made it NaN until 2026-11-28.
    for reduction in ("none", "sum", "mean"):
        ours = ps.cross_entropy(x, target, reduction=reduction)
        theirs = F.cross_entropy(x.double(), target, reduction=reduction)
        assert torch.equal(ours.isnan(), theirs.isnan()), (reduction, ours, theirs)
        assert relative_error(ours, theirs) <= TOLERANCE[dtype], (reduction, ours, theirs)
    x.requires_grad_()
    (grad,) = torch.autograd.grad(ps.cross_entropy(x, target, reduction="sum"), x)
    assert torch.equal(grad[1:], torch.zeros_like(grad[1:]))
    leaf = x.detach()[:1].double().requires_grad_()
    F.cross_entropy(leaf, target[:1], reduction="sum").backward()
    assert relative_error(grad[:1], leaf.grad) <= TOLERANCE[dtype]


def _same_lse(ours, theirs):
    """``ours`` (float32) is torch's logsumexp ``theirs`` (float64): NaN, +inf and -inf where it is,
    the finite values within float32's rounding."""
    theirs = theirs.to(ours.dtype)
    assert torch.equal(ours.isnan(), theirs.isnan()), (ours, theirs)
    infinite = theirs.isinf()
    assert torch.equal(ours.isinf(), infinite) and torch.equal(ours[infinite], theirs[infinite]), (ours, theirs)
    finite = theirs.isfinite()
    assert relative_error(ours[finite], theirs[finite]) < 1e-6


def _same_nans(ours, theirs, tol):
    """``ours`` is NaN where ``theirs`` is, and within ``tol`` of it elsewhere."""
    assert torch.equal(ours.isnan(), theirs.isnan()), (ours, theirs)
    finite = ~theirs.isnan()
    assert relative_error(ours[finite], theirs[finite]) <= tol


@pytest.mark.parametrize("regime", ["tile", "loop", "split", "arrival", "ticketed", "pipelined"])
def test_lse_of_rows_holding_infinities_is_torchs(device, monkeypatch, regime):
    # torch's logsumexp takes its exponentials against 0 where a row's maximum is infinite: a row
    # holding +inf has lse +inf (NaN with a NaN too), where against the maximum, inf - inf, ours was
    # NaN until 2026-11-28 (kernels.common._lse_reference; the split's exchange, MAXIMA_LSE). The
    # loss and the gradient of a counted row holding +inf stay NaN, torch's (the gradient's
    # p = exp(z - lse) would be 0 but at the +inf); an ignored one's are 0, its lse +inf. Rows of
    # 301 classes: the split regimes' chunks of 128 take the +inf in one chunk, or in two, beside
    # a NaN in its own chunk or in another; off 16-byte boundaries, the split and the loop's
    # forward alone read them through aligned windows, a +inf in a head edge (row 1, its lead 1)
    # and in a tail edge (row 7). The forward alone (logsumexp, 'none') and with the gradient
    # ('sum'); the split forward alone by arrival, or (the others) by the waiting exchange.
    if regime == "tile":
        force_regime(monkeypatch, regime, device)
    elif regime == "loop":
        force_regime(monkeypatch, regime, device)
        loss_launch._records.clear()
    else:
        _split(monkeypatch, device, "split" if regime == "arrival" else regime, loss_arrival=regime == "arrival")
    inf, nan = float("inf"), float("nan")
    x = logits((9, 301), torch.float32, device)
    x[1, 0] = inf
    x[2, 5], x[2, 250] = inf, inf
    x[3, 10], x[3, 200] = inf, nan
    x[4, 20], x[4, 60] = nan, inf
    x[5] = -inf
    x[6, 100] = nan
    x[7, 300] = inf
    x[8, :128] = -inf
    x[8, 131] = inf
    target = torch.tensor([1, 2, 3, 4, 5, 6, 7, -100, 300], device=device)
    theirs = torch.logsumexp(x.double(), 1)
    _same_lse(ps.logsumexp(x, 1), theirs)
    # Plain, and with the z-loss (its term 2 z_loss lse p, inf times 0, was NaN where the plain
    # gradient was not) and smoothing.
    for reduction, options in itertools.product(("none", "sum"), ({}, dict(label_smoothing=0.1, z_loss=0.01))):
        ours_x = x.clone().requires_grad_()
        loss, lse = ps.cross_entropy(ours_x, target, reduction=reduction, return_lse=True, **options)
        _same_lse(lse, theirs)
        expected, leaf = reference(x, target, reduction=reduction, **options)
        _same_nans(loss.detach(), expected.detach(), TOLERANCE[torch.float32])
        loss.backward(torch.ones_like(loss))
        expected.backward(torch.ones_like(expected))
        # The ignored row's gradient 0 where torch's is NaN (log_softmax's backward of a NaN row,
        # times 0): test_ignored_rows_of_infinite_logits_have_a_zero_gradient.
        counted = target != -100
        _same_nans(ours_x.grad[counted], leaf.grad[counted], TOLERANCE[torch.float32])
        assert torch.equal(ours_x.grad[7], torch.zeros_like(ours_x.grad[7]))
    if regime in ("tile", "loop"):
        assert {record.plan.regime for record in loss_launch._records.values() if record.plan.tiles > 1} == {regime}
    else:
        assert _forward_regimes() == {regime} | ({"split"} if regime == "arrival" else set())
    # Windows (4 fp32 elements) wherever the forward reads them: the loop's forward alone, the split's
    # unpipelined forms.
    aligns = {record.plan.align for key, record in loss_launch._records.items() if key[0] == "forward"}
    assert aligns == {"tile": {1}, "loop": {1, 4}, "pipelined": {1}}.get(regime, {4}), aligns


def test_split_rows_confident_bf16_and_far_below_zero(device, monkeypatch):
    # A confident row (p = 0.999 on the true class: its gradient p - 1 formed in float32, rounded
    # once), a row far below zero (exp underflows against 0), and a row whose first chunk is -inf
    # only, its others far below zero (that chunk's probabilities 0, not 0 * inf).
    _split(monkeypatch, device)
    n_classes = 300
    x = logits((4, n_classes), torch.float32, device)
    target = torch.tensor([3, 100, 200, 299], device=device)
    x[0] = 0.0
    x[0, 3] = math.log(0.999 * (n_classes - 1) / 0.001)
    x[1] = x[1] - 1000.0
    x[2, :128], x[2, 128:] = -float("inf"), x[2, 128:] - 1000.0
    x = x.to(torch.bfloat16).requires_grad_()
    loss, lse = ps.cross_entropy(x, target, return_lse=True)
    loss.backward()
    leaf = x.detach().double().requires_grad_()
    expected = F.cross_entropy(leaf, target)
    expected.backward()
    assert relative_error(loss, expected) <= TOLERANCE[torch.bfloat16]
    assert relative_error(lse, torch.logsumexp(leaf.detach(), 1)) < 1e-6
    assert abs(leaf.grad[0, 3].item() - (-0.001 / 4)) < 2e-5
    assert abs(x.grad[0, 3].double().item() / leaf.grad[0, 3].item() - 1) <= 2**-8
    assert relative_error(x.grad, leaf.grad) <= TOLERANCE[torch.bfloat16]
    assert _forward_regimes() == {"split"}


@pytest.mark.parametrize("arrival", [True, False], ids=["arrival", "waiting"])
def test_split_rows_logsumexp(device, monkeypatch, arrival):
    # logsumexp takes the forward alone (every position ignored): rows of -inf only, with a NaN,
    # far above and far below zero; by arrival (one launch, none waiting), and with the switch off
    # the waiting exchange (two launches on the interpreter). Twice: the arrival counters must be
    # back at 0 for the second call (each row's last resets its own).
    _split(monkeypatch, device, loss_arrival=arrival)
    x = logits((5, 300), torch.float32, device)
    x[1] = -float("inf")
    x[2, 17] = float("nan")
    x[3] += 1e4
    x[4] -= 1e4
    theirs = torch.logsumexp(x.double(), 1)
    for _ in range(2):
        ours = ps.logsumexp(x, 1)
        assert torch.equal(ours.isnan(), theirs.isnan()) and torch.equal(ours.isinf(), theirs.isinf())
        finite = theirs.isfinite()
        infinite = theirs.isinf()
        assert relative_error(ours[finite], theirs[finite]) < 1e-6
        assert torch.equal(ours[infinite], theirs[infinite].float())
    assert _forward_regimes() == {"arrival" if arrival else "split"}
    assert _forward_phases() == {(3,) if arrival else _waiting_phases(device)}


def test_split_rows_by_arrival_every_option_twice(device, monkeypatch):
    # The forward alone by arrival with every option (class weights, smoothing, z-loss, softcap,
    # ignored rows), its target in the first chunk (the last one loads it from another's columns)
    # and in the last; then again on other logits: each row's counter reset, slots left full,
    # the second call's loss its own logits'.
    _split(monkeypatch, device)
    for seed in range(2):
        torch.manual_seed(seed)
        x, target, options = _case((3, 300), torch.float32, "class", dict(reduction="none", weight=True,
                                   label_smoothing=0.1, ignored=0.3, z_loss=0.02, softcap=6.0), device)
        target[0], target[1] = 5, 299
        ours, lse = ps.cross_entropy(x, target, return_lse=True, **options)
        theirs, leaf = reference(x, target, **options)
        z = 6.0 * torch.tanh(leaf.detach() / 6.0)
        assert relative_error(ours, theirs) <= TOLERANCE[torch.float32]
        assert relative_error(lse, torch.logsumexp(z, 1)) < 1e-6
    assert _forward_regimes() == {"arrival"} and _forward_phases() == {(3,)}
    # Its pool's invariant (``launch._phased_scratch``: counters 0 between launches); the waiting
    # pool, whose slots must stay empty, untouched.
    from portable_softmax import launch

    assert launch._phased_scratch._buffers and not any(c.any() for _, c in launch._phased_scratch._buffers.values())
    assert all((slots == -1).all() for slots, _ in launch._scratch._buffers.values())


def test_split_rows_inplace_backward(device, monkeypatch):
    # The gradient written over the logits: each chunk reads its columns (the target's logit among
    # them, where they hold it) before it writes them.
    _split(monkeypatch, device)
    h = torch.randn(3, 300, device=device, requires_grad=True)
    target = class_targets((3,), 300, device, 0.25)
    target[0] = 299
    logits = h * 2.0
    ps.cross_entropy(logits, target, label_smoothing=0.1, inplace_backward=True).backward()
    leaf = (h.detach().double() * 2).requires_grad_()
    F.cross_entropy(leaf, target, label_smoothing=0.1).backward()
    assert relative_error(h.grad, 2 * leaf.grad) <= TOLERANCE[torch.float32]
    assert relative_error(logits.detach(), leaf.grad) <= TOLERANCE[torch.float32]
    assert _forward_regimes() == {"split"}


@pytest.mark.parametrize("layout", ["classes-on-dim1", "sliced-bf16"])
def test_split_rows_of_strided_logits(device, monkeypatch, layout):
    # Classes strided (an (N, C, d) input: column stride d, rows side by side), and rows sliced from
    # a padded vocabulary (read in windows, the contiguous gradient written at their columns).
    _split(monkeypatch, device)
    if layout == "classes-on-dim1":
        x = logits((2, 300, 2), torch.float32, device)
        target = class_targets((2, 2), 300, device, 0.25)
    else:
        x = logits((3, 320), torch.bfloat16, device)[:, :300]
        target = class_targets((3,), 300, device, 0.25)
    check(x, target, label_smoothing=0.1, weight=torch.rand(300, device=device, dtype=x.dtype) + 0.5)
    assert _forward_regimes() == {"split"}
    if layout == "sliced-bf16":
        assert {record.plan.align for key, record in loss_launch._records.items() if key[0] == "forward"} == {8}


def test_integer_target_dtypes_and_strided_logits(device):
    # Transposed logits (classes strided), a target of int32, rows sliced from a padded vocabulary.
    base = logits((781, 6), torch.float32, device)
    target = class_targets((6,), 781, device, 0.2, torch.int32)
    check(base.t(), target)
    padded = logits((5, 800), torch.bfloat16, device)
    check(padded[:, :781], class_targets((5,), 781, device, 0.2, torch.int16), reduction="sum")


def test_one_dimensional_input(device):
    x = logits((781,), torch.float32, device)
    check(x, torch.tensor(17, device=device), label_smoothing=0.1)
    check(x, torch.softmax(torch.randn(781, device=device), 0), reduction="sum")


def test_every_target_ignored(device):
    x = logits((3, 33), torch.float32, device).requires_grad_()
    target = torch.full((3,), -100, device=device)
    for options in (dict(), dict(label_smoothing=0.1, weight=torch.rand(33, device=device)), dict(z_loss=0.1)):
        ours = ps.cross_entropy(x, target, **options)
        theirs = F.cross_entropy(x.double(), target, **{k: v.double() if torch.is_tensor(v) else v
                                                         for k, v in options.items() if k != "z_loss"})
        assert torch.isnan(ours) and torch.isnan(theirs)
        (grad,) = torch.autograd.grad(ours, x)
        assert torch.equal(grad, torch.zeros_like(grad))
    assert ps.cross_entropy(x, target, reduction="sum").item() == 0.0
    assert torch.equal(ps.cross_entropy(x, target, reduction="none"), torch.zeros(3, device=device))


def test_empty_batch(device):
    x = torch.randn(0, 7, device=device, requires_grad=True)
    target = torch.zeros(0, dtype=torch.long, device=device)
    assert torch.isnan(ps.cross_entropy(x, target)) and torch.isnan(F.cross_entropy(x, target))
    loss = ps.cross_entropy(x, target, reduction="sum")
    loss.backward()
    assert loss.item() == 0.0 and x.grad.shape == (0, 7)
    assert ps.cross_entropy(x, target, reduction="none").shape == (0,)


def test_confident_bf16_row_keeps_its_gradient(device):
    # p = 0.999 on the true class: its gradient p - 1 = -0.001 (over the batch) must keep its
    # value to bf16 rounding, not become 0 or lose its digits (formed in float32, rounded once).
    n_classes = 781
    x = torch.zeros(4, n_classes, device=device)
    target = torch.tensor([3, 100, 500, 780], device=device)
    x[torch.arange(4), target] = math.log(0.999 * (n_classes - 1) / 0.001)
    x = x.to(torch.bfloat16).requires_grad_()
    ps.cross_entropy(x, target).backward()
    leaf = x.detach().double().requires_grad_()
    F.cross_entropy(leaf, target).backward()
    true_ours, true_exact = x.grad[torch.arange(4), target].double(), leaf.grad[torch.arange(4), target]
    assert (true_exact - (-0.001 / 4)).abs().max() < 2e-5
    assert ((true_ours - true_exact).abs() / true_exact.abs()).max() <= 2**-8
    assert relative_error(x.grad, leaf.grad) <= TOLERANCE[torch.bfloat16]


def test_return_lse(device):
    x = logits((3, 5, 2), torch.bfloat16, device)
    target = class_targets((3, 2), 5, device)
    loss, lse = ps.cross_entropy(x, target, softcap=2.0, return_lse=True)
    assert lse.dtype == torch.float32 and lse.shape == target.shape and not lse.requires_grad
    expected = torch.logsumexp(2.0 * torch.tanh(x.double() / 2.0), 1)
    assert relative_error(lse, expected) < 1e-6


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_inplace_backward(device, reduction):
    h = torch.randn(4, 781, device=device, requires_grad=True)
    target = class_targets((4,), 781, device, 0.25)
    logits = h * 2.0
    loss = ps.cross_entropy(logits, target, reduction=reduction, inplace_backward=True)
    storage = logits.data_ptr()
    loss.sum().backward()
    leaf = (h.detach().double() * 2).requires_grad_()
    F.cross_entropy(leaf, target, reduction=reduction).sum().backward()
    assert relative_error(h.grad, 2 * leaf.grad) <= TOLERANCE[torch.float32]
    # The gradient is in the logits' own storage now.
    assert logits.data_ptr() == storage and relative_error(logits.detach(), leaf.grad) <= TOLERANCE[torch.float32]


def test_inplace_backward_bumps_the_version(device):
    h = torch.randn(4, 33, device=device, requires_grad=True)
    logits = h * 2.0
    aux = (logits ** 2).sum()  # saves the logits for its backward
    loss = ps.cross_entropy(logits, class_targets((4,), 33, device), inplace_backward=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (loss + aux).backward()


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_differentiable_once(device, reduction):
    # The backward skips once_differentiable's wrapper where no graph is built: where one is (an
    # incoming gradient that requires one), a second differentiation must still raise.
    x = torch.randn(4, 33, device=device, requires_grad=True)
    loss = ps.cross_entropy(x, class_targets((4,), 33, device), reduction=reduction)
    incoming = torch.full_like(loss, 2.0).requires_grad_()
    (grad,) = torch.autograd.grad(loss, x, incoming, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grad.sum().backward()


def test_meta_tensors():
    x = torch.empty(8, 50257, 3, device="meta", dtype=torch.bfloat16)
    target = torch.empty(8, 3, device="meta", dtype=torch.long)
    loss, lse = ps.cross_entropy(x, target, return_lse=True)
    assert loss.shape == () and loss.dtype == torch.bfloat16 and loss.device.type == "meta"
    assert lse.shape == (8, 3) and lse.dtype == torch.float32
    assert ps.cross_entropy(x, target, reduction="none").shape == (8, 3)
    assert ps.logsumexp(x, (1, 2), keepdim=True).shape == (8, 1, 1)


def test_autocast_as_torch(device):
    if not torch.amp.is_autocast_available(device):
        pytest.skip(f"no autocast for {device}")
    x = logits((4, 33), torch.bfloat16, device)
    target = class_targets((4,), 33, device)
    with torch.autocast(device, dtype=torch.bfloat16):
        ours, theirs = ps.cross_entropy(x, target), F.cross_entropy(x, target)
    assert ours.dtype == theirs.dtype
    assert relative_error(ours, F.cross_entropy(x.double(), target)) < 1e-5 if theirs.dtype == torch.float32 else True


@pytest.mark.skipif(not loss_ops.AVAILABLE, reason="torch.library.custom_op needs torch >= 2.4")
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_torch_compile_fullgraph(device, reduction):
    import torch._dynamo

    torch._dynamo.reset()
    x = logits((4, 33), torch.float32, device)
    target = class_targets((4,), 33, device, 0.25)
    weight = torch.rand(33, device=device)

    def step(x, target, weight):
        loss, lse = ps.cross_entropy(x, target, weight, reduction=reduction, z_loss=0.01, return_lse=True)
        return loss.sum() + ps.logsumexp(x, -1).sum(), lse

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    ours_x = x.clone().requires_grad_()
    (loss, lse) = compiled(ours_x, target, weight)
    loss.backward()
    ref_x = x.clone().requires_grad_()
    theirs = step(ref_x, target, weight)[0]
    theirs.backward()
    assert relative_error(loss, theirs) < 1e-6 and relative_error(ours_x.grad, ref_x.grad) < 1e-6


def test_logsumexp_matches_torch(device):
    x = logits((3, 781, 4), torch.float32, device).requires_grad_()
    for dim, keepdim in ((1, False), (-1, True), (0, False), ((0, 2), False), ((2, 1), True)):
        ours = ps.logsumexp(x, dim, keepdim)
        theirs = torch.logsumexp(x.double(), dim, keepdim)
        assert ours.shape == theirs.shape and relative_error(ours, theirs) < 1e-6
        upstream = torch.randn(theirs.shape, device=device)
        (ours_grad,) = torch.autograd.grad(ours, x, upstream)
        (their_grad,) = torch.autograd.grad(torch.logsumexp(x.double(), dim, keepdim), x, upstream.double())
        assert relative_error(ours_grad, their_grad) < 1e-5
    special = torch.tensor([[-math.inf, -math.inf], [0.0, -math.inf], [1e4, 1e4]], device=device)
    assert torch.equal(ps.logsumexp(special, 1), torch.logsumexp(special, 1))
    bf16 = logits((5, 50), torch.bfloat16, device)
    assert ps.logsumexp(bf16, 1).dtype == torch.bfloat16
    assert relative_error(ps.logsumexp(bf16, 1), torch.logsumexp(bf16.double(), 1)) < TOLERANCE[torch.bfloat16]
    assert ps.logsumexp(torch.tensor(2.0, device=device), 0).item() == 2.0


def test_nn_modules(device):
    x = logits((4, 33), torch.float32, device)
    target = class_targets((4,), 33, device, 0.25)
    weight = torch.rand(33, device=device)
    ours = ps.nn.CrossEntropyLoss(weight, label_smoothing=0.1, reduction="sum")(x, target)
    theirs = torch.nn.CrossEntropyLoss(weight.double(), label_smoothing=0.1, reduction="sum")(x.double(), target)
    assert relative_error(ours, theirs) < 1e-5
    assert relative_error(ps.nn.Softmax(dim=0)(x), torch.softmax(x.double(), 0)) < 1e-5
    assert relative_error(ps.nn.LogSoftmax(dim=1)(x), torch.log_softmax(x.double(), 1)) < 1e-5
    assert isinstance(ps.nn.CrossEntropyLoss(z_loss=0.1, return_lse=True)(x, target), tuple)


@pytest.mark.parametrize("call, error, match", [
    (lambda x, t: ps.cross_entropy(x, t.float()), ValueError, "target of class probabilities"),
    (lambda x, t: ps.cross_entropy(x, t[:2]), ValueError, "target of class indices must have shape"),
    (lambda x, t: ps.cross_entropy(x, t.bool()), TypeError, "target must hold class indices"),
    (lambda x, t: ps.cross_entropy(x, t, torch.ones(5)), ValueError, r"weight must have shape \(7,\)"),
    (lambda x, t: ps.cross_entropy(x, t, reduction="avg"), ValueError, "reduction must be one of"),
    (lambda x, t: ps.cross_entropy(x, t, label_smoothing=1.5), ValueError, "label_smoothing"),
    (lambda x, t: ps.cross_entropy(x, t, softcap=0.0), ValueError, "softcap"),
    (lambda x, t: ps.cross_entropy(x, t, z_loss=math.nan), ValueError, "z_loss"),
    (lambda x, t: ps.cross_entropy(x.long(), t), TypeError, "input must be float16"),
    (lambda x, t: ps.cross_entropy(x, torch.softmax(x, 1), ignore_index=2), ValueError, "ignore_index"),
    (lambda x, t: ps.logsumexp(x, 2), IndexError, "dim 2 is out of range"),
])
def test_errors_name_the_argument(call, error, match):
    x = torch.randn(4, 7)
    t = torch.tensor([0, 1, 2, 6])
    with pytest.raises(error, match=match):
        call(x, t)


def test_target_out_of_range_raises_on_cpu():
    x = torch.randn(3, 7)
    with pytest.raises(IndexError, match="target 7 is out of bounds for 7 classes"):
        ps.cross_entropy(x, torch.tensor([0, 7, -100]))
    with pytest.raises(IndexError, match="target -3 is out of bounds"):
        ps.cross_entropy(x, torch.tensor([0, -3, 1]), reduction="none")


@pytest.mark.parametrize("name", ["cuda", "hip", "npu"])
def test_target_out_of_range_is_nan_on_accelerators(name):
    from conftest import PRESENT, TORCH_DEVICE

    if not PRESENT[name]:
        pytest.skip(f"no {name} device here (CPU raises instead: test_target_out_of_range_raises_on_cpu)")
    x = torch.randn(3, 7, device=TORCH_DEVICE[name])
    rows = ps.cross_entropy(x, torch.tensor([0, 7, -100], device=x.device), reduction="none")
    assert torch.isnan(rows[1]) and not torch.isnan(rows[0]) and rows[2].item() == 0.0
    assert torch.isnan(ps.cross_entropy(x, torch.tensor([0, 7, 1], device=x.device)))


def test_more_than_2_31_logits(device):
    if device == "cpu":
        pytest.skip("2**31 logits through the interpreter would take hours: accelerators only")
    n_classes, rows = 131072, 2**31 // 131072 + 2
    if torch.cuda.get_device_properties(0).total_memory < 24 * rows * n_classes:
        pytest.skip("not enough device memory for 2**31 bf16 logits and their gradient")
    x = torch.randn(rows, n_classes, device=device, dtype=torch.bfloat16).requires_grad_()
    target = torch.randint(0, n_classes, (rows,), device=device)
    ps.cross_entropy(x, target).backward()
    last = x[-3:].detach().double().requires_grad_()
    F.cross_entropy(last, target[-3:], reduction="sum").backward()
    assert relative_error(x.grad[-3:], last.grad / rows) <= TOLERANCE[torch.bfloat16]


def test_graph_capture(device):
    if device != "cuda":
        pytest.skip("CUDA graphs: cuda only")
    x = logits((64, 32001), torch.bfloat16, device).requires_grad_()
    target = class_targets((64,), 32001, device, 0.1)
    loss_launch._records.clear()
    for _ in range(2):  # warm up: compile and plan before capture
        x.grad = None
        ps.cross_entropy(x, target, label_smoothing=0.1).backward()
    # ``torch.cuda.graph`` captures on a stream of its own, whose split scratch the warm-up never
    # grew: the capture takes buffers of its own from the graph's pool (``launch._Scratch``), and
    # its rows stay split, each replay finding them clean.
    graph = torch.cuda.CUDAGraph()
    x.grad = None
    with torch.cuda.graph(graph):
        loss = ps.cross_entropy(x, target, label_smoothing=0.1)
        loss.backward()
    assert _forward_regimes() == {"split"}
    for _ in range(2):
        with torch.no_grad():
            x.copy_(logits((64, 32001), torch.bfloat16, device))
        graph.replay()
        theirs, leaf = reference(x.detach(), target, label_smoothing=0.1)
        theirs.backward()
        assert relative_error(loss, theirs) <= TOLERANCE[torch.bfloat16]
        assert relative_error(x.grad, leaf.grad) <= TOLERANCE[torch.bfloat16]


def test_a_split_record_keeps_its_pools_buffers_until_the_pool_grows(device, monkeypatch):
    # A repeated call takes the buffers its record's last launch took, without the pool's lookup
    # (its lock); once the pool has grown (another layout's rows), it asks again and takes the
    # grown buffers, whose slots are the ones kept clean.
    _split(monkeypatch, device)
    pool = launch._Scratch()
    for name in ("_scratch", "_ticket_scratch", "_counted_scratch", "_phased_scratch"):
        monkeypatch.setattr(launch, name, pool)
    lookups = []
    real = pool.lookup
    monkeypatch.setattr(pool, "lookup", lambda *args: lookups.append(args[2]) or real(*args))

    def checked(rows: int) -> None:
        x = logits((rows, 300), torch.bfloat16, device).requires_grad_()
        target = class_targets((rows,), 300, device, 0.2)
        reference = x.detach().double().requires_grad_()
        F.cross_entropy(reference, target).backward()
        loss = ps.cross_entropy(x, target)
        loss.backward()
        assert relative_error(loss, F.cross_entropy(reference.detach(), target)) <= TOLERANCE[torch.bfloat16]
        assert relative_error(x.grad, reference.grad) <= TOLERANCE[torch.bfloat16]

    checked(5)
    assert len(lookups) == 1
    checked(5)
    assert len(lookups) == 1, "a repeated call looked its scratch up again"
    checked(40)
    grown = pool.generation
    assert len(lookups) == 2 and grown >= 2
    checked(5)
    assert len(lookups) == 3, "a call after the pool grew kept the buffers of before"
    (record,) = [r for key, r in loss_launch._records.items() if key[0] == "forward" and r._held is not None
                 and r.plan.tiles == 5]
    assert record._held[2] is next(iter(pool._buffers.values())) and record._held[1] == grown


def test_a_capture_takes_scratch_of_its_own(device, monkeypatch):
    # Split scratch that would have to grow during a graph capture: the launch's own buffers,
    # filled (slots empty, counters 0) and kept nowhere, where the stream's stay as they were.
    from portable_softmax import launch

    pool = launch._Scratch()
    kept = pool.get(torch.device(device), 7, 4, 2)
    module = getattr(torch, torch.device(device).type)
    monkeypatch.setattr(module, "is_current_stream_capturing", lambda: True, raising=False)
    assert pool.get(torch.device(device), 7, 4, 2) is kept
    slots, counters = pool.get(torch.device(device), 7, 9, 3)
    assert slots.tolist() == [-1] * 9 and counters.tolist() == [0] * 3
    assert pool.get(torch.device(device), 7, 9, 3)[0] is not slots
    assert pool.get(torch.device(device), 7, 4, 2) is kept


def test_calls_back_to_back_read_their_own_counts(device):
    """Calls queued back to back, forward + backward and forward alone, each with targets ignoring
    another share of the positions: a 'mean' divided by a previous call's count (what a launch
    overlapping the kernel before it would read without its wait, ``kernels/dependency.py``)
    would be off by tens of percent. Each result as torch's, compared after they all ran."""
    if device != "cuda":
        pytest.skip("launches that overlap the kernel before them: cuda only (elsewhere calls run in order)")
    x = logits((4096, 32000), torch.bfloat16, device).requires_grad_()
    kept = []
    for share in (0.0, 0.9, 0.3, 0.6, 0.1, 0.8):
        target = class_targets((4096,), 32000, device, share)
        x.grad = None
        loss = ps.cross_entropy(x, target)
        loss.backward()
        with torch.no_grad():
            alone = ps.cross_entropy(x, target)
        kept.append((target, loss.detach(), x.grad, alone))
    for target, loss, grad, alone in kept:
        theirs, leaf = reference(x.detach(), target)
        theirs.backward()
        assert relative_error(loss, theirs) <= TOLERANCE[torch.bfloat16]
        assert relative_error(alone, theirs) <= TOLERANCE[torch.bfloat16]
        assert relative_error(grad, leaf.grad) <= TOLERANCE[torch.bfloat16]


def test_repeated_call_is_one_record(device):
    x = logits((4, 33), torch.float32, device)
    target = class_targets((4,), 33, device)
    ps.cross_entropy(x, target)
    records = len(loss_launch._records)
    for _ in range(3):
        ps.cross_entropy(logits((4, 33), torch.float32, device), target)
    assert len(loss_launch._records) == records


def test_strided_incoming_gradient_of_none(device):
    # 'none': the backward kernel reads the incoming gradient through its strides (here a
    # transposed one of the (N, d) positions, and one expanded from a single value).
    x = logits((3, 33, 4), torch.float32, device)
    target = class_targets((3, 4), 33, device, 0.25)
    check(x, target, grad_output=torch.randn(4, 3, device=device).t(), reduction="none", z_loss=0.01)
    check(x, target, grad_output=torch.tensor(0.5, device=device).expand(3, 4), reduction="none")


@pytest.mark.parametrize("profile", ["h100", "mi300x", "ascend910b"])
def test_plans_for_recorded_chips(profile):
    # The pure planner, for chips that are not here: whole rows in tiles while they fit (half as
    # long where the gradient is formed from them), longer ones streamed; grids within limits.
    from portable_softmax import loss_planner, plan_grid, profiles, targets

    target = targets.target_for(profiles.profile_record(profile))
    limit = plan_grid._row_limit(target.tuning, "float32", True)
    for n_rows, n_cols in ((8192, 781), (8192, limit), (8192, limit + 1), (4096, 256000), (1, 50257)):
        for writes in (True, False):
            plan = loss_planner.plan_loss(target, n_rows, n_cols, "float32", writes_gradient=writes, input_bytes=2)
            held = plan_grid.next_power_of_2(n_cols) <= plan_grid._row_limit(target.tuning, "float32", writes)
            assert plan.regime == ("tile" if held else "loop"), (n_cols, writes, plan.reason)
            assert plan.block_n >= (plan_grid.next_power_of_2(n_cols) if held else 1)
            assert 1 <= plan.programs <= min(plan.tiles, target.record.grid_limit)


def test_weighted_smoothing_split_rows_run_unpipelined():
    # Class weights under label smoothing are loaded a column beside the logits, and a pipelined
    # split form would stage them too (H200, bf16 8192x32000: 1 program an SM, 0.870 ms forward +
    # backward against 4 and 0.389 unpipelined, NOTES v53): that form runs unpipelined; weights
    # alone (the target's weight only) and smoothing alone keep the pipeline, as a softcap alone
    # keeps its warps. Through the call's
    # planning too, from its facts, on the shipped tables.
    from portable_softmax import launch_plan, loss_planner, profiles, targets
    from portable_softmax.kernel_resources import table_for
    from portable_softmax.row_layout import RowView

    record = profiles.profile_record("h200")
    target = targets.target_for(record)
    options = dict(writes_gradient=True, input_bytes=2, rereads=True, splittable=True)
    plain = loss_planner.plan_loss(target, 8192, 32000, "float32", **options)
    weighted = loss_planner.plan_loss(target, 8192, 32000, "float32", column_loads=True, **options)
    assert (plain.regime, weighted.regime) == ("split", "split")
    # (Triton 3.2 builds no pipelined form: there the plain form is unpipelined too.)
    pipelines = target.tuning.loss_gradient_pipelined
    assert (plain.num_stages > 1) == pipelines and weighted.num_stages == 1, (plain.reason, weighted.reason)
    # With a softcap too (each element's tanh held across the exchange), over twice the warps
    # (fp32 1.109 ms at 8 warps against 1.621 at 4).
    capped = loss_planner.plan_loss(target, 8192, 32000, "float32", column_loads=True, softcap=True, **options)
    assert (capped.num_stages, capped.num_warps) == (1, 2 * weighted.num_warps), capped.reason
    assert loss_planner.plan_loss(target, 8192, 32000, "float32", softcap=True, **options).num_warps == plain.num_warps
    strides = tuple((0, 32000, 1) if name in ("x", "grad") else (0, 1, 0)
                    for name in variants.loss_row_tensors("forward"))
    table = table_for(record.backend, record.arch, "3.6.0")
    known = launch_plan.known_resources(target, table, "bfloat16", True, 2)
    stages = {}
    for name, facts in (("weight", dict(weight=True, summed=True)), ("smoothing", dict(smoothing=True, summed=True)),
                        ("both", dict(weight=True, smoothing=True, summed=True))):
        facts = variants.LossFacts(write_grad=True, wait_atomic=target.tuning.split_wait_atomic, **facts)
        call = launch_plan.LossCall("forward", RowView(1, 8192, 32000, strides), facts, (-100,), 2, True, 1,
                                    record.cooperative_launch)
        plan, _ = launch_plan.plan_cross_entropy(target, call, known, known)
        stages[name] = (plan.regime, plan.num_stages)
    assert stages["both"] == ("split", 1), stages
    assert (stages["weight"][1] > 1) == pipelines and (stages["smoothing"][1] > 1) == pipelines, stages


def test_streamed_forward_alone_plans_windows():
    # The H200 streams the forward alone (loss_split: the gradient's form only): bf16 rows of
    # 50257 (every other row start off 16-byte boundaries) through windows of 8 elements, a row a
    # tile; the forward that writes the gradient streams without them (its second pass has none);
    # the backward ('none': one read, one write a row) reads and writes through them.
    from portable_softmax import loss_planner, planner, profiles, targets

    target = targets.target_for(profiles.profile_record("h200"))
    align = planner.contiguous_align(4096, 50257, 2)
    assert align == 8
    alone = loss_planner.plan_loss(target, 4096, 50257, "float32", writes_gradient=False, input_bytes=2,
                                   splittable=True, align=align)
    assert (alone.regime, alone.align, alone.block_m) == ("loop", 8, 1), alone.reason
    assert "aligned windows of 8" in alone.reason
    streamed = dict(writes_gradient=True, input_bytes=2, align=align)
    assert loss_planner.plan_loss(target, 4096, 50257, "float32", rereads=True, **streamed).align == 1
    backward = loss_planner.plan_loss(target, 4096, 50257, "float32", **streamed)
    assert (backward.regime, backward.align, backward.block_m) == ("loop", 8, 1), backward.reason
    # Aligned rows (50256) take none.
    assert loss_planner.plan_loss(target, 4096, 50256, "float32", writes_gradient=False, input_bytes=2,
                                  splittable=True, align=planner.contiguous_align(4096, 50256, 2)).align == 1


def test_split_rows_of_many_chunks_leave_the_whole_loop_out():
    # The whole loop's registers cost rows of many chunks a program an SM, which they want more
    # (``Tuning.loss_whole_chunks``, the CUDA rows' 16): on the H200 bf16 rows of 256000 and 151936
    # (32 and 19 chunks of 8192) leave it out, rows of 128256 and 32000 (16, 4) keep it; the
    # forward alone has none; a limit of 0 gives it to every row.
    from portable_softmax import loss_planner, profiles, targets

    target = targets.target_for(profiles.profile_record("h200"))
    assert target.tuning.loss_whole_chunks == 16
    for n_cols, chunks, whole in ((256000, 32, False), (151936, 19, False), (128256, 16, True), (32000, 4, True)):
        plan = loss_planner.plan_loss(target, 4096, n_cols, "float32", writes_gradient=True, input_bytes=2,
                                      splittable=True)
        assert (plan.regime, plan.chunks, plan.config.whole) == ("split", chunks, whole), plan.reason
    alone = loss_planner.plan_loss(target, 4096, 32000, "float32", writes_gradient=False, input_bytes=2,
                                   splittable=True)
    assert not alone.config.whole
    every = dataclasses.replace(target, tuning=dataclasses.replace(target.tuning, loss_whole_chunks=0))
    assert loss_planner.plan_loss(every, 4096, 256000, "float32", writes_gradient=True, input_bytes=2,
                                  splittable=True).config.whole


@pytest.mark.parametrize("profile", ["h100", "h200", "mi300x", "ascend910b"])
def test_split_plans_are_the_softmax_forwards(profile):
    # A forward of class targets over rows longer than a tile that writes the gradient splits
    # where the chip promises residency, sized as the softmax forward of the same rows (chunks,
    # windows, grid, pipeline: its barrier lies behind a call); the forward alone splits on every
    # chip, by arrival (``split_config``'s chunks, a program per item, one launch), or with
    # ``loss_arrival`` off as the softmax forward where residency is promised; elsewhere, for
    # probability targets, the backward, or with the tuning's loss_split empty, it streams.
    from portable_softmax import loss_planner, planner, profiles, split_planner, targets

    own = targets.target_for(profiles.profile_record(profile))
    if "loss" not in own.tuning.loss_split:
        # The CUDA rows stream the forward alone (NOTES v37), in their own blocks and warps.
        for n_cols in (256000, 50257):
            plan = loss_planner.plan_loss(own, 4096, n_cols, "float32", writes_gradient=False, input_bytes=2,
                                          splittable=True)
            assert plan.regime == "loop" and not plan.arrival, plan.reason
            assert plan.block_n == own.tuning.loss_alone_chunk and plan.num_warps == own.tuning.loss_loop_warps
    # The arrival form as every chip would plan it where its row splits the forward alone
    # (Ascend's own row turns arrival off, the CUDA rows stream it: above and below).
    target = dataclasses.replace(own, tuning=dataclasses.replace(own.tuning, loss_arrival=True,
                                                                 loss_split=frozenset({"gradient", "loss"})))
    no_arrival = dataclasses.replace(target, tuning=dataclasses.replace(target.tuning, loss_arrival=False))
    if not own.tuning.loss_arrival:
        # triton-ascend does not lower the arrival form: the forward alone streams there.
        assert loss_planner.plan_loss(own, 4096, 256000, "float32", writes_gradient=False, input_bytes=2,
                                      splittable=True).regime == "loop"
    for n_rows, n_cols, align in ((4096, 256000, 1), (4096, 50257, 8), (16, 128256, 1)):
        for writes in (True, False):
            plan = loss_planner.plan_loss(target, n_rows, n_cols, "float32", writes_gradient=writes, input_bytes=2,
                                          splittable=True, align=align)
            softmax = planner.plan_launch(target, n_rows, n_cols, "float32", input_bytes=2, align=align)
            if target.record.residency_guaranteed:
                assert plan.regime == "split" and plan.align == align, plan.reason
                if writes:
                    # Pipelined as the softmax where this Triton builds the pipelined form (3.6 on).
                    stages = softmax.num_stages if target.tuning.loss_gradient_pipelined else 1
                    assert (plan.chunks, plan.block_n, plan.num_warps, plan.num_stages) == (
                        softmax.chunks, softmax.block_n, softmax.num_warps, stages), (plan.reason, softmax.reason)
                else:
                    waiting = loss_planner.plan_loss(no_arrival, n_rows, n_cols, "float32", writes_gradient=False,
                                                     input_bytes=2, splittable=True, align=align)
                    assert waiting.config == softmax.config and waiting.programs == softmax.programs, (
                        waiting.reason, softmax.reason)
            elif writes:
                assert plan.regime == "loop", plan.reason
            if not writes:
                # By arrival: the softmax forward's chunks, windows and warps; a program per item, one launch.
                assert plan.arrival and "arrival" in plan.reason and not (plan.phased or plan.ticketed), plan.reason
                per_thread = target.tuning.loss_split_elements_per_thread or None
                sized = split_planner.split_config(target, n_rows, n_cols, align=align, per_thread=per_thread)
                assert (plan.chunks, plan.block_n, plan.num_warps, plan.align, plan.num_stages) == (
                    sized.chunks, sized.block_n, sized.num_warps, align, 1), plan.reason
                # (Up to the grid's limit, Ascend's 65535: beyond it programs step through the rest.)
                cap = min(target.record.grid_limit, target.tuning.max_programs)
                assert plan.items == n_rows * plan.chunks and plan.programs == min(plan.items, cap)
                if not target.record.residency_guaranteed:
                    off = loss_planner.plan_loss(no_arrival, n_rows, n_cols, "float32", writes_gradient=False,
                                                 input_bytes=2, splittable=True, align=align)
                    assert off.regime == "loop", off.reason
            streamed = dict(writes_gradient=writes, input_bytes=2, align=align)
            assert loss_planner.plan_loss(target, n_rows, n_cols, "float32", **streamed).regime == "loop"
    off = dataclasses.replace(target, tuning=dataclasses.replace(target.tuning, loss_split=frozenset({"loss"})))
    assert loss_planner.plan_loss(off, 4096, 256000, "float32", writes_gradient=True, splittable=True).regime == "loop"
    assert loss_planner.plan_loss(off, 4096, 256000, "float32", writes_gradient=False, splittable=True).arrival
    off = dataclasses.replace(off, tuning=dataclasses.replace(off.tuning, loss_arrival=False))
    assert loss_planner.plan_loss(off, 4096, 256000, "float32", writes_gradient=False, splittable=True).regime == (
        "split" if target.record.residency_guaranteed else "loop")
    none = dataclasses.replace(target, tuning=dataclasses.replace(target.tuning, loss_split=frozenset()))
    assert loss_planner.plan_loss(none, 4096, 256000, "float32", writes_gradient=False, splittable=True).regime == (
        "loop")
    fp64 = loss_planner.plan_loss(target, 4096, 256000, "float64", writes_gradient=True, splittable=True)
    assert fp64.regime == "loop"


def test_streamed_twice_rows_fit_the_l2():
    # The forward that streams each row twice (loss, then gradient) gets a grid whose rows in
    # flight fit the share of L2 the tuning allows, where one program a unit fits; otherwise, and
    # for one pass or a chip without a recorded L2, the loop grid as it was.
    from portable_softmax import loss_planner, profiles, targets
    from portable_softmax.record import KernelResources

    resources = KernelResources(registers=72, shared_memory=0, num_warps=8)
    found = targets.target_for(profiles.profile_record("h100"))
    # The cut is off by default (measured slower on the H100); a share turns it on.
    h100 = dataclasses.replace(found, tuning=dataclasses.replace(found.tuning, loss_l2_share=0.75))
    budget = h100.record.l2_cache_bytes * h100.tuning.loss_l2_share
    for n_cols, input_bytes in ((128256, 2), (32000, 2), (256000, 4)):
        plans = {rereads: loss_planner.plan_loss(h100, 8192, n_cols, "float32", writes_gradient=True, resources=resources,
                                            input_bytes=input_bytes, rereads=rereads) for rereads in (False, True)}
        row_bytes = n_cols * input_bytes
        resident = h100.record.compute_units * plans[False].occupancy
        if h100.record.compute_units * row_bytes <= budget < resident * row_bytes:
            assert h100.record.compute_units <= plans[True].programs < plans[False].programs, plans[True].reason
            assert plans[True].programs * row_bytes <= budget
        else:
            assert plans[True].programs == plans[False].programs, plans[True].reason
    assert loss_planner.plan_loss(h100, 8192, 128256, "float32", writes_gradient=True, resources=resources,
                             input_bytes=2, rereads=True).programs < resident
    mi300x = targets.target_for(profiles.profile_record("mi300x"))
    assert mi300x.record.l2_cache_bytes is None
    plans = [loss_planner.plan_loss(mi300x, 8192, 128256, "float32", writes_gradient=True, input_bytes=2, rereads=rereads)
             for rereads in (False, True)]
    assert plans[0].programs == plans[1].programs


def test_compile_report_covers_the_loss(monkeypatch):
    # The loss kernels with every option compile for sm_90 and gfx942 (tiles; a vocabulary split
    # across programs, in aligned windows, where the target promises residency, else compiled
    # as it would be planned; the loop it falls back to and the backward's), their wait loops
    # read memory, and the plan from the compiled resources takes a compiled configuration. The
    # heaviest forms only: CI's compile report (`portable-softmax compile`) compiles every form.
    from packaging.version import Version

    from portable_softmax import compat, crosscompile
    from portable_softmax.crosscompile import cases as compile_cases

    heaviest = {"grad, all": compile_cases.LOSS_FORMS["forward"]["grad, all"]}
    monkeypatch.setitem(compile_cases.LOSS_FORMS, "forward", heaviest)
    targets = [crosscompile.parse_target(t) for t in ("cuda:90", "hip:gfx942")]
    targets = [t for t in targets if crosscompile.toolchain_missing(t) is None]
    if not targets:
        pytest.skip("no GPU toolchain here to compile for")
    cases = crosscompile.cases_for([], ["bfloat16"], [False], loss_shapes=[(64, 4096), (64, 50257)])
    report = crosscompile.run(targets, cases, jobs=2, timeout=300)
    assert report["ok"], crosscompile.format_report(report)
    for target in report["targets"]:
        kernels = {v["kernel"] for v in target["variants"]}
        assert kernels == {"cross_entropy_forward_tile", "cross_entropy_forward_split", "cross_entropy_forward_loop",
                           "cross_entropy_backward"}
        assert {p["regime"] for p in target["plans"]} == {"tile", "split", "loop"}
        split = [v for v in target["variants"] if v["kernel"] == "cross_entropy_forward_split"]
        # Triton 3.2's AMDGCN peels the wait and leaves a loop that re-reads nothing: HIP plans no
        # waiting split, so the report notes it there (tests/test_crosscompile.py, the same rule).
        lossy = target["target"].startswith("hip") and compat.TRITON_VERSION < Version("3.3")
        assert all(v["wait_loop_reads_memory"] or (lossy and v["notes"] and not v["problems"]) for v in split), split
        assert {v["constexprs"]["ALIGN"] for v in split} == {8}
        # The split forms the plans launch spill nothing: where the listed form spills (Triton 3.2
        # and 3.6, sm_90: 2 warps, 84-98 words), the plan asks for twice the warps, compiled then.
        launched = {p["variant"] for p in target["plans"] if "note" not in p}
        assert all(v["spills"] == 0 for v in split if v["id"] in launched), split
        used = {p["regime"] for p in target["plans"] if "note" not in p}
        assert used == ({"tile", "split", "loop"} if target["record"]["residency_guaranteed"] else {"tile", "loop"})


def test_ignore_index_inside_the_classes(device):
    # ignore_index may name a class: its positions count for nothing, as torch's.
    x = logits((6, 33), torch.float32, device)
    target = torch.tensor([3, 0, 3, 32, 5, 3], device=device)
    check(x, target, ignore_index=3, weight=torch.rand(33, device=device) + 0.5, label_smoothing=0.1)
    check(x, target, ignore_index=3, reduction="none", z_loss=0.01)


@pytest.mark.parametrize("n_cols, writes, four", [(128256, True, True), (128256, False, False), (256000, True, False)],
                         ids=["gradient", "alone", "gradient-without-whole-loop"])
def test_h200_fits_the_pipelined_gradient_form_to_four_programs_a_unit(monkeypatch, n_cols, writes, four):
    # NOTES v31: on the H200 the loss's pipelined forward that writes the gradient read 0.77-0.78
    # of the floor at 4 programs a unit and 0.68-0.69 at the 5 a register cap fits: its register
    # caps are asked for at most 4 (``Tuning.loss_gradient_programs_per_unit``); the softmax's
    # limit elsewhere, and for the forward alone. NOTES v47: rows of more than 16 chunks, without
    # the whole loop (``Tuning.loss_whole_chunks``), wait on their peers and want the fifth.
    from portable_softmax import launch_plan, loss_planner, profiles, split_planner, targets, variants
    from portable_softmax.launch import RowView
    from portable_softmax.record import KernelResources

    target = targets.target_for(profiles.profile_record("h200"))
    # Pipelined as Triton 3.6 and later build it (the installed Triton may be older: 3.2 in CI).
    target = dataclasses.replace(target, tuning=dataclasses.replace(target.tuning, loss_gradient_pipelined=True))
    asked = []

    def split_fit(fit, config, input_bytes):
        caps = split_planner.split_fit(fit, config, input_bytes)
        asked.append(max(programs for programs, _ in caps))
        return caps

    monkeypatch.setattr(launch_plan, "split_fit", split_fit)
    strides = tuple((0, n_cols, 1) if name in ("x", "grad") else (0, 1, 0)
                    for name in variants.loss_row_tensors("forward"))
    call = launch_plan.LossCall("forward", RowView(1, 8192, n_cols, strides), variants.LossFacts(write_grad=writes),
                                (-100,), 2, True, 1, True)
    config = loss_planner.split_form(target, 8192, n_cols, 1, False, writes, None)
    assert config.num_stages > 1 and config.whole == (writes and n_cols == 128256)
    launch_plan.loss_variant(target, call, config, lambda variant: KernelResources(registers=138, shared_memory=32912,
                                                                                   num_warps=4))
    assert asked == [4] if four else asked[0] > 4


@pytest.mark.parametrize("dtype_bytes, writes, capped", [(2, False, True), (4, False, False), (2, True, False)],
                         ids=["bf16-alone", "fp32-alone", "bf16-gradient"])
def test_h200_fits_the_forward_alones_16_bit_stream_to_five_programs_a_unit(dtype_bytes, writes, capped):
    # NOTES v41: on the H200 the forward alone streamed in bf16 read 0.80-0.97 of the floor at 5
    # programs a unit (a register cap) where 4 read 0.77-0.95; float32 lost at 5: only 2-byte
    # logits are capped (``Tuning.loss_loop_fit``), and never a stream that writes the gradient.
    from portable_softmax import launch_plan, loss_planner, profiles, targets, variants
    from portable_softmax.launch import RowView
    from portable_softmax.record import KernelResources

    target = targets.target_for(profiles.profile_record("h200"))
    strides = tuple((0, 32000, 1) if name in ("x", "grad") else (0, 1, 0) for name in variants.loss_row_tensors("forward"))
    call = launch_plan.LossCall("forward", RowView(1, 8192, 32000, strides), variants.LossFacts(write_grad=writes),
                                (-100,), dtype_bytes, True, 1, True)
    plan = loss_planner.plan_loss(target, 8192, 32000, "float32", writes_gradient=writes, input_bytes=dtype_bytes,
                                  splittable=False)
    assert plan.regime == "loop"

    def resources(variant):
        # 64 registers uncapped (4 programs of 8 warps a unit), the cap's own when capped, no spill.
        return KernelResources(variant.option_values.get("maxnreg", 64), 0, variant.option_values["num_warps"])

    variant = launch_plan.loss_variant(target, call, plan.config, resources)
    cap = variant.option_values.get("maxnreg")
    assert (cap is not None) == capped
    if capped:
        assert target.occupancy(target.record, resources(variant)) == 5


@pytest.mark.parametrize("n_rows, row_programs", [(8192, True), (4096, False), (16384, True)])
def test_h200_streams_the_forward_alone_a_program_a_row_where_rows_fill_twelve_waves(n_rows, row_programs):
    # NOTES v45: on the H200 the bf16 forward alone of 8192 rows and more read 0.01-0.02 more of
    # the floor with a program a row; 4096 rows (6 waves of 660 resident programs) read less.
    from portable_softmax import loss_planner, profiles, targets
    from portable_softmax.record import KernelResources

    target = targets.target_for(profiles.profile_record("h200"))
    # 48 registers (the cap that fits 5 programs of 8 warps a unit): 660 resident.
    plan = loss_planner.plan_loss(target, n_rows, 32000, "float32", writes_gradient=False, input_bytes=2,
                                  resources=lambda config: KernelResources(48, 0, config.num_warps))
    assert plan.regime == "loop" and plan.occupancy == 5
    assert plan.programs == (n_rows if row_programs else 4 * 5 * target.record.compute_units)
    written = loss_planner.plan_loss(target, n_rows, 32000, "float32", writes_gradient=True, input_bytes=2,
                                     resources=lambda config: KernelResources(48, 0, config.num_warps))
    assert written.programs < n_rows


@pytest.mark.parametrize("regime", ["tile", "split"])
def test_inplace_backward_into_leaf_logits_allocates_no_gradient(device, monkeypatch, regime):
    # Leaf logits (as a benchmark holds them): their .grad is their own storage, not a copy of it
    # (autograd copies a gradient that another tensor holds: the logits themselves).
    if regime == "split":
        _split(monkeypatch, device)
    x = torch.randn(4, 300, device=device, requires_grad=True)
    target = class_targets((4,), 300, device, 0.25)
    expected = torch.autograd.grad(F.cross_entropy(x.double(), target), x)[0]
    ps.cross_entropy(x, target, inplace_backward=True).backward()
    assert x.grad.data_ptr() == x.data_ptr()
    assert relative_error(x.grad, expected) <= TOLERANCE[torch.float32]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_split_rows_of_negative_16bit_logits(device, monkeypatch, dtype):
    # Rows of negative 16-bit logits spread over 100: a reference other than the row's maximum
    # (the least, as a maximum over the raw bits of negative floats would take) overflows exp.
    _split(monkeypatch, device)
    x = (-100.0 - 100.0 * torch.rand(3, 300, device=device)).to(dtype)
    check(x, class_targets((3,), 300, device, 0.0), with_lse=True)
    assert _forward_regimes() == {"split"}


@pytest.mark.parametrize("writes", [True, False], ids=["gradient", "alone"])
def test_a_spilling_split_form_takes_twice_the_warps(writes):
    # Where the compiled split form spills more than the tuning allows (the every-option forms
    # under Triton 3.2 and 3.6: 2 warps, 84-98 words a thread), the loss plans the same chunks
    # with half the elements a thread (twice the warps), as far as that stops the spills; the
    # estimates, which never spill, keep the tuning's.
    from portable_softmax import loss_planner, profiles, split_planner, targets
    from portable_softmax.record import KernelResources

    target = targets.target_for(profiles.profile_record("h200"))
    target = dataclasses.replace(target, tuning=dataclasses.replace(
        target.tuning, loss_split=frozenset({"gradient", "loss"}), loss_arrival=True))
    options = dict(writes_gradient=writes, input_bytes=2, splittable=True, align=8)
    base = loss_planner.plan_loss(target, 4096, 50257, "float32", **options)
    assert base.regime == "split" and base.num_warps == 2, base.reason

    def spilling_below(warps):
        def resources(config):
            return KernelResources(registers=255 if config.num_warps < warps else 128, shared_memory=32,
                                   num_warps=config.num_warps, spills=98 if config.num_warps < warps else 0)
        return resources

    for warps in (4, 8):
        plan = loss_planner.plan_loss(target, 4096, 50257, "float32", resources=spilling_below(warps), **options)
        assert plan.regime == "split" and plan.num_warps == warps, plan.reason
        assert (plan.block_n, plan.chunks, plan.align) == (base.block_n, base.chunks, base.align)
    # Spilling whatever the warps: the widest form (the block's lanes bound the warps), or, where
    # that grid cannot be resident, the rows streamed; never the spilling 2 warps.
    plan = loss_planner.plan_loss(target, 4096, 50257, "float32", resources=spilling_below(10**6), **options)
    widest = split_planner.split_config(target, 4096, 50257, align=8, per_thread=1)
    assert plan.num_warps == widest.num_warps if plan.regime == "split" else plan.regime == "loop", plan.reason
    # Within the tuning's allowance: unchanged.
    plan = loss_planner.plan_loss(target, 4096, 50257, "float32", **options,
                                  resources=lambda config: KernelResources(255, 32, config.num_warps, spills=8))
    assert plan.num_warps == base.num_warps
