"""torch.compile through portable_softmax: the custom operators of ``torch_ops.py``.

A small module (Linear, softmax over the last dim, log_softmax over the first) must compile into
one graph with no breaks, with portable_softmax's operators in it; run under the ``eager`` and
``aot_eager`` backends (and ``inductor`` where a C++ compiler is present) with the same result
as eager; and give torch's gradients, through the backward kernel. Shapes are tiny: on the CPU
every kernel runs through Triton's interpreter.
"""
from __future__ import annotations

import shutil

import pytest
import torch

import portable_softmax as ps
from portable_softmax import row_layout, op_arguments, op_calls, torch_ops
from portable_softmax.selfcheck import relative_error, tolerance
from test_fused import _reference as fused_reference

pytestmark = pytest.mark.skipif(not torch_ops.AVAILABLE, reason="torch.library.custom_op needs torch >= 2.4")

import torch._dynamo  # noqa: E402  (after the skip mark: older torch may lack parts of it)


class Net(torch.nn.Module):
    def __init__(self, softmax=ps.softmax, log_softmax=ps.log_softmax) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 6)
        self.softmax, self.log_softmax = softmax, log_softmax

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.log_softmax(self.softmax(self.linear(x), dim=-1) * 3, dim=0)


def _twins(device: str) -> tuple[Net, Net]:
    """Ours and a copy with the same weights using torch.softmax / torch.log_softmax."""
    ours = Net().to(device)
    theirs = Net(torch.softmax, torch.log_softmax).to(device)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts of the eager path's kernel entry points (op_calls._forward / op_calls._backward) per call."""
    calls = {"forward": 0, "backward": 0}
    forward, backward = op_calls._forward, op_calls._backward

    def counted_forward(*args):
        calls["forward"] += 1
        return forward(*args)

    def counted_backward(*args):
        calls["backward"] += 1
        return backward(*args)

    monkeypatch.setattr(op_calls, "_forward", counted_forward)
    monkeypatch.setattr(op_calls, "_backward", counted_backward)
    return calls


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_operators_are_registered_with_dim_dtype_and_log():
    for name in ("softmax", "log_softmax"):
        schema = str(getattr(torch.ops.portable_softmax, name).default._schema)
        assert schema == f"portable_softmax::{name}(Tensor x, int dim, ScalarType dtype) -> Tensor"
    schema = str(torch.ops.portable_softmax.softmax_backward.default._schema)
    assert schema == ("portable_softmax::softmax_backward(Tensor y, Tensor dy, int dim, bool log, "
                      "ScalarType grad_dtype) -> Tensor")


def test_eager_calls_do_not_go_through_the_operators(monkeypatch):
    """Counted where the operators run (their forward implementation and the backward operator
    their autograd formula calls): nothing for eager calls, forward and backward; the same calls
    compiled count, so the counters are where a call through the operators passes."""
    calls = {"forward": 0, "backward": 0}
    forward, backward = torch_ops._forward_impl, torch_ops.softmax_backward

    def counted_forward(*args):
        calls["forward"] += 1
        return forward(*args)

    def counted_backward(*args):
        calls["backward"] += 1
        return backward(*args)

    monkeypatch.setattr(torch_ops, "_forward_impl", counted_forward)
    monkeypatch.setattr(torch_ops, "softmax_backward", counted_backward)
    x = torch.randn(3, 5, requires_grad=True)

    def f(t):
        return ps.softmax(t, -1).sum() + ps.log_softmax(t, 0).sum()

    f(x).backward()
    with torch.no_grad():
        f(x)
    assert calls == {"forward": 0, "backward": 0}, "eager calls took the custom-operator path"
    torch.compile(f, backend="eager", fullgraph=True)(x).backward()
    assert calls == {"forward": 2, "backward": 2}


def test_operators_check_a_call_signature_once(device, monkeypatch):
    """The operators check their arguments where a call signature is new, as the eager path does:
    a repeated call is one lookup and one launch (the checks took 7 of the backward operator's
    48 us a call on a CPU host). What the signature does not hold is checked on every call: a dy
    of another shape with the same strides is refused, never launched; a bad call is refused each
    time, nothing of it kept."""
    op_calls._forget_calls()
    checked = []
    validate = op_arguments._validate
    monkeypatch.setattr(op_arguments, "_validate", lambda *args: checked.append(args[-1]) or validate(*args))
    softmax, backward = torch.ops.portable_softmax.softmax.default, torch.ops.portable_softmax.softmax_backward.default
    x, dy = torch.randn(3, 5, device=device), torch.randn(3, 5, device=device)
    for _ in range(3):
        y = softmax(x, -1, torch.float32)
        dx = backward(y, dy, -1, False, torch.float32)
    assert checked == ["softmax", "softmax_backward"]
    y64 = torch.softmax(x.double(), -1)
    expected = torch._softmax_backward_data(dy.double(), y64, 1, torch.float64)
    assert relative_error(dx, expected) < 1e-5
    with pytest.raises(ValueError, match="dy has shape"):
        backward(y, torch.randn(2, 5, device=device), -1, False, torch.float32)
    for _ in range(2):
        with pytest.raises(TypeError, match="dtype must be"):
            backward(y, dy, -1, False, torch.int32)
        with pytest.raises(IndexError, match="out of range"):
            backward(y, dy, 2, False, torch.float32)


def test_no_graph_breaks(device):
    ours, _ = _twins(device)
    explanation = torch._dynamo.explain(ours)(torch.randn(4, 8, device=device))
    assert explanation.graph_break_count == 0, [str(reason) for reason in explanation.break_reasons]
    assert explanation.graph_count == 1
    code = explanation.graphs[0].code
    assert "torch.ops.portable_softmax.softmax.default" in code
    assert "torch.ops.portable_softmax.log_softmax.default" in code


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_module_matches_eager_and_torch_gradients(device, backend, kernel_calls):
    ours, theirs = _twins(device)
    x = torch.randn(4, 8, device=device)
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()

    compiled = torch.compile(ours, backend=backend, fullgraph=True)
    out = compiled(x_ours)
    assert kernel_calls["forward"] == 2
    with torch.no_grad():
        eager = ours(x)
    torch.testing.assert_close(out, eager)
    reference = theirs(x_theirs)
    torch.testing.assert_close(out, reference)

    grad = torch.randn_like(out)
    out.backward(grad)
    reference.backward(grad)
    assert kernel_calls["backward"] == 2, "the backward kernel did not run for both operators"
    torch.testing.assert_close(x_ours.grad, x_theirs.grad)
    for (name, mine), theirs_param in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(mine.grad, theirs_param.grad, msg=lambda m, name=name: f"{name}: {m}")


def test_dtype_argument_under_compile(device):
    x = torch.randn(3, 7, device=device, requires_grad=True)

    def f(t):
        return ps.softmax(t, 1, dtype=torch.float64)

    out = torch.compile(f, backend="aot_eager", fullgraph=True)(x)
    x_theirs = x.detach().clone().requires_grad_()
    reference = torch.softmax(x_theirs, 1, dtype=torch.float64)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, reference)
    grad = torch.randn_like(out)
    out.backward(grad)
    reference.backward(grad)
    assert x.grad.dtype == torch.float32
    torch.testing.assert_close(x.grad, x_theirs.grad)


def test_layout_matches_the_fake_when_rows_need_a_copy(device):
    # Softmax over a middle dim of a strided 4-d tensor: the eager path copies to a contiguous
    # intermediate. The compiled graph was traced with the fake's layout, so the view after it is
    # valid only if the operator returns that layout.
    base = torch.randn(4, 3, 4, 5, device=device)
    x = base[::2]
    assert row_layout.row_view(tuple(x.shape), 2, x, torch.empty_like(x)) is None, "the case no longer needs a copy"

    def f(t):
        return ps.softmax(t, 2).view(-1) + 1

    out = torch.compile(f, backend="aot_eager", fullgraph=True)(x)
    torch.testing.assert_close(out, torch.softmax(x, 2).reshape(-1) + 1)


def test_dynamic_shapes_do_not_recompile(device):
    """One frame compiled for three shapes (with ``dynamic=False`` each compiles its own)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    def f(t):
        return ps.log_softmax(t, -1)

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(f, backend=counter, dynamic=True, fullgraph=True)
    for rows, cols in [(2, 5), (3, 9), (7, 33)]:
        x = torch.randn(rows, cols, device=device)
        assert relative_error(compiled(x), torch.log_softmax(x.double(), -1)) <= tolerance(torch.float32, 0.0)
    assert counter.frame_count == 1


def test_export_keeps_the_operators(device):
    class Export(torch.nn.Module):
        def forward(self, t):
            return ps.log_softmax(ps.softmax(t, -1) * 2, 0)

    x = torch.randn(3, 5, device=device)
    program = torch.export.export(Export(), (x,))
    targets = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert {"portable_softmax.softmax.default", "portable_softmax.log_softmax.default"} <= targets
    torch.testing.assert_close(program.module()(x), torch.log_softmax(torch.softmax(x, -1) * 2, 0))


def test_validation_errors_are_the_eager_ones():
    def bad_dim(t):
        return ps.softmax(t, 2)

    def integer(t):
        return ps.log_softmax(t.long(), 0)

    x = torch.randn(3, 4)
    for fn, error in [(bad_dim, ps.DimensionError), (integer, TypeError)]:
        with pytest.raises(error) as eager:
            fn(x)
        torch._dynamo.reset()
        with pytest.raises(error) as compiled:
            torch.compile(fn, backend="eager")(x)
        assert str(compiled.value) == str(eager.value)


def test_backend_errors_are_the_eager_ones(monkeypatch):
    monkeypatch.setenv("PORTABLE_SOFTMAX_BACKEND", "nosuch")
    with pytest.raises(ValueError, match="known backends") as eager:
        ps.softmax(torch.randn(2, 3))
    with pytest.raises(ValueError, match="known backends") as compiled:
        torch.compile(lambda t: ps.softmax(t), backend="eager")(torch.randn(2, 3))
    assert str(compiled.value) == str(eager.value)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_opcheck(device, op):
    """Schema, fake tensor, autograd registration and AOT dispatch (static and dynamic)."""
    x = torch.randn(3, 5, device=device, requires_grad=True)
    torch.library.opcheck(getattr(torch.ops.portable_softmax, op).default, (x, 1, torch.float32))
    y = getattr(torch, op)(x.detach(), 0).requires_grad_()
    dy = torch.randn(3, 5, device=device, requires_grad=True)
    torch.library.opcheck(torch.ops.portable_softmax.softmax_backward.default,
                          (y, dy, 0, op == "log_softmax", torch.float32))


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_operator_gradients_and_double_backward(device, log):
    op = torch.ops.portable_softmax.log_softmax if log else torch.ops.portable_softmax.softmax
    x = torch.randn(3, 4, device=device, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: op(t, -1, torch.float64), (x,))
    assert torch.autograd.gradgradcheck(lambda t: op(t, 0, torch.float64), (x,))


def _cxx_compiler() -> str | None:
    return shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # inside inductor
def test_inductor(device):
    if device == "cpu" and _cxx_compiler() is None:
        pytest.skip("inductor needs a C++ compiler for CPU code; none on PATH")
    ours, theirs = _twins(device)
    x = torch.randn(4, 8, device=device)
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = torch.compile(ours, backend="inductor", fullgraph=True)(x_ours)
    reference = theirs(x_theirs)
    torch.testing.assert_close(out, reference)
    out.sum().backward()
    reference.sum().backward()
    torch.testing.assert_close(x_ours.grad, x_theirs.grad)


def _fused_call(x, mask, temperature):
    """A fused call over the last dim (a learnable temperature, a bool mask, causal), and one
    over another dim (a number scale, the mask broadcast along it)."""
    return (ps.softmax(x, -1, scale=1 / temperature, mask=mask, causal=True) * 2
            + ps.log_softmax(x, 1, scale=0.5, mask=mask).exp())


def test_fused_calls_compile_into_one_graph(device):
    x = torch.randn(2, 3, 5, 40, device=device)
    mask = torch.rand(2, 1, 1, 40, device=device) > 0.3
    temperature = torch.rand(2, 3, 5, 1, device=device) + 0.5
    explanation = torch._dynamo.explain(_fused_call)(x, mask, temperature)
    assert explanation.graph_break_count == 0, [str(reason) for reason in explanation.break_reasons]
    code = explanation.graphs[0].code
    assert code.count("torch.ops.portable_softmax.fused_softmax.default") == 2


def _torch_fused_call(x, mask, temperature):
    """``_fused_call`` in torch operations (test_fused's float64 definition)."""
    return (fused_reference(x, scale=1 / temperature, mask=mask, causal=True) * 2
            + fused_reference(x, scale=0.5, mask=mask, log=True, dim=1).exp())


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_fused_calls_match_torch_with_gradients(device, backend):
    """The compiled fused call against torch's composite in float64, forward and the gradients of
    x and of the learnable temperature (through the backward operator)."""
    x = torch.randn(2, 3, 5, 40, device=device, requires_grad=True)
    mask = torch.rand(2, 1, 1, 40, device=device) > 0.3
    temperature = (torch.rand(2, 3, 5, 1, device=device) + 0.5).requires_grad_()
    compiled = torch.compile(_fused_call, backend=backend, fullgraph=True)
    y = compiled(x, mask, temperature)
    x64, temperature64 = (t.detach().double().requires_grad_() for t in (x, temperature))
    expected = _torch_fused_call(x64, mask, temperature64)
    assert relative_error(y, expected) <= tolerance(torch.float32, 0.0)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, temperature), dy)
    expected_grads = torch.autograd.grad(expected, (x64, temperature64), dy.double())
    for ours, theirs in zip(grads, expected_grads):
        assert relative_error(ours, theirs) <= 2 * tolerance(torch.float32, 0.0)


def test_fused_opcheck(device):
    x = torch.randn(2, 3, 5, 8, device=device, requires_grad=True)
    mask = torch.rand(2, 1, 1, 8, device=device) > 0.3
    scale = (torch.rand(2, 3, 5, 1, device=device) + 0.5).requires_grad_()
    op = torch.ops.portable_softmax.fused_softmax.default
    torch.library.opcheck(op, (x, 3, torch.float32, False, scale, None, mask, True))
    torch.library.opcheck(op, (x, 3, torch.float32, True, None, 0.5, None, False))
    per_column = (torch.rand(2, 1, 5, 8, device=device) + 0.5).requires_grad_()
    torch.library.opcheck(op, (x, 1, torch.float32, False, per_column, None, mask, False))
    y = torch.softmax(x.detach(), -1)
    backward = torch.ops.portable_softmax.fused_softmax_backward.default
    torch.library.opcheck(backward, (y, torch.randn_like(y), 3, torch.float32, False, None, 0.5, mask, True))
    torch.library.opcheck(backward, (y, torch.randn_like(y), 1, torch.float32, True, None, 0.5, mask, False))
