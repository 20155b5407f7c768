"""Kinds of tensors the kernels do not read (they walk one dense strided buffer) and devices torch
lacks: one line each that names the argument and the way out, not an error from deep inside torch
("Cannot access data pointer...", "Internal error... Please file an issue", an AssertionError)."""
from __future__ import annotations

import warnings

import pytest
import torch

import portable_softmax as ps


def _quiet(make):
    # Sparse-compressed, nested and quantized constructors warn that they are beta / prototype.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make()


def _dense() -> torch.Tensor:
    return torch.randn(4, 6)


# What torch itself does with each: "refuses" (torch.softmax raises too) or "serves".
KINDS = {
    "sparse_coo": (lambda: _dense().to_sparse(), NotImplementedError, "to_dense()", "refuses"),
    "sparse_csr": (lambda: _dense().to_sparse_csr(), NotImplementedError, "to_dense()", "refuses"),
    "sparse_csc": (lambda: _dense().to_sparse_csc(), NotImplementedError, "to_dense()", "refuses"),
    "sparse_bsr": (lambda: _dense().to_sparse_bsr((2, 2)), NotImplementedError, "to_dense()", "refuses"),
    "nested": (lambda: torch.nested.nested_tensor([torch.randn(2, 6), torch.randn(3, 6)]), NotImplementedError,
               "unbind()", "serves"),
    "nested_jagged": (lambda: torch.nested.nested_tensor([torch.randn(2, 6), torch.randn(3, 6)], layout=torch.jagged),
                      NotImplementedError, "unbind()", "serves"),
    "mkldnn": (lambda: _dense().to_mkldnn(), NotImplementedError, "to_dense()", "serves"),
    "quantized": (lambda: torch.quantize_per_tensor(_dense(), 0.1, 0, torch.quint8), TypeError, "dequantize()",
                  "refuses"),
    "complex": (lambda: torch.randn(4, 6, dtype=torch.complex64), TypeError, "float16, bfloat16, float32 or float64",
                "refuses"),
}


@pytest.mark.parametrize("kind", KINDS.values(), ids=KINDS.keys())
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("call", ["plain", "requires_grad", "fused"])
def test_one_line_for_tensors_it_does_not_read(kind, log, call):
    make, error, fix, torch_does = kind
    x = _quiet(make)
    if call == "requires_grad":
        if not x.is_floating_point():
            pytest.skip("only floating tensors require grad")
        x.requires_grad_()
    name = "log_softmax" if log else "softmax"
    function = getattr(ps, name)
    with pytest.raises(error) as raised:
        function(x, -1, **(dict(scale=0.5, mask=torch.ones(6, dtype=torch.bool)) if call == "fused" else {}))
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"portable_softmax.{name}:") and fix in message
    if torch_does == "refuses":
        with pytest.raises((NotImplementedError, RuntimeError, TypeError)):
            _quiet(lambda: getattr(torch, name)(x.detach(), -1))


@pytest.mark.parametrize("argument", ["mask", "scale"])
def test_one_line_for_a_sparse_mask_or_scale(argument):
    x = torch.randn(3, 4)
    value = torch.randn(3, 4) if argument == "mask" else torch.rand(3, 1)
    with pytest.raises(NotImplementedError, match=f"a sparse {argument} .*{argument}.to_dense()"):
        ps.softmax(x, -1, **{argument: value.to_sparse()})


@pytest.mark.skipif(torch.cuda.is_available(), reason="this torch has CUDA devices")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda", 0), 0], ids=str)
def test_device_info_for_a_device_torch_lacks(device):
    """``device_info("cuda")`` on a torch without CUDA devices (a CPU-only build here)."""
    with pytest.raises(RuntimeError) as raised:
        ps.device_info(device)
    message = str(raised.value)
    assert "\n" not in message and "no 'cuda' device is available" in message
    if torch.version.cuda is None and torch.version.hip is None:
        assert "CPU-only build" in message
