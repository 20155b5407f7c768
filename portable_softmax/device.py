"""Which backend serves a tensor, and the normalized record of its device.

The raw driver dictionaries are read here and nowhere else; records are cached per device.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, Optional, Union

import torch

from portable_softmax import compat
from portable_softmax.backend import BACKEND_ENV, Backend, forced_backend, registered_backends, registry_generation
from portable_softmax.record import DeviceRecord

logger = logging.getLogger(__name__)

DeviceLike = Union[torch.device, str, int, None]


def _active_driver() -> Any:
    import triton

    # Only compiling backends come here. Triton's compiler key is computed beside the C module that
    # the driver's first use builds (its utils), not after it at the first compile.
    compat.compiler_key_ahead()
    try:
        return triton.runtime.driver.active
    except RuntimeError as error:  # "0 active drivers" on a machine without a GPU
        raise RuntimeError(f"no Triton GPU driver is active on this machine ({error})") from None


def _triton_target_name() -> str:
    return _active_driver().get_current_target().backend


def _default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    npu = getattr(torch, "npu", None)
    if npu is not None and npu.is_available():
        return torch.device("npu", npu.current_device())
    return torch.device("cpu")


def as_device(device: DeviceLike) -> torch.device:
    if isinstance(device, torch.device) and (device.index is not None or device.type == "cpu"):
        return device
    if device is None:
        return _default_device()
    if isinstance(device, int):
        return torch.device("cuda", device)
    device = torch.device(device)
    if device.type != "cpu" and device.index is None:
        _check_present(device)
        module = getattr(torch, device.type, None)
        index = module.current_device() if module is not None and hasattr(module, "current_device") else 0
        device = torch.device(device.type, index)
    return device


def _check_present(device: torch.device) -> None:
    """One line where torch has no device of ``device``'s type (a CPU-only torch asked for
    "cuda"), rather than the AssertionError of torch's lazy initialization, frames deeper."""
    module = getattr(torch, device.type, None)
    available = getattr(module, "is_available", None)
    if device.type in ("cpu", "meta") or available is None or available():
        return
    build = ""
    if device.type == "cuda" and torch.version.cuda is None and torch.version.hip is None:
        build = " is a CPU-only build: install a CUDA or ROCm build of torch to use it"
    raise RuntimeError(f"portable_softmax: no {device.type!r} device is available (torch.{device.type}.is_available() "
                       f"is False; torch {torch.__version__}{build})")


def backend_for(device: DeviceLike) -> Backend:
    """The backend that runs kernels on ``device``'s tensors (``PORTABLE_SOFTMAX_BACKEND`` wins)."""
    device = as_device(device)
    forced = forced_backend()
    if forced is not None:
        if forced.torch_device_type != device.type:
            raise RuntimeError(f"PORTABLE_SOFTMAX_BACKEND={forced.name!r} serves {forced.torch_device_type!r} tensors, "
                               f"not {device.type!r} ones")
        return forced
    backends = registered_backends()
    candidates = [b for b in backends.values() if b.torch_device_type == device.type]
    if not candidates:
        served = sorted({b.torch_device_type for b in backends.values()})
        raise RuntimeError(f"no portable_softmax backend serves {device.type!r} tensors; served device types: "
                           f"{', '.join(served)} (backends: {', '.join(sorted(backends))})")
    if len(candidates) == 1 and (candidates[0].interpreted or not candidates[0].triton_target):
        return candidates[0]
    target = _triton_target_name()
    for backend in candidates:
        if backend.triton_target == target:
            return backend
    raise RuntimeError(f"Triton's active driver is {target!r}, but no backend for {device.type!r} tensors uses it "
                       f"(candidates: {', '.join(b.name for b in candidates)})")


# hip_runtime_api.h: hipDeviceAttributeCooperativeLaunch, the eleventh of hipDeviceAttribute_t.
HIP_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH = 10


def _hip_cooperative_launch(index: int) -> int:
    """hipDeviceGetAttribute(hipDeviceAttributeCooperativeLaunch) of device ``index``, through the
    HIP runtime Triton found (torch's, already loaded on ROCm); 0 where it cannot be asked, so that
    a launch the driver might refuse is never planned."""
    try:
        from triton.backends.amd.driver import _get_path_to_hip_runtime_dylib

        runtime = ctypes.CDLL(_get_path_to_hip_runtime_dylib())
        value = ctypes.c_int(0)
        status = runtime.hipDeviceGetAttribute(ctypes.byref(value), HIP_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, index)
    except (ImportError, RuntimeError, OSError, AttributeError) as error:
        logger.debug("could not ask the HIP runtime about cooperative launch (%s): taken as unsupported", error)
        return 0
    return value.value if status == 0 else 0


def _cuda_l2_bytes(index: int) -> Optional[int]:
    """The L2 size of CUDA device ``index`` as torch reports it (Triton's driver does not); None
    where torch cannot say (no CUDA build or device: torch raises AssertionError or RuntimeError),
    so that no plan counts on it."""
    try:
        properties = torch.cuda.get_device_properties(index)
    except (AssertionError, RuntimeError) as error:
        logger.debug("could not ask torch for CUDA device %d's L2 size (%s)", index, error)
        return None
    return getattr(properties, "L2_cache_size", None) or None


# Properties a backend's record needs that some Triton versions' drivers leave out, and how to
# ask for them: Triton 3.9's HIP driver reports cooperativeLaunch, older ones need not; no
# Triton driver reports the L2 size. ``profiles`` completes a recorded chip's from its facts.
COMPLETED_PROPERTIES = ("cooperativeLaunch", "l2_cache_bytes")
_MISSING_PROPERTIES: dict[str, dict[str, Callable[[int], Any]]] = {
    "hip": {"cooperativeLaunch": _hip_cooperative_launch},
    "cuda": {"l2_cache_bytes": _cuda_l2_bytes},
}


def _completed(backend_name: str, raw: Mapping[str, Any], index: int) -> dict[str, Any]:
    """``raw`` with the properties its driver did not report asked for elsewhere."""
    found = dict(raw)
    for key, ask in _MISSING_PROPERTIES.get(backend_name, {}).items():
        if key not in found:
            found[key] = ask(index)
    return found


def _usable(record: DeviceRecord, backend: Backend) -> DeviceRecord:
    """``record`` as this process can use it: a cooperative launch needs the device, a launcher
    that asks for it (``Backend.cooperative_launch``) and Triton 3.3+, which passes it on; a
    dependent launch the device and a Triton that passes it on (``compat.DEPENDENT_LAUNCH``)."""
    cooperative = record.cooperative_launch and backend.cooperative_launch and compat.COOPERATIVE_LAUNCH
    dependent = record.dependent_launch and compat.DEPENDENT_LAUNCH and not backend.interpreted
    return dataclasses.replace(record, cooperative_launch=cooperative, dependent_launch=dependent)


@functools.lru_cache(maxsize=None)
def _record(backend_name: str, device_type: str, index: Optional[int]) -> DeviceRecord:
    backend = registered_backends()[backend_name]
    if backend.interpreted:
        return _usable(backend.normalize({}, "cpu", ""), backend)
    module = getattr(torch, device_type)
    with module.device(index):
        driver = _active_driver()
        device = driver.get_current_device()
        raw = _completed(backend_name, driver.utils.get_device_properties(device), device)
        target = driver.get_current_target()
        name = module.get_device_name(index)
    return _usable(backend.normalize(raw, target.arch, name), backend)


# Records by (device, forced backend, registry generation): every softmax call asks, so the answer
# must not cost a driver query.
_resolved: dict[tuple, DeviceRecord] = {}


def _record_or_error(device: torch.device) -> Union[DeviceRecord, Exception]:
    """``device``'s record, or the error finding it, returned rather than raised (see below)."""
    key = (device.type, device.index, os.environ.get(BACKEND_ENV), registry_generation())
    found = _resolved.get(key)
    if found is not None:
        return found
    try:
        _check_present(device)
        found = _resolved[key] = _record(backend_for(device).name, device.type, device.index)
        return found
    except Exception as error:  # noqa: BLE001  (raised again by device_record)
        return error


# For torch.compile the record is a constant of the traced program: dynamo calls this function at
# trace time and keeps its result instead of tracing into a backend's ``normalize`` (driver and os
# calls it cannot trace, which would break the graph). This is what
# ``torch.compiler.assume_constant_result`` does, without importing torch._dynamo (a second) here.
# An error raised inside such a function would reach the user as dynamo's internal error, so it is
# returned and raised by the caller, where dynamo falls back to eager and the user sees it as is.
_record_or_error._dynamo_marked_constant = True  # type: ignore[attr-defined]


def device_record(device: DeviceLike = None) -> DeviceRecord:
    """The normalized record of ``device`` (default: the current accelerator, else the CPU)."""
    found = _record_or_error(as_device(device))
    if isinstance(found, Exception):
        raise found
    return found


def device_info(device: DeviceLike = None) -> dict[str, Any]:
    """The normalized device record as a dictionary.

    Args:
        device: a torch device, string or CUDA index; default the current accelerator, else the CPU.

    Raises:
        RuntimeError: no backend serves the device.
    """
    return device_record(device).to_dict()
