"""``enable()``: torch's own softmax and log_softmax, wherever a model calls them, served by the
package's kernels.

    >>> import portable_softmax as ps
    >>> with ps.enabled() as served:        # the accelerators present; the CPU only where named
    ...     model(batch).sum().backward()
    >>> served.calls                          # forward and backward calls the kernels served

How: through ``torch.library``, the package's kernels become torch's implementation of the four
aten operators every front end ends in, for the dispatch key of each served device type (``CUDA``,
also on ROCm; ``PrivateUse1``, Ascend's NPU; ``CPU``)::

    aten::_softmax, aten::_log_softmax                                  (forward)
    aten::_softmax_backward_data, aten::_log_softmax_backward_data      (their backward)

``torch.softmax``, ``F.softmax``, ``Tensor.softmax``, ``nn.Softmax``, their log forms,
``F.cross_entropy`` (log_softmax, then nll_loss), ``nn.MultiheadAttention``'s weights and the
math path of ``scaled_dot_product_attention`` (``_safe_softmax``) all call these. The kernels sit
below autograd, at the backend's key, as FlagGems registers its ops; torch's autograd stays in
charge (derivatives.yaml: the backward of ``_softmax`` calls ``_softmax_backward_data``), so the
backward reaches the package too, double backward and ``torch.func`` keep torch's formulas.

Where torch's kernel is faster it keeps the call: each call's shape, dtype, device and dim are
looked up in a table of decisions, and calls holding fewer bytes than their device's
``Tuning.enable_min_bytes`` (the host cost of a call outweighs the kernel's gain), calls the
package cannot serve (a dtype the device lacks; ``half_to_float`` on a non-half input, an
out-of-range dim: torch raises its own error), and calls made while one is being served (a
fallback inside the package that calls torch.softmax) go to the kernel registered before ours:
``torch.library.get_kernel`` (torch 2.9+), else the operator's ``.out`` overload, which is
torch's kernel under a name the registration leaves alone.

Not reached: code that Inductor (torch.compile's default backend) compiles has its own softmax;
the ``eager`` and ``aot_eager`` backends call the operators and are served.

The registration is process-wide, as torch's dispatcher is: a block opened in one thread serves
the calls of every thread while it is open.
"""
from __future__ import annotations

import contextlib
import importlib.util
import logging
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple, Optional, Union

import torch

from portable_softmax import op_arguments, op_calls
from portable_softmax.backend import on_registry_change, registered_backends
from portable_softmax.device import device_record
from portable_softmax.tuning import TUNING, tuning_for

logger = logging.getLogger(__name__)

DeviceSpec = Union[str, torch.device]
Kernel = Callable[..., Any]

# torch.library.get_kernel (torch 2.9+): the kernel registered for a key before ours, called boxed.
_get_kernel: Optional[Callable[..., Any]] = getattr(torch.library, "get_kernel", None)


class Served:
    """The calls one :func:`enable` or :func:`enabled` block served.

    Attributes:
        devices: the device types it serves (``"cuda"``, ``"npu"``, ``"cpu"``).
        by_op: calls served, by aten operator (``_softmax``, ``_softmax_backward_data``, ...).
    """

    def __init__(self, devices: tuple[str, ...]) -> None:
        self.devices = devices
        self.by_op: Counter[str] = Counter()

    @property
    def calls(self) -> int:
        """Calls served: forward and backward, every operator."""
        return sum(self.by_op.values())

    def __repr__(self) -> str:
        return f"Served(devices={self.devices}, calls={self.calls}, by_op={dict(self.by_op)})"


# ----------------------------------------------------------------------------------------------
# State: the claims (the enable() one and the open blocks), the library that holds the
# registrations, and what a served call counts towards.
# ----------------------------------------------------------------------------------------------

_lock = threading.RLock()
_count_lock = threading.Lock()
_enabled: Optional[Served] = None
_blocks: list[Served] = []
_library: Optional[torch.library.Library] = None
_library_keys: tuple[str, ...] = ()
# By device type: the claims a served call on that type counts towards.
_counters: dict[str, tuple[Served, ...]] = {}


class _Serving(threading.local):
    """Whether this thread is inside a served call: a call that reaches the registration from
    there goes to torch's kernel instead of back into the package."""

    active = False


_serving = _Serving()


class _Serve(NamedTuple):
    """A call the package serves: the dim normalized, the result's dtype, the device type."""

    dim: int
    dtype: torch.dtype
    device_type: str


# Decisions by call key (operator, shapes, dtypes, device, dim, flag): a _Serve, or None for
# torch's kernel. Emptied when what they were decided from changes (claims, tuning, backends).
_decisions: dict[tuple, Optional[_Serve]] = {}
_DECISIONS_LIMIT = 4096
_UNDECIDED = object()


def _forget_decisions() -> None:
    _decisions.clear()


TUNING.on_change(_forget_decisions)
on_registry_change(_forget_decisions)


def _decided(key: tuple, decide: Callable[[], Optional[_Serve]]) -> Optional[_Serve]:
    """Decide a call key's first call and keep the decision (bounded, as ``op_calls``' call records)."""
    found = decide()
    with _lock:
        if len(_decisions) >= _DECISIONS_LIMIT:
            _decisions.clear()
        _decisions[key] = found
    return found


def _served(t: torch.Tensor, dim: int, dtype: torch.dtype, others: tuple[torch.Tensor, ...], name: str
            ) -> Optional[_Serve]:
    """Whether the package serves a call on ``t`` (and ``others``, the backward's second tensor)
    whose result has ``dtype``: on a claimed device type, a valid dim and dtypes the device
    has (``op_arguments._validate``, the public functions' checks), and at least the device's
    ``enable_min_bytes``."""
    device_type = t.device.type
    if device_type not in _counters or t.numel() == 0:
        return None
    try:
        for tensor in (t, *others):
            dim_n, _ = op_arguments._validate(tensor, dim, dtype, name)
        record = device_record(t.device)
    except (TypeError, IndexError, ValueError, RuntimeError) as error:
        logger.debug("enable: torch's kernel keeps %s on %s (%s)", name, t.device, error)
        return None
    if t.numel() * t.element_size() < tuning_for(record).enable_min_bytes:
        return None
    return _Serve(dim_n, dtype, device_type)


def _count(device_type: str, name: str) -> None:
    claims = _counters.get(device_type, ())
    with _count_lock:
        for claim in claims:
            claim.by_op[name] += 1


# ----------------------------------------------------------------------------------------------
# The registered kernels.
# ----------------------------------------------------------------------------------------------

def _forward_kernel(name: str, log: bool, previous: Kernel) -> Kernel:
    """``aten::_softmax`` (``log``: ``_log_softmax``) for one dispatch key: the package's
    forward where it serves the call, else ``previous``."""

    def kernel(keyset: Any, x: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
        key = (name, x.shape, x.dtype, x.device, dim, half_to_float)
        found = _decisions.get(key, _UNDECIDED)
        if found is _UNDECIDED:
            found = _decided(key, lambda: _forward_decision(x, dim, half_to_float, name))
        if found is None or _serving.active:
            return previous(keyset, x, dim, half_to_float)
        _serving.active = True
        try:
            y = op_calls._forward(x, found.dim, found.dtype, log)
        finally:
            _serving.active = False
        _count(found.device_type, name)
        return y

    return kernel


def _forward_decision(x: torch.Tensor, dim: int, half_to_float: bool, name: str) -> Optional[_Serve]:
    # half_to_float: a float16 input, a float32 result (torch.softmax(x, dtype=torch.float32) of
    # a CUDA half tensor); on another dtype torch raises, and keeps the call to say so.
    if half_to_float and x.dtype != torch.float16:
        return None
    return _served(x, dim, torch.float32 if half_to_float else x.dtype, (), name)


def _backward_kernel(name: str, log: bool, previous: Kernel) -> Kernel:
    """``aten::_softmax_backward_data`` (``log``: ``_log_softmax_backward_data``) for one
    dispatch key: the gradient of the input, of dtype ``input_dtype``, from the output and its
    gradient."""

    def kernel(keyset: Any, grad_output: torch.Tensor, output: torch.Tensor, dim: int,
               input_dtype: torch.dtype) -> torch.Tensor:
        key = (name, output.shape, grad_output.shape, output.dtype, grad_output.dtype, output.device, dim,
               input_dtype)
        found = _decisions.get(key, _UNDECIDED)
        if found is _UNDECIDED:
            found = _decided(key, lambda: _backward_decision(grad_output, output, dim, input_dtype, name))
        if found is None or _serving.active:
            return previous(keyset, grad_output, output, dim, input_dtype)
        _serving.active = True
        try:
            dx = op_calls._backward(output, grad_output, found.dim, found.dtype, log)
        finally:
            _serving.active = False
        _count(found.device_type, name)
        return dx

    return kernel


def _backward_decision(grad_output: torch.Tensor, output: torch.Tensor, dim: int, input_dtype: torch.dtype,
                       name: str) -> Optional[_Serve]:
    if grad_output.shape != output.shape or grad_output.device != output.device:
        return None
    return _served(output, dim, input_dtype, (grad_output,), name)


def _through_out(op: torch._ops.OpOverload, result_dtype: Callable[..., torch.dtype]) -> Kernel:
    """torch's kernel for ``op`` on a torch without ``get_kernel``: its ``.out`` overload, whose
    kernel the registration leaves in place, into an output allocated as torch's: contiguous, of
    ``result_dtype(*args)`` and of the first argument's shape (the input forward, the output's
    gradient backward)."""
    out = op.overloadpacket.out
    out_name = out._schema.arguments[-1].name  # ``out`` or ``grad_input``

    def call(keyset: Any, *args: Any) -> torch.Tensor:
        first = args[0]
        result = torch.empty(first.shape, dtype=result_dtype(*args), device=first.device)
        return out(*args, **{out_name: result})

    return call


def _previous(op: torch._ops.OpOverload, dispatch_key: str, result_dtype: Callable[..., torch.dtype]) -> Kernel:
    """The kernel that serves ``op`` at ``dispatch_key`` now (torch's, or another library's):
    taken before ours is registered."""
    if _get_kernel is not None:
        return _get_kernel(op, dispatch_key).call_boxed
    return _through_out(op, result_dtype)


def _forward_dtype(x: torch.Tensor, dim: int, half_to_float: bool) -> torch.dtype:
    return torch.float32 if half_to_float else x.dtype


def _backward_dtype(grad_output: torch.Tensor, output: torch.Tensor, dim: int, input_dtype: torch.dtype) -> torch.dtype:
    return input_dtype


# (operator, log, direction) for the four operators served at a device's own key.
_OPERATORS = (("_softmax", False, "forward"), ("_log_softmax", True, "forward"),
              ("_softmax_backward_data", False, "backward"), ("_log_softmax_backward_data", True, "backward"))


def _softmax_registrations(dispatch_key: str) -> list[tuple[str, Kernel, str]]:
    """(operator, kernel, dispatch key) for the four operators."""
    found = []
    for name, log, direction in _OPERATORS:
        op = getattr(torch.ops.aten, name).default
        if direction == "forward":
            kernel = _forward_kernel(name, log, _previous(op, dispatch_key, _forward_dtype))
        else:
            kernel = _backward_kernel(name, log, _previous(op, dispatch_key, _backward_dtype))
        found.append((name, kernel, dispatch_key))
    return found


# ----------------------------------------------------------------------------------------------
# F.cross_entropy: the one registration point for the package's fused loss.
#
# Until ``portable_softmax.loss`` exists, F.cross_entropy is served through its log_softmax
# (aten::cross_entropy_loss is log_softmax, then nll_loss). Once it exists, the whole loss goes to
# ``loss.cross_entropy(input, target, weight=, reduction=, ignore_index=, label_smoothing=)`` (the
# keywords of F.cross_entropy; class indices and probabilities alike). cross_entropy_loss is
# CompositeImplicitAutograd: a kernel at its backend key alone would leave it without a gradient,
# so it is registered at the device's Autograd key, and the loss brings its own autograd. That key
# comes before the Python key, so tensor subclasses (the fake and functional tensors of
# torch.compile's tracing, DTensors) reach the kernel too: they, and small calls, keep torch's
# composite, whose log_softmax is served where it runs on real tensors. On a torch without
# get_kernel the loss is not registered.
# ----------------------------------------------------------------------------------------------

_REDUCTIONS = ("none", "mean", "sum")  # at::Reduction::Reduction: None, Mean, Sum
_PYTHON_KEY = torch._C.DispatchKey.Python


def _loss_registrations(dispatch_key: str) -> list[tuple[str, Kernel, str]]:
    if _get_kernel is None or importlib.util.find_spec("portable_softmax.loss") is None:
        return []
    from portable_softmax import loss

    autograd_key = f"Autograd{dispatch_key}"
    previous = _get_kernel("aten::cross_entropy_loss", autograd_key).call_boxed

    # The schema's defaults: torch leaves trailing arguments that equal them out of the call.
    def kernel(keyset: Any, input: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor] = None,
               reduction: int = 1, ignore_index: int = -100, label_smoothing: float = 0.0) -> torch.Tensor:
        key = ("cross_entropy_loss", type(input), input.shape, input.dtype, input.device)
        found = _decisions.get(key, _UNDECIDED)
        if found is _UNDECIDED:
            found = _decided(key, lambda: None if torch._C._dispatch_keys(input).has(_PYTHON_KEY) else
                             _served(input, 1 if input.dim() > 1 else 0, input.dtype, (), "cross_entropy"))
        if found is None or _serving.active:
            return previous(keyset, input, target, weight, reduction, ignore_index, label_smoothing)
        _serving.active = True
        try:
            result = loss.cross_entropy(input, target, weight=weight, reduction=_REDUCTIONS[reduction],
                                        ignore_index=ignore_index, label_smoothing=label_smoothing)
        finally:
            _serving.active = False
        _count(found.device_type, "cross_entropy_loss")
        return result

    return [("cross_entropy_loss", kernel, autograd_key)]


# ----------------------------------------------------------------------------------------------
# Registering.
# ----------------------------------------------------------------------------------------------

# torch warns once per process when a kernel replaces another: here that is the point. (The
# message starts with another line: "(?s)" lets ".*" cross it.)
_OVERRIDE_WARNING = r"(?s).*Overriding a previously registered kernel"


def _dispatch_key(device_type: str) -> Optional[str]:
    """The dispatch key of ``device_type``'s tensors, or None where this torch has none (an NPU
    without torch_npu, which names PrivateUse1 ``npu``)."""
    if device_type == torch._C._get_privateuse1_backend_name():
        return "PrivateUse1"
    try:
        return torch._C._dispatch_key_for_device(device_type)
    except RuntimeError:
        return None


def _register(dispatch_keys: tuple[str, ...]) -> Optional[torch.library.Library]:
    """A library holding the kernels for ``dispatch_keys``, each taking the kernel that serves
    its key now as its fallback: called with no registration of ours in place, or the fallback
    would be our own kernel."""
    if not dispatch_keys:
        return None
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_OVERRIDE_WARNING, category=UserWarning)
        for dispatch_key in dispatch_keys:
            for name, kernel, key in [*_softmax_registrations(dispatch_key), *_loss_registrations(dispatch_key)]:
                library.impl(name, kernel, key, with_keyset=True)
    return library


def _apply() -> None:
    """Make the registrations and counters match the claims (called under ``_lock``)."""
    global _library, _library_keys, _counters
    claims = ([_enabled] if _enabled is not None else []) + _blocks
    types = sorted({device_type for claim in claims for device_type in claim.devices})
    keys = []
    for device_type in types:
        key = _dispatch_key(device_type)
        if key is None:
            logger.info("enable: this torch has no %r tensors; nothing registered for them", device_type)
        elif key not in keys:
            keys.append(key)
    _counters = {t: tuple(claim for claim in claims if t in claim.devices) for t in types}
    _forget_decisions()
    if tuple(keys) == _library_keys:
        return
    if _library is not None:
        _library._destroy()
    _library, _library_keys = None, ()
    _library, _library_keys = _register(tuple(keys)), tuple(keys)


def _device_types(devices: Union[DeviceSpec, Iterable[DeviceSpec], None], name: str) -> tuple[str, ...]:
    """The device types ``devices`` names (None: the accelerators present that a backend
    serves), checked against the backends."""
    backends = registered_backends().values()
    served = {backend.torch_device_type for backend in backends}
    if devices is None:
        return tuple(sorted({backend.torch_device_type for backend in backends if not backend.interpreted
                             and _available(backend.torch_device_type)}))
    if isinstance(devices, (str, torch.device)):
        devices = [devices]
    types = set()
    for device in devices:
        if not isinstance(device, (str, torch.device)):
            raise TypeError(f"portable_softmax.{name}: devices must hold device types such as 'cuda' or 'cpu', "
                            f"got {type(device).__name__}")
        device_type = device.type if isinstance(device, torch.device) else device.split(":")[0].strip().lower()
        device_type = "cuda" if device_type == "hip" else device_type  # ROCm tensors are "cuda" ones
        if device_type not in served:
            raise ValueError(f"portable_softmax.{name}: no backend serves {device_type!r} tensors; "
                             f"devices may name {', '.join(sorted(served))}")
        types.add(device_type)
    return tuple(sorted(types))


def _available(device_type: str) -> bool:
    module = getattr(torch, device_type, None)
    return bool(module is not None and hasattr(module, "is_available") and module.is_available())


# ----------------------------------------------------------------------------------------------
# The public switch.
# ----------------------------------------------------------------------------------------------

def enable(devices: Union[DeviceSpec, Iterable[DeviceSpec], None] = None) -> Served:
    """Serve torch's softmax and log_softmax (forward and backward) on ``devices`` with the
    package's kernels until :func:`disable`; torch's kernel keeps the calls smaller than the
    chip's ``enable_min_bytes``, where it is faster.

    Args:
        devices: device types (``"cuda"``, ``"npu"``, ``"cpu"``; an index is ignored, as the
            registration is per type), or None for the accelerators present. The CPU is served
            only where named: there the kernels run through Triton's interpreter, which is slow.
            A second call adds its devices; calling it again with the same ones changes nothing.

    Returns:
        The record of what it serves (``.calls``), the same one until :func:`disable`.

    Raises:
        ValueError: ``devices`` names a device type no backend serves.
        TypeError: ``devices`` holds something other than device types.
    """
    global _enabled
    types = _device_types(devices, "enable")
    with _lock:
        if _enabled is None:
            _enabled = Served(types)
        else:
            _enabled.devices = tuple(sorted(set(_enabled.devices) | set(types)))
        _apply()
        return _enabled


def disable() -> None:
    """End :func:`enable` and every open :func:`enabled` block: torch's kernels serve every call
    again (the registrations are removed, not bypassed)."""
    global _enabled
    with _lock:
        _enabled = None
        _blocks.clear()
        _apply()


@contextlib.contextmanager
def enabled(devices: Union[DeviceSpec, Iterable[DeviceSpec], None] = None) -> Iterator[Served]:
    """:func:`enable` for the duration of a ``with`` block, which yields the record of the calls
    it served (``served.calls``). Blocks nest: each counts the calls on its devices while it is
    open, and on leaving it the devices served are those of what is still open.

    Args, Raises: as :func:`enable`.
    """
    served = Served(_device_types(devices, "enabled"))
    with _lock:
        _blocks.append(served)
        _apply()
    try:
        yield served
    finally:
        with _lock:
            if any(block is served for block in _blocks):  # not ended by disable()
                _blocks.remove(served)
                _apply()


__all__ = ["Served", "disable", "enable", "enabled"]
