"""The call path: a repeated call is one lookup and one launch; what changes the binary changes the
record; overrides, threads and graph capture keep working."""
from __future__ import annotations

import threading

import pytest
import torch

import portable_softmax as ps
from portable_softmax import device as device_layer
from portable_softmax import fused, launch, launch_compile, launch_plan, row_layout, op_arguments
from portable_softmax.selfcheck import relative_error
from portable_softmax.tuning import TUNING, replace, tuning_for


def _count(monkeypatch, module, name: str, counts: dict) -> None:
    real = getattr(module, name)

    def counted(*args, **kwargs):
        # Not the backward's build a compiled device starts beside its forward's (its own thread).
        if threading.current_thread().name != launch_compile.AHEAD_THREAD:
            counts[name] = counts.get(name, 0) + 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_a_repeated_call_plans_compiles_and_queries_nothing(device, monkeypatch, log):
    fn, theirs = (ps.log_softmax, torch.log_softmax) if log else (ps.softmax, torch.softmax)
    x = torch.randn(48, 333, device=device, requires_grad=True)
    dy = torch.randn(48, 333, device=device)
    counts: dict = {}
    for module, name in ((launch_plan, "plan_launch"), (launch, "_compiled_resources"), (launch, "build_record"),
                         (launch, "backend_for"), (launch, "device_record"), (device_layer, "_record_or_error"),
                         (op_arguments, "_validate")):
        _count(monkeypatch, module, name, counts)
    torch.autograd.grad(fn(x, -1), x, dy)
    first = dict(counts)
    # Forward and backward (each plans again where its compiled kernel's resources are not the known ones).
    assert first.get("build_record") == 2 and first.get("plan_launch", 0) >= 2
    counts.clear()
    for _ in range(3):
        y = fn(x, -1)
        (dx,) = torch.autograd.grad(y, x, dy)
        with torch.no_grad():
            fn(x, -1)
    assert counts == {}, f"repeated calls planned, compiled or queried: {counts}"
    expected = torch.autograd.grad(theirs(x.double(), -1), x, dy.double())[0]
    assert relative_error(dx, expected) < 1e-5


def test_the_backward_call_a_forward_keeps_is_the_one_its_gradient_needs(device, monkeypatch):
    """Autograd's backward takes the backward call its forward call keeps (``_Call.gradient``)
    only for a gradient laid out as the output, within the generation it was found in and under
    the same overrides: a gradient of other strides, a changed tuning table or an override
    between the forward and the backward finds its own call, planned from what holds now."""
    x = torch.randn(24, 40, device=device, requires_grad=True)
    expected = lambda dy: torch.autograd.grad(torch.softmax(x.double(), -1), x, dy.double())[0]  # noqa: E731
    y = ps.softmax(x, -1)
    usual = torch.randn(24, 40, device=device)
    transposed = torch.randn(40, 24, device=device).t()  # strides (1, 24)
    assert relative_error(torch.autograd.grad(y, x, usual, retain_graph=True)[0], expected(usual)) < 1e-5
    built = []
    real = launch.build_record
    monkeypatch.setattr(launch, "build_record", lambda *a, **k: built.append(a[0]) or real(*a, **k))
    for _ in range(2):
        (dx,) = torch.autograd.grad(y, x, usual, retain_graph=True)
    assert built == [] and relative_error(dx, expected(usual)) < 1e-5
    (dx,) = torch.autograd.grad(y, x, transposed, retain_graph=True)
    assert built == ["backward"] and relative_error(dx, expected(transposed)) < 1e-5
    record = device_layer.device_record(x.device)
    key = (record.backend, record.name)
    monkeypatch.setitem(TUNING, key, replace(tuning_for(record), tile_elements=512))
    (dx,) = torch.autograd.grad(y, x, usual, retain_graph=True)
    assert built == ["backward"] * 2 and relative_error(dx, expected(usual)) < 1e-5
    monkeypatch.setenv(launch.PROGRAMS_ENV, "1")
    (dx,) = torch.autograd.grad(y, x, usual, retain_graph=True)
    assert built == ["backward"] * 3 and relative_error(dx, expected(usual)) < 1e-5


def test_a_repeated_fused_call_plans_and_compiles_nothing(device, monkeypatch):
    """Fused calls (a number scale and a bool mask; a learnable temperature and causal) keep
    their records as plain calls do: a repeat plans nothing; another scale value is its own."""
    x = torch.randn(2, 3, 5, 333, device=device, requires_grad=True)
    mask = torch.rand(2, 1, 1, 333, device=device) > 0.2
    temperature = (torch.rand(2, 3, 5, 1, device=device) + 0.5).requires_grad_()
    dy = torch.randn(2, 3, 5, 333, device=device)
    calls = [dict(scale=0.125, mask=mask), dict(scale=1 / temperature, causal=True)]
    counts: dict = {}
    for module, name in ((launch_plan, "plan_launch"), (launch, "_compiled_resources"), (launch, "build_record"),
                         (fused, "_fusion"), (op_arguments, "_validate"), (fused, "_check")):
        _count(monkeypatch, module, name, counts)
    for kwargs in calls:
        torch.autograd.grad(ps.softmax(x, -1, **kwargs), x, dy)
    assert counts.get("build_record") == 4  # each call's forward and backward
    counts.clear()
    for _ in range(3):
        for kwargs in calls:
            (dx,) = torch.autograd.grad(ps.softmax(x, -1, **kwargs), x, dy)
    assert counts == {}, f"repeated fused calls planned, compiled or validated: {counts}"
    ps.softmax(x.detach(), -1, scale=0.25, mask=mask)
    assert counts.get("build_record") == 1


def test_a_repeated_fused_call_reads_its_own_mask_and_scale(device):
    """A kept fused call launches on the tensors of the call at hand: other masks and scales of
    the same signature give their own results."""
    x = torch.randn(3, 4, 200, device=device)
    for _ in range(2):
        for trial in range(3):
            mask = torch.rand(3, 1, 200, device=device) > 0.3
            scale = torch.rand(3, 4, 1, device=device) + 0.5
            y = ps.softmax(x, -1, scale=scale, mask=mask)
            expected = torch.softmax((x.double() * scale.double()).masked_fill(~mask, float("-inf")), -1)
            assert relative_error(y, expected) < 1e-5, trial


def test_alignment_and_strides_pick_their_own_binary(device):
    """1024-wide bf16 rows, then 781-wide ones (rows no longer 16-byte aligned), then a view that
    starts one element in: each gets the binary specialised for it (a record keyed on less once
    crashed with "misaligned address")."""
    base = torch.randn(64, 1024 + 8, device=device, dtype=torch.bfloat16) * 3
    for x in (base[:, :1024].contiguous(), base[:, :781].contiguous(), base[:, 1:782], base[:, :1024]):
        y = ps.softmax(x, -1)
        assert relative_error(y, torch.softmax(x.double(), -1)) < 1e-2
        assert y.shape == x.shape and y.is_contiguous()


def test_overrides_take_effect_after_a_call(device, monkeypatch):
    x = torch.randn(37, 1000, device=device)
    first = launch.run_forward(x, torch.empty_like(x), row_layout.row_view(tuple(x.shape), 1, x, x), False)
    monkeypatch.setenv(launch.PROGRAMS_ENV, "1")
    built = []
    real = launch.build_record
    monkeypatch.setattr(launch, "build_record", lambda *a, **k: built.append(1) or real(*a, **k))
    y = ps.softmax(x, -1)
    assert built, "a changed PORTABLE_SOFTMAX_PROGRAMS did not re-plan the call"
    forced = launch.run_forward(x, torch.empty_like(x), row_layout.row_view(tuple(x.shape), 1, x, x), False)
    assert forced.programs == 1 != first.programs or first.programs == 1
    assert relative_error(y, torch.softmax(x.double(), -1)) < 1e-5
    monkeypatch.setenv("PORTABLE_SOFTMAX_BACKEND", "nosuch")
    with pytest.raises(ValueError, match="unknown portable_softmax backend 'nosuch'"):
        ps.softmax(x, -1)


def test_threads_calling_at_once_get_right_answers(device):
    if device == "cpu":
        pytest.skip("interpreted launches from threads: tests/test_threads.py covers them")
    shapes = [(8, 1000), (33, 4096), (2, 50257)]
    inputs = [torch.randn(shape, device=device) for shape in shapes]
    expected = [torch.softmax(x, -1) for x in inputs]
    errors: list = []

    def work(index: int) -> None:
        for step in range(40):
            k = (index + step) % len(inputs)
            y = ps.softmax(inputs[k], -1)
            if not torch.allclose(y, expected[k], rtol=1e-5, atol=1e-6):
                errors.append((index, step, shapes[k]))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_graph_capture_and_replay(device):
    if device == "cpu":
        pytest.skip("CUDA graphs need a GPU")
    module = getattr(torch, device)
    if not hasattr(module, "CUDAGraph"):
        pytest.skip(f"no graphs on {device}")
    # A tile, a few-row persistent split, and a ticketed split (on the H100 and H200, whose slots
    # are filled before each launch: the fill must be captured with it), each replayed three times.
    for shape in [(64, 4096), (4, 131072), (256, 151936)]:
        x = torch.randn(shape, device=device)
        ps.softmax(x, -1)  # built outside the capture
        stream = module.Stream()
        stream.wait_stream(module.current_stream())
        with module.stream(stream):
            ps.softmax(x, -1)  # and on the capture stream (the split scratch is per stream)
        module.current_stream().wait_stream(stream)
        graph = module.CUDAGraph()
        with module.graph(graph):
            y = ps.softmax(x, -1)
        for _ in range(3):
            x.copy_(torch.randn(shape, device=device))
            y.fill_(float("nan"))
            graph.replay()
            module.synchronize()
            assert relative_error(y, torch.softmax(x.double(), -1)) < 1e-5


def test_a_temperature_tensor_of_changing_value_keeps_one_launch(device, monkeypatch):
    """A number scale is part of a fused call's signature; a 0-d tensor scale is read by the
    kernel, so a temperature that changes every call plans once (README, fused section)."""
    counts: dict = {}
    _count(monkeypatch, launch, "build_record", counts)
    x = torch.randn(3, 5, 40, device=device)
    for t in (0.5, 0.9, 2.0):
        y = ps.softmax(x, -1, scale=torch.tensor(1 / t, device=device))
        assert relative_error(y, torch.softmax(x.double() / t, -1)) < 1e-5
    assert counts == {"build_record": 1}
    for t in (0.5, 0.9):
        ps.softmax(x, -1, scale=1 / t)
    assert counts == {"build_record": 3}
