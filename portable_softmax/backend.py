"""The backend interface and registry.

A backend is data plus a few small functions: how to turn its driver's raw property dictionary
into a :class:`DeviceRecord`, how many programs of a compiled kernel fit on one unit, whether a
grid sized that way is resident all at once, and which compile options (if any) make a given
number of programs fit. The kernel source never changes per backend.

Built-in backends are registered by ``vendors.py``; others arrive as plugins through the
``portable_softmax.backends`` entry-point group, each entry naming a :class:`Backend` instance or
a callable returning one::

    [project.entry-points."portable_softmax.backends"]
    myaccel = "myaccel_softmax:backend"
"""
from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from portable_softmax.record import DeviceRecord, KernelResources

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "portable_softmax.backends"
BACKEND_ENV = "PORTABLE_SOFTMAX_BACKEND"


def no_fit_options(record: DeviceRecord, num_warps: int, programs: int) -> dict[str, Any]:
    """For compilers with no option to trade registers for occupancy."""
    return {}


@dataclass(frozen=True)
class Backend:
    """One way of running the kernels.

    Attributes:
        name: registry key, also ``DeviceRecord.backend``.
        triton_target: what ``triton.runtime.driver.active.get_current_target().backend`` says when
            this backend's driver is active (``cuda``, ``hip``, ``npu``); empty for the interpreter.
        torch_device_type: the ``torch.device.type`` of tensors it serves (ROCm tensors are ``cuda``).
        normalize: ``(raw_properties, target_arch, device_name) -> DeviceRecord``.
        occupancy: ``(record, resources) -> programs per unit`` for a compiled kernel.
        fit_options: ``(record, num_warps, programs) -> compile options`` that let ``programs``
            programs of ``num_warps`` warps share one unit (a register cap); ``{}`` where the
            compiler offers no such option.
        interpreted: kernels run through Triton's interpreter instead of being compiled.
        cooperative_launch: launches that rely on residency may ask the driver to enforce it.
        tuning: the backend's own tuning rows (``record.Tuning``) by architecture ("*": its
            default); rows set in ``tuning.TUNING`` win over them.
    """

    name: str
    triton_target: str
    torch_device_type: str
    normalize: Callable[[Mapping[str, Any], Any, str], DeviceRecord]
    occupancy: Callable[[DeviceRecord, KernelResources], int]
    fit_options: Callable[[DeviceRecord, int, int], dict[str, Any]] = no_fit_options
    interpreted: bool = False
    cooperative_launch: bool = False
    tuning: Mapping[str, Any] = dataclasses.field(default_factory=dict)


_REGISTRY: dict[str, Backend] = {}
_plugins_loaded = False
# Bumped on every change to the registry: caches of "which backend serves this device" key on it.
_generation = 0


_observers: list[Callable[[], None]] = []


def on_registry_change(observer: Callable[[], None]) -> None:
    """Call ``observer`` whenever a backend is registered or removed (what was planned for a
    device may then be served by another backend)."""
    _observers.append(observer)


def _changed() -> None:
    global _generation
    _generation += 1
    for observer in _observers:
        observer()


def register_backend(backend: Backend, *, replace: bool = False) -> Backend:
    """Add ``backend`` to the registry (``replace=True`` to override one of the same name)."""
    if not isinstance(backend, Backend):
        raise TypeError(f"register_backend expects a portable_softmax.Backend, got {type(backend).__name__}")
    if backend.name in _REGISTRY and not replace:
        raise ValueError(f"a backend named {backend.name!r} is already registered; pass replace=True to override it")
    _REGISTRY[backend.name] = backend
    _changed()
    return backend


def unregister_backend(name: str) -> None:
    _REGISTRY.pop(name, None)
    _changed()


def registry_generation() -> int:
    """A number that changes whenever a backend is registered or removed (plugins loaded first)."""
    _load_plugins()
    return _generation


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = entry.load()
            backend = loaded() if callable(loaded) and not isinstance(loaded, Backend) else loaded
            register_backend(backend, replace=True)
        except Exception:
            logger.exception("could not load portable_softmax backend plugin %r", entry.name)


def registered_backends() -> dict[str, Backend]:
    """Every backend known now: built-ins and installed plugins."""
    _load_plugins()
    return dict(_REGISTRY)


def get_backend(name: str) -> Backend:
    backends = registered_backends()
    if name not in backends:
        raise ValueError(f"unknown portable_softmax backend {name!r}; known backends: {', '.join(sorted(backends))}")
    return backends[name]


def forced_backend() -> Backend | None:
    """The backend named by ``PORTABLE_SOFTMAX_BACKEND``, if set."""
    name = os.environ.get(BACKEND_ENV, "").strip()
    if not name:
        return None
    try:
        return get_backend(name)
    except ValueError as error:
        raise ValueError(f"{BACKEND_ENV}={name!r}: {error}") from None
