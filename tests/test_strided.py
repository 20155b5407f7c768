"""Reductions along a strided dimension (rows side by side in memory): column softmax, channels of
NCHW tensors, transposed inputs. Their tiles span adjacent rows (``strided_planner._strided_config``) in
every regime: a whole row per tile, chunks of tiles split across co-resident programs (GPUs),
slices streamed in two launches (the interpreter, AMD and Ascend, which promise no residency, and
long bf16 columns on the H200), or streamed twice by a program per tile. Results against torch in
float64, forward and backward; the plans are checked to be what the test means to exercise."""
from __future__ import annotations

import pytest
import torch

import portable_softmax as ps
from portable_softmax import launch, row_layout, tuning
from portable_softmax.device import device_record
from portable_softmax.selfcheck import relative_error, tolerance
from portable_softmax.targets import plan_launch
from portable_softmax.profiles import profile_record
from regimes import interpreted, open_split

FUNCTIONS = [(ps.softmax, torch.softmax), (ps.log_softmax, torch.log_softmax)]

# (shape, dim): a column softmax (a tile on the interpreter, split on GPUs), one too long for the
# interpreter's tiles (sliced there), channels of an NCHW tensor, and a row of one element per tile.
CASES = [((4096, 160), 0), ((70000, 3), 0), ((5, 21, 17, 19), 1), ((1, 300), 0)]


def _planned_regime(x: torch.Tensor, dim: int, backward: bool = False) -> tuple[str, int]:
    y = torch.empty_like(x)
    tensors = (y, y, y) if backward else (x, y)
    view = row_layout.row_view(tuple(x.shape), dim % x.dim(), *tensors)
    record = launch.build_record("backward" if backward else "forward", tensors, view, False, False)
    return record.plan.regime, record.plan.block_m


def _assert_gradient_matches_torch(x: torch.Tensor, y: torch.Tensor, dim: int, theirs, device: str) -> None:
    """x's gradient through ``y`` (ours of x) against torch's in float64, within torch's own error."""
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, dy)
    reference_x = x.detach().double().requires_grad_()
    (reference_dx,) = torch.autograd.grad(theirs(reference_x, dim), reference_x, dy.double())
    torch_x = x.detach().requires_grad_()
    (torch_dx,) = torch.autograd.grad(theirs(torch_x, dim), torch_x, dy)
    assert relative_error(dx, reference_dx) <= tolerance(x.dtype, relative_error(torch_dx, reference_dx), device)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{'x'.join(map(str, c[0]))}-dim{c[1]}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fns", FUNCTIONS, ids=["softmax", "log_softmax"])
def test_strided_reductions_match_torch(device, case, dtype, fns):
    shape, dim = case
    ours, theirs = fns
    x = (torch.randn(shape, device=device) * 4).to(dtype).requires_grad_()
    reference_x = x.detach().double().requires_grad_()
    reference = theirs(reference_x, dim)
    y = ours(x, dim)
    expected = theirs(x.detach(), dim)
    assert relative_error(y, reference) <= tolerance(dtype, relative_error(expected, reference), device)
    _assert_gradient_matches_torch(x, y, dim, theirs, device)


@pytest.mark.parametrize("fns", FUNCTIONS, ids=["softmax", "log_softmax"])
def test_wide_backward_split_tiles_match_torch(device, monkeypatch, fns):
    """bf16 backward split tiles as wide as ``Tuning.strided_split_rows`` lets them be where their
    chunks are few (64 rows of 128 bytes on CUDA): 1000 channels of 33 x 31 pixels (a last chunk
    partly past the end, a last tile partly filled), three launches with fresh inputs. On the
    interpreter, tiles of 64 rows asked for there: 100 channels of 9 x 11 pixels, in 4 chunks of
    32 channels."""
    if interpreted(device):
        key = (ps.device_info(device)["backend"], "*")
        monkeypatch.setitem(tuning.TUNING, key, tuning.replace(tuning.TUNING[key], **open_split(
            device, row_elements=64, strided_split_elements=4096, strided_split_rows={("backward", 2): 64},
            strided_split_slots=1024, split_tickets=frozenset())))
    else:
        open_split(device)  # skips where the split path is closed
    wide = tuning.tuning_for(device_record(device)).strided_split_rows.get(("backward", 2))
    if not wide:
        pytest.skip("this device's tuning asks for no wider backward tiles")
    shape = (1, 100, 9, 11) if interpreted(device) else (8, 1000, 33, 31)
    y = torch.empty(shape, device=device, dtype=torch.bfloat16)
    plan = launch.build_record("backward", (y, y, y), row_layout.row_view(shape, 1, y, y, y), False, False).plan
    assert plan.regime == "split" and plan.block_m == wide, plan
    ours, theirs = fns
    for _ in range(3):
        x = (torch.randn(shape, device=device) * 4).to(torch.bfloat16).requires_grad_()
        _assert_gradient_matches_torch(x, ours(x, 1), 1, theirs, device)


def test_transposed_rows_with_a_contiguous_output(device):
    """Rows side by side in the input, contiguous in the output: loads coalesce one way, stores
    the other."""
    x = torch.randn(300, 4000, device=device).t()
    y = torch.full((4000, 300), float("nan"), device=device)
    view = row_layout.row_view((4000, 300), 1, x, y)
    assert view is not None and view.strided
    launch.run_forward(x, y, view, False)
    assert relative_error(y, torch.softmax(x.double(), -1)) < 1e-6


def test_strided_tiles_span_adjacent_rows(device):
    """Each regime's tiles hold several adjacent rows: the one-row tiles of contiguous rows would
    read one element per transaction."""
    for shape, dim in CASES[:3]:
        x = torch.randn(shape, device=device)
        for backward in (False, True):
            regime, block_m = _planned_regime(x, dim, backward)
            assert block_m > 1, (shape, dim, backward, regime)
    if device == "cpu":
        assert _planned_regime(torch.randn(70000, 3), 0)[0] == "sliced"


@pytest.mark.parametrize("profile", ["h100", "h200", "mi300x", "ascend910b"])
def test_strided_plans_on_recorded_chips(profile):
    """A column softmax of (32768, 1024): split tiles of adjacent rows where the chip promises
    residency, slices of 128 bytes of them in two launches where not, and where the CUDA rows
    ask (``Tuning.strided_slices``): bf16 on the H200, the bf16 forward on the H100; never a tile
    of one row. Fails with those rows unset."""
    record = profile_record(profile)
    for element, backward in [(4, False), (2, False), (2, True)]:
        plan = plan_launch(record, 1024, 32768, "float32", backward=backward, strided=True,
                           input_bytes=element * (2 if backward else 1))
        assert plan.block_m * element >= 32, plan
        sliced = not record.residency_guaranteed or (element == 2 and (profile == "h200" or not backward))
        assert plan.regime == ("sliced" if sliced else "split"), plan
        if sliced:
            assert plan.block_m * element == 128 and plan.chunks > 1 and plan.programs == plan.items, plan
        # Fused calls keep what fuses (the sliced kernels fuse nothing).
        unsliced = plan_launch(record, 1024, 32768, "float32", backward=backward, strided=True,
                               input_bytes=element * (2 if backward else 1), sliceable=False)
        assert unsliced.regime == ("split" if record.residency_guaranteed else "loop"), unsliced
    # Shorter rows than the H200's row names keep their split tiles: bf16 forward rows from 4096,
    # backward from 16384.
    for cols, backward in [(2048, False), (8192, True)]:
        short = plan_launch(record, 1024, cols, "float32", strided=True, backward=backward,
                            input_bytes=2 * (2 if backward else 1))
        assert short.regime == ("split" if record.residency_guaranteed else "sliced"), short


def _finite_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """``relative_error`` over the finite part of ``reference``, whose infinities ``ours`` holds
    too (log_softmax of -inf)."""
    infinite = torch.isinf(reference)
    assert torch.equal(torch.isinf(ours).cpu(), infinite.cpu())
    return relative_error(ours.masked_fill(infinite, 0), reference.masked_fill(infinite, 0))


# (shape, dim), each longer than the interpreter's bf16 tiles hold: a column whose slices are not
# all full (slices of 512), channels of NCHW tensors (several groups of rows), a column of as many
# rows as one tile holds.
SLICED_CASES = [((4500, 37), 0), ((2, 4500, 3, 7), 1), ((4100, 64), 0)]


@pytest.mark.parametrize("case", SLICED_CASES, ids=lambda c: f"{'x'.join(map(str, c[0]))}-dim{c[1]}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_sliced_reductions_match_torch(device, case, dtype, log):
    """The sliced regime on every device (a tuning row that slices every strided row that is
    long enough): outputs poisoned first, rows holding -inf and large values, forward and the
    backward op against torch in float64. Nothing outlives a launch (the partials are allocated
    per call), so one launch each."""
    if dtype == torch.float64 and device not in ("cpu", "cuda"):
        pytest.skip("float64 on this device")
    shape, dim = case
    record = device_record(device)
    own = tuning.tuning_for(record)
    element = torch.tensor([], dtype=dtype).element_size()
    # Slices of 512 until 64 programs a unit: several, the last one short, on every device.
    tuning.TUNING[(record.backend, "*")] = tuning.replace(
        own, strided_slices={("forward", element): 1, ("backward", element): 1}, slice_elements=512,
        slice_programs_per_unit=64)
    try:
        function = torch.log_softmax if log else torch.softmax
        backward = torch._log_softmax_backward_data if log else torch._softmax_backward_data
        x = (torch.randn(shape, device=device) * 4).to(dtype)
        x.select(dim, 7).fill_(-float("inf"))  # a -inf in every row
        x.select(dim, 11).mul_(30)
        y = torch.full(shape, float("nan"), device=device, dtype=dtype)
        view = row_layout.row_view(shape, dim, x, y)
        assert launch.run_forward(x, y, view, log).regime == "sliced"
        reference = function(x.double(), dim)
        error = _finite_error(y, reference)
        assert error <= tolerance(dtype, _finite_error(function(x, dim), reference), device)
        dy = torch.randn(shape, device=device).to(dtype)
        y_torch = function(x, dim)
        dx = torch.full(shape, float("nan"), device=device, dtype=dtype)
        plan = launch.run_backward(y_torch, dy, dx, row_layout.row_view(shape, dim, y_torch, dy, dx), log)
        assert plan.regime == "sliced"
        expected = backward(dy.double(), y_torch.double(), dim, torch.float64)
        theirs = backward(dy, y_torch, dim, dtype)
        assert relative_error(dx, expected) <= tolerance(dtype, relative_error(theirs, expected), device)
    finally:
        tuning.TUNING.pop((record.backend, "*"), None)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_sliced_rows_with_a_contiguous_output(device, log):
    """Rows sliced from a padded vocabulary start on 16-byte boundaries; the contiguous output's
    rows do not. On GPUs their windows follow the input (the output is written unaligned), in
    both directions."""
    padded = torch.randn(3, 50304, device=device, dtype=torch.bfloat16) * 4
    x = padded[:, :50257]
    y = torch.full((3, 50257), float("nan"), device=device, dtype=torch.bfloat16)
    view = row_layout.row_view((3, 50257), 1, x, y)
    launch.run_forward(x, y, view, log)
    function = torch.log_softmax if log else torch.softmax
    reference = function(x.double(), -1)
    assert relative_error(y, reference) <= tolerance(torch.bfloat16, relative_error(function(x, -1), reference), device)
    dy_padded = torch.randn(3, 50304, device=device, dtype=torch.bfloat16)
    y_sliced = torch.empty_like(padded)[:, :50257].copy_(y)
    dy = dy_padded[:, :50257]
    dx = torch.full((3, 50257), float("nan"), device=device, dtype=torch.bfloat16)
    launch.run_backward(y_sliced, dy, dx, row_layout.row_view((3, 50257), 1, y_sliced, dy, dx), log)
    backward = torch._log_softmax_backward_data if log else torch._softmax_backward_data
    expected = backward(dy.double(), y_sliced.double(), 1, torch.float64)
    assert relative_error(dx, expected) < 2e-2


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_shifted_outputs_stay_inside_their_rows(device, log):
    """Rows whose inputs start at other offsets from 16-byte boundaries than the output's (a
    row stride of 50259, a contiguous output of 50257): the output is written unaligned, whole
    chunks without a mask and the rows' first and last chunks with one. Poisoned guards before
    and after the output, and its rows, must hold torch's result and nothing more, both ways."""
    rows, length = 5, 50257
    x = (torch.randn(rows, 50259, device=device, dtype=torch.bfloat16) * 4)[:, :length]
    dy = torch.randn(rows, 50259, device=device, dtype=torch.bfloat16)[:, :length]
    guard = 8  # 16 bytes: the output's pointer stays aligned
    function = torch.log_softmax if log else torch.softmax
    backward = torch._log_softmax_backward_data if log else torch._softmax_backward_data
    for direction in ("forward", "backward"):
        buffer = torch.full((rows * length + 2 * guard,), float("nan"), device=device, dtype=torch.bfloat16)
        out = buffer[guard:guard + rows * length].view(rows, length)
        if direction == "forward":
            record = launch.build_record("forward", (x, out), row_layout.row_view((rows, length), 1, x, out), log, False)
            reference = function(x.double(), -1)
            theirs = function(x, -1)
        else:
            # y laid out as dy (a softmax's own result would be contiguous): the inputs share windows.
            y = torch.empty(rows, 50259, device=device, dtype=torch.bfloat16)[:, :length]
            y.copy_(function(x.float() / 2, -1))
            record = launch.build_record("backward", (y, dy, out), row_layout.row_view((rows, length), 1, y, dy, out),
                                         log, False)
            reference = backward(dy.double(), y.double(), 1, torch.float64)
            theirs = backward(dy, y, 1, torch.bfloat16)
        record((x, out) if direction == "forward" else (y, dy, out))
        if device == "cuda":  # read through windows in chunks, written shifted (the interpreter holds tiles)
            assert record.plan.regime == "split" and record.plan.align > 1 and record.plan.chunks > 2, record.plan
        assert torch.isnan(buffer[:guard]).all() and torch.isnan(buffer[-guard:]).all(), direction
        assert relative_error(out, reference) <= tolerance(torch.bfloat16, relative_error(theirs, reference), device)


def test_windows_follow_the_inputs_where_only_the_output_is_shifted():
    from portable_softmax.planner import window_align

    sliced, contiguous = (0, 50304, 1), (0, 50257, 1)
    assert window_align(1, 4, 50257, [sliced, contiguous], [2, 2], True) == 1
    assert window_align(1, 4, 50257, [sliced, contiguous], [2, 2], True, shifted_output=True) == 8
    assert window_align(1, 4, 50257, [contiguous, sliced, contiguous], [2, 2, 2], True, shifted_output=True) == 1
