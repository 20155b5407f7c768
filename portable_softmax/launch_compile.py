"""The compile of a launch's binaries: one door for every compile of the package
(``_compiled_resources``: planning's, a first launch's, and those started ahead of a later call),
keyed by what Triton specialises a binary on, where a thread asking for a binary another thread is
compiling waits for it; and the compile ahead (``compile_ahead``): a forward whose input requires
grad starts its backward's compile in a thread while its own compiles, so that a cold first
forward + backward waits for the longer of the two instead of their sum (issue 34 item 4); a sliced
record (two launches) compiles its second launch's binary beside its first's in the same way.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any, Optional

import torch

from portable_softmax import amdgcn, compat
from portable_softmax.backend import Backend
from portable_softmax.device import backend_for, device_record
from portable_softmax.interpreter import language_unpatched
from portable_softmax.record import KernelResources

logger = logging.getLogger(__name__)

_settle_lock = threading.Lock()
_settled = False


def _kernel_module(backend: Backend) -> Any:
    """The kernels a backend compiles (or interprets), their keys settled before the first compile."""
    global _settled
    if backend.interpreted:
        from portable_softmax.interpreter import interpreted_kernels

        return interpreted_kernels()
    from portable_softmax import kernels

    if not _settled:
        with _settle_lock:
            if not _settled and compat.JIT_HASH_BY_ORDER:
                # Before the first compile: keys (and Triton's disk cache entries) that do not
                # depend on which kernel this process compiles first, so that what `warmup`
                # compiled is what a call finds.
                compat.settle_jit_hashes(kernels)
            _settled = True
    return kernels


def _specialization(args: tuple) -> tuple:
    """What Triton specialises a launch on, besides constexprs."""
    key = []
    for arg in args:
        if isinstance(arg, torch.Tensor):
            key.append((arg.dtype, arg.data_ptr() % 16 == 0))
        elif isinstance(arg, torch.dtype):
            # A pointer's dtype standing for it (planning's scratch): Triton takes it as aligned.
            key.append((arg, True))
        elif isinstance(arg, int):
            key.append((arg == 1, arg % 16 == 0, -2**31 <= arg < 2**31))
        else:
            key.append(arg)
    return tuple(key)


_resources_cache: dict[tuple, KernelResources] = {}
# One lock per compile key: a thread asking for a binary another thread is compiling (one
# ``compile_ahead`` started) waits for it instead of compiling it again.
_compile_locks: dict[tuple, threading.Lock] = {}
_compile_locks_lock = threading.Lock()


def _compiled_resources(kernel: Any, backend: Backend, device: torch.device, args: tuple, constexprs: dict,
                        options: dict) -> KernelResources:
    """Compile (through Triton's warmup, into its caches) the binary of ``kernel`` a launch with
    ``args`` would run, load it, and read what it uses. Every compile of the package comes here:
    planning's, a first launch's and ``compile_ahead``'s. Where another thread is compiling the
    same binary, waits for it; where that compile failed, compiles again (and so raises here)."""
    if backend.interpreted:
        return KernelResources(registers=0, shared_memory=0, num_warps=options["num_warps"])
    key = (backend.name, device.index, kernel.fn.__name__, tuple(sorted(constexprs.items())),
           tuple(sorted(options.items())), _specialization(args))
    found = _resources_cache.get(key)
    if found is None:
        with _compile_locks_lock:
            lock = _compile_locks.setdefault(key, threading.Lock())
        with lock:
            found = _resources_cache.get(key)
            if found is None:
                found = _resources_cache[key] = _compile(kernel, args, constexprs, options)
    return found


def _compile(kernel: Any, args: tuple, constexprs: dict, options: dict) -> KernelResources:
    # The compiler key the device layer started (waited for, not computed twice), and the launcher
    # (a C module, where Triton builds one per signature) built beside the compile, not after it.
    compat.wait_compiler_key()
    compat.launcher_beside_compile(kernel)
    with language_unpatched():
        compiled = kernel.warmup(*args, grid=(1,), **constexprs, **options)
    compiled._init_handles()
    if "amdgcn" in compiled.asm:  # the driver reports no SGPRs, which bound occupancy on gfx9
        return amdgcn.kernel_resources(amdgcn.amdgcn_resources(compiled.asm["amdgcn"]), options["num_warps"],
                                       compiled.metadata.shared)
    return KernelResources(registers=compiled.n_regs, shared_memory=compiled.metadata.shared,
                           num_warps=options["num_warps"], spills=getattr(compiled, "n_spills", 0))


# The name of the threads ``compile_ahead`` starts.
AHEAD_THREAD = "portable_softmax-compile-ahead"


def compile_ahead(device: torch.device, work: Callable[[], object]) -> Optional[threading.Thread]:
    """Run ``work`` (the building of a launch a later call will make: a backward's, asked for by
    its forward; or the compile a later launch asks for: a sliced call's normalize, by its
    record's build) in a thread of its own, so that its compiles run beside the caller's: Triton's
    compile spends most of its time in MLIR, LLVM, ptxas and gcc, outside Python's lock, and two at
    once take about 0.6 of the time of one after the other (``benchmarks/probes/compile_overlap.py``).
    Its compiles are ``_compiled_resources``' own: the later call asks for the same binaries and
    waits there for any still compiling. Nothing where nothing compiles (an interpreted backend)
    or under a graph capture (the compile loads the binary onto the device). What fails here is
    logged and dropped: the later call compiles again and raises it itself. Returns the thread."""
    backend = backend_for(device)
    module = getattr(torch, device.type, None)
    if backend.interpreted or getattr(module, "is_current_stream_capturing", lambda: False)():
        return None
    # The driver, the device's record and the kernels' keys made in this thread (once per
    # process; the call needs them too), not raced from two.
    device_record(device)
    _kernel_module(backend)
    # Not a daemon: the interpreter's exit waits for it. A call may return before its compile ahead
    # ends (the loss's stats and sum: that call takes torch's operations), and a daemon thread still
    # inside Triton's compiler at exit is stopped by a forced unwind that its C++ frames swallow:
    # "FATAL: exception not rethrown", the process aborted (H200, a script of one loss call, v39).
    thread = threading.Thread(target=_ahead, args=(device, work), name=AHEAD_THREAD, daemon=False)
    thread.start()
    return thread


def _ahead(device: torch.device, work: Callable[[], object]) -> None:
    selected = getattr(getattr(torch, device.type, None), "device", None)
    try:
        # A new thread's current device is the first: the compile's is the call's.
        with selected(device.index) if selected is not None and device.index is not None else contextlib.nullcontext():
            work()
    except Exception:  # noqa: BLE001  (the call that needs it compiles again, and raises there)
        logger.debug("a compile ahead of its call failed; the call compiles again", exc_info=True)
