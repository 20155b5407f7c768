"""torch's call forms: every way torch.softmax / torch.log_softmax and F.softmax / F.log_softmax
are called reaches the package the same way (the same result, dtype and warnings), and what torch
refuses the package refuses with the same exception type. Compared with torch's own calls."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import portable_softmax as ps
from portable_softmax.selfcheck import relative_error

FUNCTIONS = [(ps.softmax, torch.softmax, F.softmax), (ps.log_softmax, torch.log_softmax, F.log_softmax)]
IDS = ["softmax", "log_softmax"]


def _same(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    finite = torch.isfinite(theirs)
    assert torch.equal(finite, torch.isfinite(ours))
    assert relative_error(ours[finite], theirs[finite].double()) < 1e-5


@pytest.mark.parametrize("functions", FUNCTIONS, ids=IDS)
def test_torch_and_functional_call_forms(device, functions):
    """Positional and keyword forms of both torch's functions: a positional dtype
    (``torch.softmax(x, 0, torch.float64)``), ``input=``, F's ``_stacklevel`` in third place with
    its dtype fourth, index-like dims (a NumPy integer, a one-element tensor)."""
    ours, torch_form, functional = functions
    x = torch.randn(3, 5, 7, device=device)
    forms = [
        (lambda f: f(x, 1, torch.float64), torch_form),
        (lambda f: f(input=x, dim=-1), torch_form),
        (lambda f: f(x, dim=0, dtype=torch.float64), torch_form),
        (lambda f: f(input=x, dim=2, dtype=torch.float64), torch_form),
        (lambda f: f(x, np.int64(1)), torch_form),
        (lambda f: f(x, torch.tensor(-1)), torch_form),
        (lambda f: f(x, 1, 3, torch.float64), functional),
        (lambda f: f(x, 1, 3), functional),
        (lambda f: f(x, -1, _stacklevel=5, dtype=torch.float64), functional),
        (lambda f: f(input=x, dim=0, _stacklevel=3, dtype=None), functional),
    ]
    for call, theirs in forms:
        _same(call(ours), call(theirs))


@pytest.mark.parametrize("functions", FUNCTIONS, ids=IDS)
@pytest.mark.parametrize("rank", [1, 2, 3, 4])
def test_an_implicit_dim_warns_and_picks_torchs(device, functions, rank):
    """``dim=None`` (F's default): the dimension F picks (0 for ranks 0, 1 and 3, else 1), with
    F's deprecation warning pointing at the same line of the caller, under its ``_stacklevel``."""
    ours, _, functional = functions
    x = torch.randn((3, 4, 5, 6)[:rank], device=device)
    for call in (lambda f: f(x, None), lambda f: f(x, dim=None, _stacklevel=3)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y, expected = call(ours), call(functional)
        _same(y, expected)
        ours_warning, their_warning = caught
        assert ours_warning.category is their_warning.category is UserWarning
        assert str(ours_warning.message) == str(their_warning.message)
        assert (ours_warning.filename, ours_warning.lineno) == (their_warning.filename, their_warning.lineno) \
            == (__file__, their_warning.lineno)


def _raised(call) -> type:
    try:
        call()
    except Exception as error:  # noqa: BLE001  (the type is what is compared)
        return type(error)
    raise AssertionError("no error")


@pytest.mark.parametrize("functions", FUNCTIONS, ids=IDS)
def test_what_torch_refuses(functions):
    """Named, bool and float dims, a dtype that is neither a dtype nor an int, no input: the same
    exception type as torch's; fused keywords stay keyword-only."""
    ours, torch_form, functional = functions
    x = torch.randn(3, 4)
    ours(x, 0), ours(x, 1)  # kept calls: a bool or float dim equal to these must not find them
    for call, theirs in [(lambda f: f(x, "C"), torch_form), (lambda f: f(x, True), torch_form),
                         (lambda f: f(x, 0.0), torch_form), (lambda f: f(x, 0, "float64"), torch_form),
                         (lambda f: f(x, 0, dtype=3.0), functional), (lambda f: f(dim=0), torch_form)]:
        assert _raised(lambda: call(ours)) is _raised(lambda: call(theirs))
    with pytest.raises(TypeError, match="named dimensions"):
        ours(x, "C")
    with pytest.raises(TypeError, match="_stacklevel"):
        ours(x, 0, torch.float32, torch.float64)  # a fourth dtype needs F's int third
    with pytest.raises(TypeError):
        ours(x, -1, None, None, 0.5)  # scale is keyword-only


def test_call_forms_with_the_fused_keywords(device):
    """torch's forms combine with ``scale``, ``mask`` and ``causal``."""
    x = torch.randn(2, 5, 5, device=device)
    mask = torch.rand(5, device=device) > 0.2
    expected = torch.softmax((x.double() * 0.5).masked_fill(~mask, float("-inf")), -1)
    _same(ps.softmax(x, -1, torch.float64, scale=0.5, mask=mask), expected)
    _same(ps.softmax(input=x, dim=np.int64(2), dtype=torch.float64, scale=0.5, mask=mask), expected)
    _same(ps.log_softmax(x, 2, 3, torch.float64, causal=True),
          torch.log_softmax(x.double().masked_fill(torch.ones(5, 5, dtype=torch.bool, device=device).triu(1),
                                                   float("-inf")), -1))
