"""Differences between the Triton versions users have (3.2 for triton-ascend, 3.6, 3.9), behind
version checks."""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Optional

import triton
from packaging.version import Version

TRITON_VERSION = Version(Version(triton.__version__).base_version)

# kernel[grid](..., launch_cooperative_grid=True) asks the driver to refuse a grid that is not
# resident all at once, instead of letting waiting programs hang.
COOPERATIVE_LAUNCH = TRITON_VERSION >= Version("3.3")

# triton.compiler.ASTSource took ``constants=`` before it took ``constexprs=``.
AST_SOURCE_CONSTEXPRS = TRITON_VERSION >= Version("3.3")


def ast_source(fn, signature: dict, constexprs: dict, divisible_by_16=()):
    """An ASTSource for ``fn`` with ``signature`` ({name: type or "constexpr"}) and constexpr values.

    ``divisible_by_16`` names the arguments a launch would specialise as multiples of 16 (pointers
    aligned to 16 bytes, integers divisible by 16), as ``kernel[grid](...)`` does from the values
    it sees; without them the binary is the unaligned, unvectorised one.
    """
    names = list(signature)
    if AST_SOURCE_CONSTEXPRS:
        attrs = {(names.index(name),): [["tt.divisibility", 16]] for name in divisible_by_16}
        return triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    constants = {names.index(name): value for name, value in constexprs.items()}
    attrs = None
    if divisible_by_16:
        # Triton < 3.3 described specialisations with an AttrsDescriptor.
        from triton.backends.compiler import AttrsDescriptor

        attrs = AttrsDescriptor.from_hints({names.index(name): 16 for name in divisible_by_16})
    return triton.compiler.ASTSource(fn=fn, signature={k: v for k, v in signature.items() if k not in constexprs},
                                     constants=constants, attrs=attrs)

# A compiled kernel's launcher called directly, ``compiled.run(gx, gy, gz, stream, function,
# packed_metadata, launch_metadata, enter_hook, exit_hook, *every_argument)``, constexprs included,
# as ``CompiledKernel.__getitem__``'s runner calls it: the code read in Triton 3.6 and 3.9. Older
# versions take the ``kernel[grid]`` path on every call.
DIRECT_LAUNCH = TRITON_VERSION >= Version("3.6")


def stream_getter(device) -> Callable[[], int]:
    """A function returning the raw current stream of ``device`` (a torch.device with an index),
    as Triton's launch reads it."""
    return functools.partial(triton.runtime.driver.active.get_current_stream, device.index)


def current_device_getter(device) -> Callable[[], int]:
    """A function returning the index of the current device of ``device``'s type."""
    import torch

    if device.type == "cuda" and hasattr(torch._C, "_cuda_getDevice"):
        return torch._C._cuda_getDevice  # what torch.cuda.current_device() returns, without its checks
    return getattr(torch, device.type).current_device


def _hook_set(hook) -> bool:
    # Triton 3.6+ keeps each hook as a HookChain, present even when it holds no function.
    return hook is not None and bool(getattr(hook, "calls", True))


def _launch_hooks_set() -> bool:
    try:
        from triton import knobs

        hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    except ImportError:  # Triton < 3.4: the hooks live on CompiledKernel
        from triton.compiler.compiler import CompiledKernel

        hooks = (CompiledKernel.launch_enter_hook, CompiledKernel.launch_exit_hook)
    return any(_hook_set(hook) for hook in hooks)


def direct_launcher(kernel, args: tuple, programs: int, constexprs: dict, options: dict,
                    dynamic: int) -> Optional[Callable[[int, tuple], None]]:
    """``launch(stream, tensors)`` through the launcher of the binary that ``kernel[(programs,)]
    (*args, **constexprs, **options)`` ran, with the arguments after the first ``dynamic`` (the
    tensors) laid out once; None where the launcher is not known (Triton < 3.6) or launch hooks
    (a profiler) are set, which only ``kernel[grid]`` calls."""
    if not DIRECT_LAUNCH or _launch_hooks_set():
        return None
    compiled = kernel.warmup(*args, grid=(programs,), **constexprs, **options)
    compiled._init_handles()
    values = iter(args[dynamic:])
    tail = tuple(constexprs[p.name] if p.is_constexpr else next(values) for p in kernel.params[dynamic:])
    run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata

    def launch(stream: int, tensors: tuple) -> None:
        run(programs, 1, 1, stream, function, metadata, None, None, None, *tensors, *tail)

    return launch
