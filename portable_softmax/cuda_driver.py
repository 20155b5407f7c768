"""A launch through the CUDA driver itself (``cuLaunchKernel`` by ctypes), for the CUDA backend.

Triton's own launcher costs about 7 us per call on an H200 host (its Python wrapper, then a C
function that parses every argument and calls ``cuLaunchKernelEx``): as much as torch's whole
softmax call. This one keeps the kernel's parameter block between calls, a ctypes scalar per
parameter, and a call rewrites only the tensors' addresses before calling the driver.

The parameter block is what Triton's launcher (3.6 to 3.9) builds: every parameter the compiled
signature does not make a constexpr (pointers as 64-bit addresses, integers at their specialised
width), then the addresses of the global and the profile scratch, 0 when the kernel needs none
(the only case served here). The launch is checked against Triton's own before it is used
(``launch.LaunchRecord``): a layout that differed would show there, and Triton's launcher stays.
"""
from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, Optional

_INTEGERS = {"i32": ctypes.c_int32, "i64": ctypes.c_int64, "u32": ctypes.c_uint32, "u64": ctypes.c_uint64}


@functools.lru_cache(maxsize=None)
def _driver() -> Optional[Any]:
    try:
        library = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    launch = library.cuLaunchKernel
    launch.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                       ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                       ctypes.POINTER(ctypes.c_void_p)]
    launch.restype = ctypes.c_int
    return library


def _error_name(library: Any, code: int) -> str:
    name = ctypes.c_char_p()
    library.cuGetErrorName(code, ctypes.byref(name))
    return name.value.decode() if name.value else str(code)


def launcher(compiled: Any, parameters: Sequence[tuple[str, Any]], programs: int, dynamic: int
             ) -> Optional[Callable[[int, Sequence[Any]], None]]:
    """``launch(stream, tensors)`` of ``compiled`` (a Triton CompiledKernel whose handles are
    loaded) over ``programs`` programs. ``parameters``: the kernel's parameters as the compiled
    signature types them with a launch's values (``compat.launch_parameters``), the first
    ``dynamic`` of them tensors, replaced per call. None where this launch does not apply (no
    driver library, scratch memory, clusters, a cooperative grid, or a parameter type other than
    pointers and integers)."""
    library = _driver()
    metadata = compiled.metadata
    if (library is None or getattr(metadata, "global_scratch_size", 0) or getattr(metadata, "profile_scratch_size", 0)
            or getattr(metadata, "num_ctas", 1) != 1 or getattr(metadata, "launch_cooperative_grid", False)
            or getattr(metadata, "launch_pdl", False)):
        return None
    slots: list[Any] = []
    for kind, value in parameters:
        if kind.startswith("*"):
            slots.append(ctypes.c_uint64(0 if hasattr(value, "data_ptr") else int(value)))
        elif kind in _INTEGERS:
            slots.append(_INTEGERS[kind](int(value)))
        else:
            return None
    slots += [ctypes.c_uint64(0), ctypes.c_uint64(0)]  # global and profile scratch: none
    params = (ctypes.c_void_p * len(slots))(*[ctypes.cast(ctypes.pointer(s), ctypes.c_void_p) for s in slots])
    addresses = slots[:dynamic]
    function, threads, shared = compiled.function, 32 * metadata.num_warps, metadata.shared
    launch = library.cuLaunchKernel
    # The block is shared by every call of the record: threads take turns writing it and
    # launching (the driver copies the parameters at the call).
    turn = threading.Lock()

    def run(stream: int, tensors: Sequence[Any]) -> None:
        with turn:
            for slot, tensor in zip(addresses, tensors):
                slot.value = tensor.data_ptr()
            code = launch(function, programs, 1, 1, threads, 1, 1, shared, stream, params, None)
        if code:
            raise RuntimeError(f"cuLaunchKernel failed: {_error_name(library, code)}")

    return run
