"""``softmax`` and ``log_softmax`` as torch custom operators, so ``torch.compile`` traces through them.

Three operators are registered (torch 2.4 and later)::

    portable_softmax::softmax(Tensor x, int dim, ScalarType dtype) -> Tensor
    portable_softmax::log_softmax(Tensor x, int dim, ScalarType dtype) -> Tensor
    portable_softmax::softmax_backward(Tensor y, Tensor dy, int dim, bool log, ScalarType grad_dtype) -> Tensor

each with a fake (meta) implementation for tracing and an autograd formula: the forward operators'
backward is ``softmax_backward`` (the backward kernel), whose own backward is written in torch
operations, so double backward works as it does eagerly.

``portable_softmax.softmax`` calls these operators only while ``torch.compile`` traces it
(``torch.compiler.is_compiling()``; this module hands them to ``ops.use_custom_op``); eager calls
keep the direct path, which has less dispatch overhead. On a torch without ``torch.library.custom_op`` nothing is registered and compiled code
runs the eager path (with the graph breaks dynamo needs for it).

Why ``custom_op`` and not ``torch.library.triton_op`` (torch 2.6+): ``triton_op`` traces the body
of the operator and needs every kernel launched through ``torch.library.wrap_triton(kernel)[grid]``.
Our launch path does things that cannot be traced on fake tensors or expressed as a functional
kernel call: it sizes the grid from the *compiled* kernel's register and shared-memory use
(``kernel.warmup``) keyed on the arguments' 16-byte alignment (``data_ptr``), reads the device
record and environment overrides per call, and keeps the split-row path's persistent scratch
buffers (state mutated outside the operator's inputs). On CPU tensors the kernels are the
interpreter's ``InterpretedFunction`` copies, which ``wrap_triton`` passes through unwrapped. An
opaque ``custom_op`` runs the same launch path at run time; what it gives up is inductor fusing
into the kernel, which ``triton_op`` would only allow for a kernel launched the plain way.
"""
import torch
from packaging.version import Version

from portable_softmax import row_layout, op_arguments, op_calls, ops

TORCH_VERSION = Version(Version(torch.__version__.split("+")[0]).base_version)

# torch.library.custom_op / register_fake / register_autograd appeared in torch 2.4;
# torch.library.triton_op and wrap_triton in 2.6 (not used: see the module docstring).
HAS_CUSTOM_OP = TORCH_VERSION >= Version("2.4") and hasattr(torch.library, "custom_op")
HAS_TRITON_OP = TORCH_VERSION >= Version("2.6") and hasattr(torch.library, "triton_op")

NAMESPACE = "portable_softmax"

AVAILABLE = False
"""Whether the custom operators are registered (torch >= 2.4)."""


def _forward_impl(x: torch.Tensor, dim: int, dtype: torch.dtype, log: bool, name: str) -> torch.Tensor:
    # ``op_calls._forward`` validates (as ``name``) and normalizes ``dim`` where the call is new: a
    # repeated call is one lookup and one launch, as an eager one.
    return op_calls._forward(x, dim, dtype, log)


def _forward_fake(x: torch.Tensor, dim: int, dtype: torch.dtype, name: str) -> torch.Tensor:
    _, out_dtype = op_arguments._validate(x, dim, dtype, name)
    return row_layout._output(x, out_dtype)


def _backward_impl(y: torch.Tensor, dy: torch.Tensor, dim: int, log: bool, grad_dtype: torch.dtype) -> torch.Tensor:
    if dy.shape != y.shape:
        # Checked on every call: the call's key holds y's shape, not dy's.
        _check_backward(y, dy, dim, grad_dtype)
    return op_calls._backward(y, dy, dim, grad_dtype, log, _check_backward)


def _backward_fake(y: torch.Tensor, dy: torch.Tensor, dim: int, log: bool, grad_dtype: torch.dtype) -> torch.Tensor:
    _check_backward(y, dy, dim, grad_dtype)
    return row_layout._output(y, grad_dtype)


def _check_backward(y: torch.Tensor, dy: torch.Tensor, dim: int, grad_dtype: torch.dtype) -> int:
    dim, _ = op_arguments._validate(y, dim, grad_dtype, "softmax_backward")
    if dy.shape != y.shape:
        raise ValueError(f"portable_softmax.softmax_backward: dy has shape {tuple(dy.shape)}, "
                         f"y has shape {tuple(y.shape)}")
    op_arguments._check_dtype("dy's dtype", dy.dtype, "softmax_backward")
    return dim


def _setup_forward(ctx, inputs, output) -> None:
    x, dim, _ = inputs
    ctx.save_for_backward(output)
    ctx.dim = dim % max(x.dim(), 1)
    ctx.grad_dtype = x.dtype


def _forward_backward(log: bool):
    def backward(ctx, grad: torch.Tensor):
        (y,) = ctx.saved_tensors
        return softmax_backward(y, grad, ctx.dim, log, ctx.grad_dtype), None, None

    return backward


def _setup_backward(ctx, inputs, output) -> None:
    y, dy, dim, log, _ = inputs
    ctx.save_for_backward(y, dy)
    ctx.dim = dim % max(y.dim(), 1)
    ctx.log = log


def _backward_backward(ctx, grad: torch.Tensor):
    """Gradients of ``softmax_backward`` with respect to y and dy, in torch operations (differentiable again).

    softmax:     dx = y * (dy - sum(dy * y))   log_softmax: dx = dy - exp(y) * sum(dy)
    """
    y, dy = ctx.saved_tensors
    dim = ctx.dim
    compute = torch.promote_types(torch.promote_types(y.dtype, dy.dtype), grad.dtype)
    yc, dyc, g = y.to(compute), dy.to(compute), grad.to(compute)
    if ctx.log:
        p = torch.exp(yc)
        grad_y = -g * p * dyc.sum(dim, keepdim=True)
        grad_dy = g - (g * p).sum(dim, keepdim=True)
    else:
        gy = (g * yc).sum(dim, keepdim=True)
        grad_y = g * (dyc - (dyc * yc).sum(dim, keepdim=True)) - gy * dyc
        grad_dy = yc * (g - gy)
    return grad_y.to(y.dtype), grad_dy.to(dy.dtype), None, None, None


if HAS_CUSTOM_OP:
    _softmax_def = torch.library.custom_op(
        f"{NAMESPACE}::softmax", lambda x, dim, dtype: _forward_impl(x, dim, dtype, False, "softmax"),
        mutates_args=(), schema="(Tensor x, int dim, ScalarType dtype) -> Tensor")
    _log_softmax_def = torch.library.custom_op(
        f"{NAMESPACE}::log_softmax", lambda x, dim, dtype: _forward_impl(x, dim, dtype, True, "log_softmax"),
        mutates_args=(), schema="(Tensor x, int dim, ScalarType dtype) -> Tensor")
    _softmax_backward_def = torch.library.custom_op(
        f"{NAMESPACE}::softmax_backward", _backward_impl, mutates_args=(),
        schema="(Tensor y, Tensor dy, int dim, bool log, ScalarType grad_dtype) -> Tensor")

    torch.library.register_fake(_softmax_def, lambda x, dim, dtype: _forward_fake(x, dim, dtype, "softmax"))
    torch.library.register_fake(_log_softmax_def, lambda x, dim, dtype: _forward_fake(x, dim, dtype, "log_softmax"))
    torch.library.register_fake(_softmax_backward_def, _backward_fake)

    torch.library.register_autograd(_softmax_def, _forward_backward(False), setup_context=_setup_forward)
    torch.library.register_autograd(_log_softmax_def, _forward_backward(True), setup_context=_setup_forward)
    torch.library.register_autograd(_softmax_backward_def, _backward_backward, setup_context=_setup_backward)

    _namespace = getattr(torch.ops, NAMESPACE)
    softmax_op = _namespace.softmax.default
    log_softmax_op = _namespace.log_softmax.default
    softmax_backward_op = _namespace.softmax_backward.default
    AVAILABLE = True
else:
    softmax_op = log_softmax_op = softmax_backward_op = None


def softmax_backward(y: torch.Tensor, dy: torch.Tensor, dim: int, log: bool, grad_dtype: torch.dtype) -> torch.Tensor:
    """The gradient of softmax (``log=False``) or log_softmax with respect to its input, from its output y."""
    return softmax_backward_op(y, dy, dim, log, grad_dtype)


def call(x: torch.Tensor, dim: int, out_dtype: torch.dtype, log: bool) -> torch.Tensor:
    """The custom operator for an already validated call (``dim`` normalized, ``out_dtype`` resolved)."""
    return (log_softmax_op if log else softmax_op)(x, dim, out_dtype)


if AVAILABLE:
    ops.use_custom_op(call)

__all__ = ["AVAILABLE", "HAS_CUSTOM_OP", "HAS_TRITON_OP", "call", "softmax_backward"]
