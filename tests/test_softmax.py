"""Kernel results against torch, on every device present (the CPU runs them through Triton's
interpreter). Errors are relative errors of the whole tensor against torch in float64, judged
against torch's own error on the same input."""
from __future__ import annotations

import types

import pytest
import torch

import portable_softmax as ps
from portable_softmax import launch, row_layout, tuning, variants
from portable_softmax.selfcheck import ERROR_FLOOR, relative_error, tolerance
from regimes import SPLIT_REGIMES, force_regime, interpreted, open_split, regime_of

FUNCTIONS = [(ps.softmax, torch.softmax), (ps.log_softmax, torch.log_softmax)]
FUNCTION_IDS = ["softmax", "log_softmax"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [
    (1823, 781),   # tile: many rows per tile, odd width
    (3, 50257),    # tile (interpreter) / split (GPU): odd vocabulary size
    (2, 70000),    # loop (interpreter) / split (GPU): longer than a program holds
    (5, 1),        # one-element rows
    (1, 1),
    (17, 16),      # rows fewer than a tile holds
]


def _check(ours: torch.Tensor, theirs: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> None:
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    error, torch_error = relative_error(ours, reference), relative_error(theirs, reference)
    assert error <= tolerance(dtype, torch_error, str(ours.device)), f"error {error:.2e} vs torch's {torch_error:.2e}"


def _check_finite(ours: torch.Tensor, theirs: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> None:
    """``_check`` over the elements finite in torch's result, after ours has torch's infinities and
    NaNs (log_softmax of -inf is -inf; float16's of -1.2e5 too, where float64's is finite)."""
    assert torch.equal(ours.isnan(), theirs.isnan()) and torch.equal(ours.isinf(), theirs.isinf())
    finite = theirs.isfinite()
    _check(ours[finite], theirs[finite], reference[finite], dtype)


# Row offsets that a softmax without its max shift (or with a wrong one) cannot survive: exp of
# 1e4 overflows and exp of -1e4 underflows to a zero sum in float32; float16 goes to its largest
# finite values.
SHIFT_OFFSETS = {torch.float32: 1e4, torch.bfloat16: 1e4, torch.float16: 6e4}


def _shift_stressing(shape: tuple[int, int], dtype: torch.dtype, device: str) -> torch.Tensor:
    """``randn * 4`` around a random offset per row within +-``SHIFT_OFFSETS``, the first row at
    the offset's top, the last near the dtype's largest value and wider rows with -inf entries:
    softmax is shift invariant, so only inputs like these show a wrong shift."""
    rows, cols = shape
    offsets = (torch.rand(rows, 1, device=device) * 2 - 1) * SHIFT_OFFSETS[dtype]
    offsets[0] = SHIFT_OFFSETS[dtype]
    if rows > 2:
        offsets[-1] = torch.finfo(dtype).max * 0.99 - 64
    x = (torch.randn(shape, device=device) * 4 + offsets).to(dtype)
    if cols > 1:
        # -inf entries, never a whole row (that is NaN, test_special_values_behave_as_torch).
        x[torch.rand(shape, device=device) < 0.02] = -float("inf")
        x[:, 0] = offsets[:, 0].to(dtype)
    return x


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fns", FUNCTIONS, ids=FUNCTION_IDS)
def test_forward_matches_torch(device, shape, dtype, fns):
    ours, theirs = fns
    x = _shift_stressing(shape, dtype, device)
    _check_finite(ours(x, -1), theirs(x, -1), theirs(x.double(), -1), dtype)


@pytest.mark.parametrize("fns", FUNCTIONS, ids=FUNCTION_IDS)
@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
def test_any_dim_of_a_3d_tensor(device, fns, dim):
    ours, theirs = fns
    x = torch.randn(6, 35, 9, device=device)
    _check(ours(x, dim), theirs(x, dim), theirs(x.double(), dim), torch.float32)


@pytest.mark.parametrize("make", [
    lambda x: x.t(),                         # transposed
    lambda x: x[:, ::3],                     # strided columns
    lambda x: x[::2],                        # strided rows
    lambda x: x.t()[5:40, 3:],               # offset transposed view
    lambda x: x[:, :1].expand(-1, 300),      # stride-0 columns
    lambda x: x.reshape(4, 100, 300)[:, ::2, ::3].permute(2, 0, 1),  # two row groups
    lambda x: x.reshape(4, 10, 10, 300)[:, ::3, ::2, ::5].permute(3, 0, 1, 2),  # three: copied first
], ids=["transposed", "strided_cols", "strided_rows", "offset_view", "expanded", "two_groups", "three_groups"])
@pytest.mark.parametrize("dim", [0, -1])
def test_non_contiguous_inputs(device, make, dim):
    x = make(torch.randn(400, 300, device=device))
    _check(ps.softmax(x, dim), torch.softmax(x, dim), torch.softmax(x.double(), dim), torch.float32)


def test_rank_zero_and_empty(device):
    scalar = torch.tensor(3.0, device=device)
    assert ps.softmax(scalar, 0).item() == 1.0 and ps.log_softmax(scalar, -1).item() == 0.0
    for shape, dim in [((0, 5), -1), ((5, 0), -1), ((5, 0), 0), ((2, 0, 3), 1)]:
        x = torch.randn(shape, device=device)
        y = ps.softmax(x, dim)
        assert y.shape == x.shape and y.dtype == x.dtype


@pytest.mark.parametrize("fns", FUNCTIONS, ids=FUNCTION_IDS)
@pytest.mark.parametrize("in_dtype, out_dtype", [(torch.float32, torch.float64), (torch.float16, torch.float32),
                                                 (torch.int64, torch.float32)], ids=str)
def test_empty_inputs_take_the_dtype_argument(device, fns, in_dtype, out_dtype):
    """Zero-size inputs with ``dtype=``: torch's result has ``dtype``, shape and strides of its own
    (no kernel runs, so only the dtype tells a dropped argument)."""
    _skip_unsupported(device, out_dtype)
    ours, theirs = fns
    for shape, dim in [((0, 5), -1), ((5, 0), -1), ((2, 0, 3), 1)]:
        x = torch.zeros(shape, device=device, dtype=in_dtype)
        y, expected = ours(x, dim, dtype=out_dtype), theirs(x, dim, dtype=out_dtype)
        assert (y.dtype, y.shape, y.stride()) == (expected.dtype, expected.shape, expected.stride()), (shape, dim)


@pytest.mark.parametrize("fns", FUNCTIONS, ids=FUNCTION_IDS)
@pytest.mark.parametrize("in_dtype, out_dtype", [(torch.float32, torch.float64), (torch.float64, torch.float16),
                                                 (torch.int32, torch.float32)], ids=str)
def test_rank_zero_inputs_take_the_dtype_argument(device, fns, in_dtype, out_dtype):
    """A 0-d input with ``dtype=``: torch's dtype, shape and value, and the gradient in the input's
    dtype (floating inputs)."""
    _skip_unsupported(device, in_dtype, out_dtype)
    ours, theirs = fns
    x = torch.tensor(3, device=device).to(in_dtype).requires_grad_(in_dtype.is_floating_point)
    for dim in (0, -1):
        y, expected = ours(x, dim, dtype=out_dtype), theirs(x, dim, dtype=out_dtype)
        assert (y.dtype, y.shape) == (expected.dtype, expected.shape) and torch.equal(y, expected)
        if x.requires_grad:
            (grad,) = torch.autograd.grad(y, x, torch.ones_like(y))
            (expected_grad,) = torch.autograd.grad(expected, x, torch.ones_like(expected))
            assert grad.dtype == expected_grad.dtype and torch.equal(grad, expected_grad)


ALL_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
# The output shapes of the dtype matrix: a tile on every backend, and rows longer than a program
# holds (the loop kernels on the interpreter and Ascend, the split ones on GPUs).
DTYPE_SHAPES = [(33, 257), (2, 70000)]


def _skip_unsupported(device: str, *dtypes: torch.dtype) -> None:
    record = ps.device_info(device)
    if torch.float64 in dtypes and not record["supports_fp64"]:
        pytest.skip("float64 unsupported on this device")
    if torch.bfloat16 in dtypes and not record["supports_bf16"]:
        pytest.skip("bfloat16 unsupported on this device")


def _coarser(*dtypes: torch.dtype) -> torch.dtype:
    """The dtype whose rounding bounds a result's error (the largest error floor)."""
    return max(dtypes, key=lambda dtype: ERROR_FLOOR[dtype])


@pytest.mark.parametrize("shape", DTYPE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("out_dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("in_dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("fns", FUNCTIONS, ids=FUNCTION_IDS)
def test_dtype_argument_casts_first(device, in_dtype, out_dtype, fns, shape):
    """Every (input, ``dtype=``) pair, forward and backward, as torch computes it: the input cast
    to ``dtype`` first (float64 to a 16-bit type rounds through float32, as torch does), the
    gradient in the input's dtype."""
    _skip_unsupported(device, in_dtype, out_dtype)
    ours, theirs = fns
    x = (torch.randn(shape, device=device) * 3).to(in_dtype).requires_grad_()
    y = ours(x, -1, dtype=out_dtype)
    torch_y = theirs(x, -1, dtype=out_dtype)
    assert y.dtype == out_dtype
    xd = x.detach().to(out_dtype).double().requires_grad_()
    reference = theirs(xd, -1)
    _check(y, torch_y, reference, out_dtype)
    dy = torch.randn(shape, device=device).to(out_dtype)
    grad = torch.autograd.grad(y, x, dy)[0]
    torch_grad = torch.autograd.grad(torch_y, x, dy)[0]
    grad_reference = torch.autograd.grad(reference, xd, dy.double())[0]
    assert grad.dtype == torch_grad.dtype == in_dtype
    _check(grad, torch_grad, grad_reference, _coarser(in_dtype, out_dtype))


def _special_rows(dtype: torch.dtype, device: str) -> torch.Tensor:
    inf, nan = float("inf"), float("nan")
    big = 6e4 if dtype == torch.float16 else 1e4
    rows = [
        [1.0, inf, 2.0, 3.0],
        [-inf, -inf, -inf, -inf],
        [nan, 1.0, 2.0, 3.0],
        [big, big - 1, -big, 0.0],
        [-inf, 1.0, -inf, 2.0],
        [big, big, big, big],
    ]
    return torch.tensor(rows, dtype=dtype, device=device)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fns", FUNCTIONS, ids=FUNCTION_IDS)
def test_special_values_behave_as_torch(device, dtype, fns):
    ours, theirs = fns
    x = _special_rows(dtype, device)
    _check_finite(ours(x, -1), theirs(x, -1), theirs(x.double(), -1), dtype)


@pytest.mark.parametrize("fns", FUNCTIONS, ids=FUNCTION_IDS)
@pytest.mark.parametrize("dim", [-1, 0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_backward_matches_torch(device, fns, dim, dtype):
    ours, theirs = fns
    x = (torch.randn(97, 301, device=device) * 3).to(dtype).requires_grad_()
    dy = torch.randn(97, 301, device=device).to(dtype)
    grad = torch.autograd.grad(ours(x, dim), x, dy)[0]
    torch_grad = torch.autograd.grad(theirs(x, dim), x, dy)[0]
    xd = x.detach().double().requires_grad_()
    reference = torch.autograd.grad(theirs(xd, dim), xd, dy.double())[0]
    assert grad.dtype == x.dtype
    _check(grad, torch_grad, reference, dtype)


@pytest.mark.parametrize("fns", FUNCTIONS, ids=FUNCTION_IDS)
def test_gradcheck_and_double_backward(device, fns):
    ours, _ = fns
    if not ps.device_info(device)["supports_fp64"]:
        pytest.skip("float64 unsupported on this device")
    x = torch.randn(4, 7, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: ours(t, 1), (x,))
    assert torch.autograd.gradgradcheck(lambda t: ours(t, 0), (x,))


@pytest.mark.parametrize("fns", FUNCTIONS, ids=FUNCTION_IDS)
def test_differentiable_gradients_match_torch(device, fns):
    """The gradient taken with ``create_graph`` (written in torch operations, differentiable again)
    and the second derivative through it, against torch's: gradgradcheck compares the second
    derivative with that gradient, so a wrong differentiable gradient passes it."""
    ours, theirs = fns
    if not ps.device_info(device)["supports_fp64"]:
        pytest.skip("float64 unsupported on this device")
    x = torch.randn(5, 33, dtype=torch.float64, device=device) * 3
    dy, weights = torch.randn_like(x), torch.randn_like(x)
    results = []
    for function in (ours, theirs):
        leaf = x.clone().requires_grad_()
        (dx,) = torch.autograd.grad(function(leaf, -1), leaf, dy, create_graph=True)
        (ddx,) = torch.autograd.grad((dx * weights).sum(), leaf)
        results.append((dx.detach(), ddx))
    (dx, ddx), (torch_dx, torch_ddx) = results
    assert relative_error(dx, torch_dx) < 1e-12 and relative_error(ddx, torch_ddx) < 1e-12


@pytest.mark.parametrize("fns", FUNCTIONS, ids=FUNCTION_IDS)
def test_bfloat16_results_round_to_nearest_as_torch_s(device, fns):
    """bfloat16 outputs rounded to nearest (even), as torch and GPUs round, not truncated: the
    whole-tensor error of a truncation (2**-9 relative) passes the bfloat16 tolerance, its bias
    does not. The mean signed error against float64, relative to the values, within twice
    torch's own."""
    ours, theirs = fns
    x = (torch.randn(257, 781, device=device) * 3).to(torch.bfloat16)
    reference = theirs(x.double(), -1)

    def bias(y: torch.Tensor) -> float:
        return ((y.double() - reference).sum() / reference.abs().sum()).item()

    assert abs(bias(ours(x, -1))) <= max(2 * abs(bias(theirs(x, -1))), 2e-4)


def test_dtype_argument_gradient_is_in_the_input_dtype(device):
    x = torch.randn(8, 40, device=device, dtype=torch.float16, requires_grad=True)
    ps.softmax(x, -1, dtype=torch.float32).sum().backward()
    assert x.grad.dtype == torch.float16


@pytest.mark.parametrize("bad,error,match", [
    (lambda d: torch.arange(6, device=d).reshape(2, 3), TypeError, "torch.int64"),
    (lambda d: torch.ones(2, 3, dtype=torch.bool, device=d), TypeError, "torch.bool"),
    (lambda d: torch.ones(2, 3, dtype=torch.complex64, device=d), TypeError, "complex64"),
    (lambda d: [[1.0, 2.0]], TypeError, "torch.Tensor"),
])
def test_bad_inputs_raise_clear_errors(device, bad, error, match):
    with pytest.raises(error, match=match):
        ps.softmax(bad(device), -1)


def test_bad_arguments_raise_clear_errors(device):
    x = torch.randn(2, 3, device=device)
    with pytest.raises(IndexError, match="dim 2 is out of range"):
        ps.softmax(x, 2)
    with pytest.raises(ValueError, match="out of range"):
        ps.log_softmax(x, -3)
    with pytest.raises(TypeError, match="dtype must be"):
        ps.softmax(x, -1, dtype=torch.int32)
    with pytest.raises(TypeError, match="dim must be an int"):
        ps.softmax(x, 1.0)


def test_unserved_device_is_a_runtime_error(monkeypatch):
    from portable_softmax import backend

    interpreter = backend.get_backend("interpreter")
    backend.unregister_backend("interpreter")
    try:
        with pytest.raises(RuntimeError, match="no portable_softmax backend serves 'cpu'"):
            ps.softmax(torch.randn(2, 3), -1)
    finally:
        backend.register_backend(interpreter)


@pytest.mark.parametrize("regime", ["tile", "split", "ticketed", "pipelined", "loop"])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("cols", [1, 129, 1000])
def test_every_regime_writes_every_element(device, monkeypatch, regime, log, cols):
    """Launch each path directly into a NaN-poisoned output and check every element (2 rows of
    the split regimes on the interpreter: ``regimes.interpreted``)."""
    force_regime(monkeypatch, regime, device)
    rows = 2 if regime in SPLIT_REGIMES and interpreted(device) else 37
    x = torch.randn(rows, cols, device=device) * 3
    y = torch.full_like(x, float("nan"))
    plan = launch.run_forward(x, y, row_layout.row_view(tuple(x.shape), 1, x, y), log)
    if cols > 64:  # narrower rows fit a tile whatever is forced
        assert regime_of(plan) == regime
    reference = (torch.log_softmax if log else torch.softmax)(x.double(), -1)
    assert not y.isnan().any()
    assert relative_error(y, reference) < 1e-5
    dy = torch.randn_like(x)
    dx = torch.full_like(x, float("nan"))
    yd = reference.float()
    plan = launch.run_backward(yd, dy, dx, row_layout.row_view(tuple(x.shape), 1, yd, dy, dx), log)
    xd = x.double().requires_grad_()
    grad = torch.autograd.grad((torch.log_softmax if log else torch.softmax)(xd, -1), xd, dy.double())[0]
    assert not dx.isnan().any()
    assert relative_error(dx, grad) < 1e-5



@pytest.mark.parametrize("regime", ["tile", "split", "ticketed", "pipelined", "loop"])
def test_replayed_launches_recompute_everything(device, monkeypatch, regime):
    """Later calls with the same key replay the first call's prepared launch (on GPUs, straight
    into the compiled kernel): each replay must compute its own input into a poisoned output, and
    the split path's exchange slots (and the ticket counter) must come back ready for the next
    (rows of 2 x 300 on the interpreter, 3 chunks forward, 5 backward)."""
    if regime == "loop" and ps.device_info(device)["backend"] == "interpreter":
        # 12 s here for nothing the tile case leaves out: every interpreted launch, the first or
        # a replay, goes through launch._run with its arguments laid out afresh. What a loop
        # replay can get wrong (the arguments the direct launcher laid out once) is on GPUs.
        pytest.skip("an interpreted replay is the tile case's: the loop kernel's replay is a GPU risk")
    force_regime(monkeypatch, regime, device)
    shape = (2, 300) if regime in SPLIT_REGIMES and interpreted(device) else (37, 1000)
    first = None
    for _ in range(3):
        x = torch.randn(shape, device=device) * 3
        y = torch.full_like(x, float("nan"))
        view = row_layout.row_view(tuple(x.shape), 1, x, y)
        plan = launch.run_forward(x, y, view, False)
        assert regime_of(plan) == regime and (first is None or plan is first)
        first = plan
        assert relative_error(y, torch.softmax(x.double(), -1)) < 1e-5
        dy, dx = torch.randn_like(x), torch.full_like(x, float("nan"))
        launch.run_backward(y, dy, dx, row_layout.row_view(tuple(x.shape), 1, y, dy, dx), False)
        yd = y.double()
        assert relative_error(dx, yd * (dy.double() - (dy.double() * yd).sum(-1, keepdim=True))) < 1e-5


@pytest.mark.parametrize("grid, cols", [("persistent", 65536), ("ticketed", 65536), ("pipelined", 65536),
                                        ("pipelined", 98304)])
def test_split_rows_of_many_chunks_over_many_items(device, monkeypatch, grid, cols):
    """Rows of 32 chunks (48 forward and 96 backward in the last case, more than a warp's lanes:
    the pipelined row wait, a called function, once read such rows through shared memory that
    the pipeline was still filling, and gave NaN) over many items. Persistent: each program takes many rows in turn and
    empties its slots of a row only after all of the row's chunks have moved on, including the
    programs whose first row is the grid's last (a wrong 'previous row' there once emptied row 0
    early and hung). Ticketed: 65536 programs, far more than fit the chip, take their items by
    ticket; the counter must come back to 0 for the next launch. Pipelined: as persistent, each
    program's next chunks on their way while it waits on its row. On the interpreter, one row
    of as many chunks of 64 columns, once (the exchange's two launches each draw every ticket)."""
    record = ps.device_info(device)
    key = (record["backend"], "*")
    both = frozenset({"forward", "backward"})
    tables = {"persistent": dict(split_tickets=frozenset(), split_pipelined=frozenset()),
              "ticketed": dict(split_tickets=both, split_ticket_bytes=0),
              "pipelined": dict(split_tickets=frozenset(), split_pipelined=both)}
    chunk, rows, calls = (64, 1, 1) if interpreted(device) else (2048, 2048, 3)
    # Rows longer than a program holds whole there too (the interpreter's hold 65536).
    held = {"row_elements": 64} if interpreted(device) else {}
    monkeypatch.setitem(tuning.TUNING, key, tuning.replace(
        tuning.TUNING[key], **open_split(device, split_chunk=chunk, **held, **tables[grid])))
    for _ in range(calls):
        x = torch.randn(rows, cols // 2048 * chunk, device=device, dtype=torch.bfloat16) * 3
        y = torch.full_like(x, float("nan"))
        plan = launch.run_forward(x, y, row_layout.row_view(tuple(x.shape), 1, x, y), False)
        assert plan.regime == "split" and plan.chunks == cols // 2048
        assert regime_of(plan) == ("split" if grid == "persistent" else grid)
        assert plan.programs == plan.items if grid == "ticketed" else plan.items > 4 * plan.programs
        _check(y, torch.softmax(x, -1), torch.softmax(x.double(), -1), torch.bfloat16)
        dy, dx = torch.randn_like(x), torch.full_like(x, float("nan"))
        launch.run_backward(y, dy, dx, row_layout.row_view(tuple(x.shape), 1, y, dy, dx), False)
        yd = y.double()
        assert relative_error(dx, yd * (dy.double() - (dy.double() * yd).sum(-1, keepdim=True))) < 1e-2


@pytest.mark.parametrize("regime", ["tile", "split", "ticketed", "pipelined", "loop"])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_rows_far_below_zero_in_every_regime(device, monkeypatch, regime, log):
    """Rows whose values all lie below -88, where exp underflows: the streaming loop once
    rescaled its empty running sum by exp(0 - maximum) = inf and gave NaN (0 * inf). Also a row
    that starts with a span of -inf (5 rows of 600 for the split regimes on the interpreter)."""
    force_regime(monkeypatch, regime, device)
    shape = (5, 600) if regime in SPLIT_REGIMES and interpreted(device) else (37, 1000)
    x = torch.randn(shape, device=device) * 3 - 1000
    x[3] = -100.0
    x[4, :500], x[4, 500:] = -float("inf"), x[4, 500:] - 4000
    y = torch.full_like(x, float("nan"))
    plan = launch.run_forward(x, y, row_layout.row_view(tuple(x.shape), 1, x, y), log)
    assert regime_of(plan) == regime
    reference = (torch.log_softmax if log else torch.softmax)(x.double(), -1)
    assert torch.equal(y.isinf(), reference.isinf()) and not y.isnan().any()
    finite = reference.isfinite()
    assert relative_error(y[finite], reference[finite]) < 1e-5


def test_ticketed_and_persistent_split_launches_interleave(device, monkeypatch):
    """Ticketed launches leave their slots full and fill them before each launch; persistent
    launches need theirs empty. Alternating the two (and shapes) must keep both right (on the
    interpreter, whose exchange in two launches empties nothing, rows of 300 in 2 or 3 rows)."""
    record = ps.device_info(device)
    key = (record["backend"], "*")
    base = tuning.replace(tuning.TUNING[key], **open_split(
        device, row_elements=64, split_chunk=128, split_min_cols=1 << 30, split_ticket_bytes=0, split_ticket_waves=0,
        split_tickets=frozenset({"forward"})))
    shapes = [(2, 300), (3, 300)] if interpreted(device) else [(37, 1000), (64, 1000)]
    for tickets, shape in [("forward", shapes[0]), ("", shapes[0]), ("forward", shapes[1]), ("", shapes[1]),
                           ("forward", shapes[0])]:
        monkeypatch.setitem(tuning.TUNING, key, tuning.replace(base, split_tickets=frozenset({tickets} - {""})))
        x = torch.randn(shape, device=device) * 3
        y = torch.full_like(x, float("nan"))
        plan = launch.run_forward(x, y, row_layout.row_view(tuple(x.shape), 1, x, y), False)
        assert plan.regime == "split" and plan.ticketed == bool(tickets)
        assert relative_error(y, torch.softmax(x.double(), -1)) < 1e-5


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cols", [129, 1001])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_split_rows_off_alignment_through_windows(device, monkeypatch, dtype, cols, log):
    """Split rows off 16-byte boundaries, every offset among 24 rows, read through aligned
    windows in both directions: each element is written from its own row into poisoned outputs,
    the elements that share a group with a neighbour's included, at every chunk boundary (chunks
    of 128 forward, 64 backward); a neighbour's NaN, inf or 1e4 must not leak into a row. On the
    interpreter 9 rows, every offset still (rows of 129 and 1001 elements start one element
    further past a group each), and rows of 257 for 1001: a chunk inside the row still."""
    force_regime(monkeypatch, "split", device)
    key = (ps.device_info(device)["backend"], "*")
    monkeypatch.setitem(tuning.TUNING, key, tuning.replace(tuning.TUNING[key],
                                                           split_windows=frozenset({"forward", "backward"})))
    rows, cols = (9, min(cols, 257)) if interpreted(device) else (24, cols)
    x = torch.randn(rows, cols, device=device, dtype=dtype) * 3
    x[5], x[6, -1], x[7, 0], x[8, :] = float("nan"), float("inf"), 1e4, -float("inf")
    for plan in _round_trip(x, log, dtype):
        assert plan.regime == "split" and plan.align == 16 // x.element_size()


def _round_trip(x: torch.Tensor, log: bool, dtype: torch.dtype) -> tuple:
    """The forward of ``x`` and the backward of its finite rows, each into a poisoned output and
    against torch in float64 (NaN and inf where torch's are): the two launches' plans."""
    fn = torch.log_softmax if log else torch.softmax
    y = torch.full_like(x, float("nan"))
    forward = launch.run_forward(x, y, row_layout.row_view(tuple(x.shape), 1, x, y), log)
    reference = fn(x.double(), -1)
    assert torch.equal(y.isnan(), reference.isnan()) and torch.equal(y.isinf(), reference.isinf())
    finite = reference.isfinite().all(-1)
    _check(y[finite], fn(x, -1)[finite], reference[finite], dtype)
    yd = fn(x[finite].double(), -1).to(dtype)
    dy = torch.randn_like(yd)
    dx = torch.full_like(yd, float("nan"))
    backward = launch.run_backward(yd, dy, dx, row_layout.row_view(tuple(yd.shape), 1, yd, dy, dx), log)
    xd = x[finite].double().requires_grad_()
    grad = torch.autograd.grad(fn(xd, -1), xd, dy.double())[0]
    theirs = torch.ops.aten._log_softmax_backward_data if log else torch.ops.aten._softmax_backward_data
    _check(dx, theirs(dy, yd, -1, dtype), grad, dtype)
    return forward, backward


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cols", [201, 255, 3001, 4095])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("reread", [False, True], ids=["held", "reread"])
def test_tile_rows_off_alignment_through_windows(device, monkeypatch, dtype, cols, log, reread):
    """Tiles of one row off 16-byte boundaries, every offset among the rows, read through
    aligned windows (``kernels/tile_windows.py``) in both directions, held or read twice: each
    element written from its own row into poisoned outputs, the edges shared with a neighbour's
    group included; a neighbour's NaN, inf or 1e4 must not leak into a row. Contiguous rows, rows
    sliced from wider ones (their outputs contiguous: written at the inputs' windows, ``SHIFTED``).
    Rows a column short of the block (255, 4095): their windows' last edges lie past it. On the
    interpreter rows of 201 and 255 (a tile of 256 columns)."""
    force_regime(monkeypatch, "tile", device)
    key = (ps.device_info(device)["backend"], "*")
    forms = [(direction, size) for direction in ("forward", "backward") for size in (2, 4, 8)]
    # Tiles, not CUDA's split rows (``window_split_cols``), at the tuning's warps and at 32 a thread.
    monkeypatch.setitem(tuning.TUNING, key, tuning.replace(
        tuning.TUNING[key], tile_windows=dict.fromkeys(forms, 0), window_split_cols={},
        reread_cols={form: frozenset({256, 4096}) for form in forms} if reread else {}))
    if interpreted(device) and cols > 256:
        pytest.skip("the interpreter's tiles hold 256 columns: rows of 201 stand for both")
    align = 16 // torch.tensor([], dtype=dtype).element_size()
    for rows, sliced, width in [(9, False, cols), (11, True, cols)]:
        padded = torch.randn(rows, width + 5, device=device, dtype=dtype) * 3
        x = padded[:, :width] if sliced else padded[:, :width].contiguous()
        x[1], x[2, -1], x[3, 0], x[4, :] = float("nan"), float("inf"), 1e4, -float("inf")
        forward, backward = _round_trip(x, log, dtype)
        assert (forward.regime, forward.block_m, forward.align) == ("tile", 1, align), forward.reason
        assert (backward.regime, backward.block_m, backward.align, backward.reread) == ("tile", 1, align, reread), \
            backward.reason


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fns", FUNCTIONS, ids=FUNCTION_IDS)
@pytest.mark.parametrize("regime", ["split", "pipelined"])
def test_split_rows_with_a_chunk_of_only_minus_inf(device, monkeypatch, fns, dtype, regime):
    """A split row whose first chunks hold only -inf (a long masked span) and whose finite values
    lie far below 0: the row's maximum must come from its finite chunk, not from the 0 that a
    chunk of -inf takes as its local reference (that once gave exp(-1000) = 0 sums and NaN rows).
    Rows of -inf only stay NaN, as in torch (4 rows of 600 on the interpreter)."""
    ours, theirs = fns
    force_regime(monkeypatch, regime, device)
    if regime == "pipelined":
        monkeypatch.setenv(launch.PROGRAMS_ENV, "16")  # rows of 8 chunks: 3 items per program
    x = torch.randn((4, 600) if interpreted(device) else (6, 1000), device=device, dtype=dtype) - 1000
    x[:, :300] = -float("inf")
    x[1, 500:] = -float("inf")
    x[2] = -float("inf")
    x[3, :] = x[3, :].clamp(max=-5000)
    x[3, -1] = 10.0
    y = torch.full_like(x, float("nan"))
    plan = launch.run_forward(x, y, row_layout.row_view(tuple(x.shape), 1, x, y), ours is ps.log_softmax)
    assert regime_of(plan) == regime and plan.chunks > 2
    expected = theirs(x, -1)
    assert torch.equal(y.isnan(), expected.isnan()) and torch.equal(y.isinf(), expected.isinf())
    finite = expected.isfinite()
    tolerances = {} if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(y[finite], expected[finite], **tolerances)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided_cols", "two_groups", "dense",
                                    "dense_transposed"])
def test_reread_tiles(device, monkeypatch, dtype, log, layout):
    """The tile kernels that read their inputs twice (``Tuning.reread_cols``): every element of
    a poisoned output, odd widths, strided and grouped views, -inf; and their ``DENSE`` form, for
    one group of rows as wide as the block (contiguous or with strided columns)."""
    key = (ps.device_info(device)["backend"], "*")
    everywhere = {(direction, size): frozenset(1 << k for k in range(21)) for direction in ("forward", "backward")
                  for size in (2, 4, 8)}
    monkeypatch.setitem(tuning.TUNING, key, tuning.replace(tuning.TUNING[key], reread_cols=everywhere))
    x = torch.randn(24, 781, device=device) * 3
    if layout == "transposed":
        x = torch.randn(781, 24, device=device).t() * 3
    elif layout == "strided_cols":
        x = torch.randn(24, 2343, device=device)[:, ::3] * 3
    elif layout == "two_groups":
        x = torch.randn(4, 781, 6, device=device).transpose(1, 2) * 3
    elif layout == "dense":
        x = torch.randn(24, 1024, device=device) * 3
    elif layout == "dense_transposed":
        x = torch.randn(1024, 24, device=device).t() * 3
    fn = torch.log_softmax if log else torch.softmax
    y = fn(x.double(), -1).to(dtype)
    dy = torch.randn(x.shape, device=device).to(dtype)
    dx = torch.full(x.shape, float("nan"), device=device, dtype=dtype)
    plan = launch.run_backward(y, dy, dx, row_layout.row_view(tuple(x.shape), x.dim() - 1, y, dy, dx), log)
    dense = layout.startswith("dense")
    assert plan.regime == "tile" and plan.reread and plan.block_n == 1024 and plan.dense == dense
    theirs = torch.ops.aten._log_softmax_backward_data if log else torch.ops.aten._softmax_backward_data
    _check(dx, theirs(dy, y, -1, dtype), theirs(dy.double(), y.double(), -1, torch.float64), dtype)
    x = x.to(dtype)
    x[(0,) * (x.dim() - 1)][:5] = -float("inf")
    out = torch.full(x.shape, float("nan"), device=device, dtype=dtype)
    view = row_layout.row_view(tuple(x.shape), x.dim() - 1, x, out)
    plan = launch.run_forward(x, out, view, log)
    if view.strided:
        # x's rows lie side by side (transposed, two groups): tiles of adjacent rows, read once
        # (held whole on the interpreter, split on GPUs: 32 float32 rows of 1024 is past a tile).
        assert plan.block_m > 1 and not plan.reread
    else:
        assert plan.regime == "tile" and plan.reread and plan.dense == dense
    expected = fn(x.double(), -1)
    assert torch.equal(out.isinf(), expected.isinf()) and not out.isnan().any()
    finite = expected.isfinite()
    _check(out[finite], fn(x, -1)[finite], expected[finite], dtype)


@pytest.mark.parametrize("shape", [(64, 128), (60, 128), (24, 1024), (16, 1000)], ids=str)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_dense_held_tiles(device, monkeypatch, shape, log):
    """Held tiles in the kernels' ``DENSE`` form (``Tuning.dense_tiles``): taken only where the rows
    fill their tiles (64 rows of 8-row tiles, not 60; 1024 columns, not 1000), both directions,
    poisoned outputs."""
    key = (ps.device_info(device)["backend"], "*")
    monkeypatch.setitem(tuning.TUNING, key, tuning.replace(
        tuning.TUNING[key], tile_elements=1024, dense_tiles=frozenset({"forward", "backward"}), reread_cols={}))
    x = torch.randn(shape, device=device) * 3
    dense = shape[0] % max(1, 1024 // shape[1]) == 0 and shape[1] in (128, 1024)
    y = torch.full_like(x, float("nan"))
    plan = launch.run_forward(x, y, row_layout.row_view(shape, 1, x, y), log)
    assert plan.regime == "tile" and not plan.reread and plan.dense == dense
    fn = torch.log_softmax if log else torch.softmax
    _check(y, fn(x, -1), fn(x.double(), -1), torch.float32)
    dy = torch.randn_like(x)
    dx = torch.full_like(x, float("nan"))
    plan = launch.run_backward(y, dy, dx, row_layout.row_view(shape, 1, y, dy, dx), log)
    assert plan.regime == "tile" and plan.dense == dense
    theirs = torch.ops.aten._log_softmax_backward_data if log else torch.ops.aten._softmax_backward_data
    _check(dx, theirs(dy, y, -1, torch.float32), theirs(dy.double(), y.double(), -1, torch.float64), torch.float32)


@pytest.mark.parametrize("shape", [(16, 1000), (60, 128), (2, 3, 781)], ids=str)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_flat_tiles_forward_and_backward(device, monkeypatch, shape, log):
    """Masked tiles in the kernels' flat form (``Tuning.flat_tiles``: ``DENSE`` 2, no group division,
    int32 offsets, masks kept): taken for one group of rows that do not fill their tiles (1000
    columns of 1024; 60 rows of 8-row tiles), not for two groups (a 3-d tensor's rows sliced from
    a padded middle dimension), both directions, poisoned outputs."""
    key = (ps.device_info(device)["backend"], "*")
    monkeypatch.setitem(tuning.TUNING, key, tuning.replace(
        tuning.TUNING[key], tile_elements=1024, flat_tiles=frozenset({"forward", "backward"}), reread_cols={}))
    def fresh(scale: float) -> torch.Tensor:
        if len(shape) == 2:
            return torch.randn(shape, device=device) * scale
        return (torch.randn(shape[0], shape[1] + 1, shape[2], device=device) * scale)[:, :shape[1]]  # two groups

    x = fresh(3.0)
    flat = len(shape) == 2
    view = lambda *tensors: row_layout.row_view(tuple(x.shape), x.dim() - 1, *tensors)  # noqa: E731
    y = torch.full_like(x, float("nan"))
    plan = launch.run_forward(x, y, view(x, y), log)
    assert plan.regime == "tile" and not plan.dense and plan.flat == flat
    fn = torch.log_softmax if log else torch.softmax
    _check(y, fn(x, -1), fn(x.double(), -1), torch.float32)
    dy = fresh(1.0)
    dx = torch.full_like(x, float("nan"))
    plan = launch.run_backward(y, dy, dx, view(y, dy, dx), log)
    assert plan.regime == "tile" and plan.flat == flat
    theirs = torch.ops.aten._log_softmax_backward_data if log else torch.ops.aten._softmax_backward_data
    _check(dx, theirs(dy, y, -1, torch.float32), theirs(dy.double(), y.double(), -1, torch.float64), torch.float32)


@pytest.mark.parametrize("per_tile", [True, False], ids=["per_tile", "looping"])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_tile_grids_with_and_without_the_loop_over_tiles(device, monkeypatch, per_tile, log):
    """A grid of a program per tile runs the tile kernels compiled without their loop over tiles
    (``PER_TILE``), a looping grid the kernels with it: both directions, poisoned outputs, an odd
    width."""
    key = (ps.device_info(device)["backend"], "*")
    threshold = 1 if per_tile else 2**31 - 1
    monkeypatch.setitem(tuning.TUNING, key, tuning.replace(
        tuning.TUNING[key], tile_loop_occupancy=tuning.both_directions(threshold), tile_waves=1,
        reread_cols={}))
    # The interpreter's grid holds 4 programs: a program per tile there needs 4 tiles or fewer.
    rows = 3 if per_tile and device == "cpu" else 20000 if device != "cpu" else 1823
    x = torch.randn(rows, 781, device=device) * 3
    y = torch.full_like(x, float("nan"))
    plan = launch.run_forward(x, y, row_layout.row_view(tuple(x.shape), 1, x, y), log)
    assert plan.regime == "tile" and plan.per_tile == per_tile and (plan.programs < plan.tiles) != per_tile
    fn = torch.log_softmax if log else torch.softmax
    _check(y, fn(x, -1), fn(x.double(), -1), torch.float32)
    dy = torch.randn_like(x)
    dx = torch.full_like(x, float("nan"))
    plan = launch.run_backward(y, dy, dx, row_layout.row_view(tuple(x.shape), 1, y, dy, dx), log)
    assert plan.regime == "tile" and plan.per_tile == per_tile
    theirs = torch.ops.aten._log_softmax_backward_data if log else torch.ops.aten._softmax_backward_data
    _check(dx, theirs(dy, y, -1, torch.float32), theirs(dy.double(), y.double(), -1, torch.float64), torch.float32)


@pytest.mark.parametrize("case", ["wider_rows", "dtype_float32", "three_dims"])
def test_split_windows_over_views_and_casts(device, monkeypatch, case):
    """Windows where the tensors differ: x a view whose rows are 8 elements wider than y's
    (equally far past an aligned element, so one window fits both), a bf16 input written as
    float32 (``dtype=``), and a 3-D view whose groups and rows both stride (24 rows of 1001; 3 or
    4 rows of 257 on the interpreter)."""
    force_regime(monkeypatch, "split", device)
    few = interpreted(device)
    rows, cols = (3, 257) if few else (24, 1001)
    if case == "wider_rows":
        x = (torch.randn(rows, cols + 8, device=device, dtype=torch.bfloat16) * 3)[:, :cols]
    elif case == "dtype_float32":
        x = torch.randn(rows, cols, device=device, dtype=torch.bfloat16) * 3
    else:
        x = (torch.randn(2 if few else 3, 4 if few else 16, cols + 8, device=device, dtype=torch.bfloat16) * 3)[
            :, :2 if few else 8, :cols]
    out_dtype = torch.float32 if case == "dtype_float32" else x.dtype
    y = torch.full(x.shape, float("nan"), device=device, dtype=out_dtype)
    view = row_layout.row_view(tuple(x.shape), x.dim() - 1, x, y)
    plan = launch.run_forward(x, y, view, False)
    assert plan.regime == "split" and plan.align == 8
    reference = torch.softmax(x.double(), -1)
    _check(y, torch.softmax(x, -1, dtype=out_dtype), reference, out_dtype if case == "dtype_float32" else x.dtype)


def test_alignment_specializations_do_not_share_a_kernel(device):
    """A kernel specialised for 16-aligned rows must not serve a 781-wide bf16 row (this crashed
    the tutorial's cache with 'misaligned address')."""
    for cols in (1024, 781, 1024, 783):
        x = torch.randn(64, cols, device=device, dtype=torch.bfloat16)
        _check(ps.softmax(x, -1), torch.softmax(x, -1), torch.softmax(x.double(), -1), torch.bfloat16)
    assert launch._specialization((x[:, 1:],)) != launch._specialization((x,))


def test_cpu_launch_leaves_gpu_compilation_working():
    """The interpreter patches triton.language during a CPU launch; compiling for a GPU target
    afterwards in the same process must still work."""
    from triton.backends.compiler import GPUTarget
    import triton

    from portable_softmax import compat, kernels

    ps.softmax(torch.randn(4, 33), -1)
    # The signature from the variant table: pointers to fp32, column strides of 1, fused scalars off.
    signature = {name: "i32" for name in variants.parameter_names("forward", "tile")}
    signature.update({f"{t}_ptr": "*fp32" for t in variants.tensor_names("forward", "tile")},
                     x_col_stride="constexpr", y_col_stride="constexpr", scale_value="fp32")
    config = types.SimpleNamespace(regime="tile", block_m=1, block_n=64, reread=False, per_tile=True, dense=False,
                                   flat=False, align=1)
    constexprs = {"x_col_stride": 1, "y_col_stride": 1, **variants.constexprs(config, variants.CallFacts(log=False))}
    signature.update({name: "constexpr" for name in constexprs})
    compiled = triton.compile(compat.ast_source(kernels.softmax_forward_tile, signature, constexprs),
                              target=GPUTarget("cuda", 90, 32), options={"enable_fp_fusion": True})
    assert "cubin" in compiled.asm
