"""Differences between the Triton versions users have (3.2 for torch 2.6 and triton-ascend, to
3.9), behind version checks; and, on import, the check that Python, torch and Triton are versions
this package supports.

The oldest supported versions, as ``pyproject.toml`` declares them (a test checks they agree):

* Triton 3.2: the Triton of torch 2.6 and triton-ascend's; the oldest tested (its compiler builds
  every kernel variant for sm_90 and gfx942, and its interpreter passes the tests).
* torch 2.6: the first torch whose own Triton (3.2, ROCm's pytorch-triton-rocm too) is one of
  those: torch 2.4 and 2.5 require Triton 3.0 and 3.1. torch.library.custom_op, which the
  torch.compile integration needs, came in 2.4.
* Python 3.9: the oldest that torch 2.6 and Triton 3.2 have wheels for.

Newer versions than the newest tested (3.9) are not refused: nothing here caps a vendor's build.
"""
from __future__ import annotations

import functools
import inspect
import logging
import os
import re
import subprocess
import sys
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

from packaging.version import InvalidVersion, Version

logger = logging.getLogger(__name__)

MIN_PYTHON = (3, 9)
MIN_TORCH = Version("2.6")
MIN_TRITON = Version("3.2")

COMMAND = "portable-softmax"

# Where each requirement comes from, said where it is missing or too old. `portable-softmax[cpu]`
# is on no index: the extras install from a checkout (`pip install -e ".[cpu]"`).
_INSTALL_HINTS = {
    "Python": f"Python {'.'.join(map(str, MIN_PYTHON))} or newer",
    "torch": (f"torch from PyPI (`pip install \"torch>={MIN_TORCH}\"`; a CPU-only machine takes the CPU build from "
              "PyTorch's index: add `--index-url https://download.pytorch.org/whl/cpu`) or your vendor's build "
              "(ROCm's from download.pytorch.org, Ascend's paired with torch_npu)"),
    "Triton": (f"Triton from PyPI (`pip install \"triton>={MIN_TRITON}\"`, CPU and NVIDIA; from a checkout of this "
               "project `pip install -e \".[cpu]\"` does the same), on ROCm the pytorch-triton-rocm that ROCm's torch "
               "brings, on Ascend `pip install triton-ascend`"),
}


def _release(text: str) -> Optional[Version]:
    """``2.6.0+cu124`` -> 2.6.0, ``3.2.0rc4`` -> 3.2.0; None where the string is no version."""
    try:
        return Version(Version(text.split("+", 1)[0]).base_version)
    except InvalidVersion:
        return None


def requirement_problems(python: Sequence[int], torch: Optional[str], triton: Optional[str],
                         why_missing: Optional[Mapping[str, str]] = None) -> list[str]:
    """What keeps these versions from running this package, one line each. ``torch`` or
    ``triton`` None: that module cannot be imported, for the reason ``why_missing`` gives
    (by default: not installed)."""
    problems = []
    if tuple(python[:2]) < MIN_PYTHON:
        problems.append(f"Python {'.'.join(map(str, python[:3]))} found, "
                        f"{'.'.join(map(str, MIN_PYTHON))} or newer needed")
    for name, found, needed in (("torch", torch, MIN_TORCH), ("Triton", triton, MIN_TRITON)):
        if found is None:
            why = (why_missing or {}).get(name.lower(), "is not installed")
            problems.append(f"{name} {why}, {needed} or newer needed")
            continue
        release = _release(found)
        # A version string that does not parse (a vendor's own scheme) is given the benefit of the doubt.
        if release is not None and release < needed:
            problems.append(f"{name} {found} found, {needed} or newer needed")
    return problems


def _imported_version(module: str) -> tuple[Optional[str], Optional[str]]:
    """The ``__version__`` of ``module`` and None, or None and why it cannot be imported."""
    try:
        imported = __import__(module)
    except ImportError as error:
        if isinstance(error, ModuleNotFoundError) and error.name == module:
            return None, "is not installed"
        return None, f"cannot be imported ({error})"
    return str(getattr(imported, "__version__", "")), None


def _running_the_command() -> bool:
    """Whether this import is the ``portable-softmax`` command's: its console script (whose
    ``sys.argv[0]`` is the script's path while it imports the package; ``.exe`` on Windows) or
    ``python -m portable_softmax`` (whose ``sys.argv[0]`` is "-m" while the package is imported;
    the command line is in ``sys.orig_argv``, Python 3.10+)."""
    if re.sub(r"(\.exe|-script\.pyw?)$", "", os.path.basename(sys.argv[0])) == COMMAND:
        return True
    line = getattr(sys, "orig_argv", [])
    return sys.argv[:1] == ["-m"] and any(a == "-m" and b == "portable_softmax" for a, b in zip(line, line[1:]))


def _check_requirements() -> tuple[Version, Version]:
    """The torch and Triton versions, or one ImportError naming every one that does not do."""
    torch_version, torch_error = _imported_version("torch")
    triton_version, triton_error = _imported_version("triton")
    why = {name: error for name, error in (("torch", torch_error), ("triton", triton_error)) if error}
    problems = requirement_problems(sys.version_info, torch_version, triton_version, why)
    if problems:
        hints = [hint for name, hint in _INSTALL_HINTS.items() if any(p.startswith(f"{name} ") for p in problems)]
        message = (f"portable_softmax needs Python >= {'.'.join(map(str, MIN_PYTHON))}, torch >= {MIN_TORCH} and "
                   f"Triton >= {MIN_TRITON}: {'; '.join(problems)}. To fix: install {'; and '.join(hints)}.")
        if _running_the_command():
            raise SystemExit(f"{COMMAND}: {message}")  # the line alone: a command's user needs no traceback
        raise ImportError(message)
    return _release(torch_version or "") or MIN_TORCH, _release(triton_version or "") or MIN_TRITON


TORCH_VERSION, TRITON_VERSION = _check_requirements()

import triton  # noqa: E402  (present: checked above)

# kernel[grid](..., launch_cooperative_grid=True) asks the driver to refuse a grid that is not
# resident all at once, instead of letting waiting programs hang.
COOPERATIVE_LAUNCH = TRITON_VERSION >= Version("3.3")

# kernel[grid](..., launch_pdl=True) launches a kernel to overlap the one before it in the stream
# (Hopper's programmatic dependent launch: ``kernels/dependency.py``), and its launcher passes the
# attribute on: read in Triton 3.6 and 3.9; earlier versions are left without it.
DEPENDENT_LAUNCH = TRITON_VERSION >= Version("3.6")

# The loss's split forward that writes the gradient, pipelined (its target's column stored behind
# a called barrier): Triton 3.2's pipeliner fails on it (an 'arith.select' of mismatched layouts
# at the target's load); 3.6 (the H200, 2026-11-28) and 3.9 (cross-compiled) build it; 3.3-3.5
# were not tried, so they keep the unpipelined form.
LOSS_GRADIENT_PIPELINES = TRITON_VERSION >= Version("3.6")

# triton.compiler.ASTSource took ``constants=`` before it took ``constexprs=``.
AST_SOURCE_CONSTEXPRS = TRITON_VERSION >= Version("3.3")


def ast_source(fn, signature: dict, constexprs: dict, divisible_by_16=()):
    """An ASTSource for ``fn`` with ``signature`` ({name: type or "constexpr"}) and constexpr values,
    ``divisible_by_16`` specialised as ``kernel[grid](...)`` would from the values it sees (pointers
    aligned to 16 bytes, integers divisible by 16; without, the unaligned, unvectorised binary)."""
    # Constexprs left out at their defaults, in ``fn``'s parameter order (``attrs`` are positional).
    constexprs = {**{k: v for k, v in constexpr_defaults(fn).items() if k not in signature}, **constexprs}
    named = signature.keys() | constexprs.keys()
    signature = {p.name: signature.get(p.name, "constexpr") for p in fn.params if p.name in named}
    names = list(signature)
    if AST_SOURCE_CONSTEXPRS:
        attrs = {(names.index(name),): [["tt.divisibility", 16]] for name in divisible_by_16}
        return triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    # Triton 3.2 keys constants by parameter name ("Constants keys must be string").
    constants = dict(constexprs)
    attrs = None
    if divisible_by_16:
        # Triton < 3.3 described specialisations with an AttrsDescriptor.
        from triton.backends.compiler import AttrsDescriptor

        attrs = AttrsDescriptor.from_hints({names.index(name): 16 for name in divisible_by_16})
    return triton.compiler.ASTSource(fn=fn, signature={k: v for k, v in signature.items() if k not in constexprs},
                                     constants=constants, attrs=attrs)


def constexpr_defaults(fn) -> dict:
    """The defaults of jit function ``fn``'s constexprs that have one, which ``kernel[grid](...)``
    binds where a launch leaves them out (the tile kernels' windows: ``variants.constexprs``)."""
    parameters = inspect.signature(fn.fn).parameters
    return {p.name: parameters[p.name].default for p in fn.params
            if p.is_constexpr and parameters[p.name].default is not inspect.Parameter.empty}


# A compiled kernel's launcher called directly, ``compiled.run(gx, gy, gz, stream, function,
# packed_metadata, launch_metadata, enter_hook, exit_hook, *every_argument)``, constexprs included,
# as ``CompiledKernel.__getitem__``'s runner calls it: the code read in Triton 3.6 and 3.9. Older
# versions take the ``kernel[grid]`` path on every call.
DIRECT_LAUNCH = TRITON_VERSION >= Version("3.6")


def stream_getter(device) -> Callable[[], int]:
    """The raw current stream of ``device`` (a torch.device with an index), as Triton reads it."""
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
    bound = {**constexpr_defaults(kernel), **constexprs}
    tail = tuple(bound[p.name] if p.is_constexpr else next(values) for p in kernel.params[dynamic:])
    run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    c_launch = _c_launch(run)
    if c_launch is not None:
        cooperative, dependent = run.launch_cooperative_grid, run.launch_pdl

        def launch(stream: int, tensors: tuple) -> None:
            c_launch(programs, 1, 1, stream, function, cooperative, dependent, None, None, metadata, None, None, None,
                     *tensors, *tail)

        return launch

    def launch(stream: int, tensors: tuple) -> None:
        run(programs, 1, 1, stream, function, metadata, None, None, None, *tensors, *tail)

    return launch


# Triton 3.6's CUDA launcher object (``CudaLauncher.__call__``) is a Python frame that checks two
# scratch sizes and calls its C ``launch(gx, gy, gz, stream, function, cooperative, pdl,
# global_scratch, profile_scratch, packed_metadata, launch_metadata, enter_hook, exit_hook,
# *every_argument)``. A binary that asks for neither scratch is launched through that C function
# directly: 2.5 us a launch fewer on a lent H200's host (NOTES v51). Its signature changed in 3.9
# (and differs on AMD): only the version and driver measured take it.
C_LAUNCH = Version("3.6") <= TRITON_VERSION < Version("3.7")


def _c_launch(run) -> Optional[Callable[..., None]]:
    """The C launch under Triton 3.6's CUDA launcher ``run``, where its binary needs no scratch;
    else None (``run`` itself is called)."""
    if not C_LAUNCH or type(run).__name__ != "CudaLauncher":
        return None
    if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return None
    return getattr(run, "launch", None)


# Triton 3.6 keys a jit function by the order this process hashed functions in
# (``settle_jit_hashes``); 3.2 holds no globals in a key, 3.9 computes a callee's key first. The
# versions between are untested: settled too.
JIT_HASH_BY_ORDER = Version("3.3") <= TRITON_VERSION < Version("3.9")


def settle_jit_hashes(package: types.ModuleType) -> int:
    """Give every Triton jit function defined in ``package``'s loaded modules the cache key of its
    whole call tree, whatever this process hashed before; returns how many it hashed.

    A function's key holds the constexpr globals of the functions it calls. Triton 3.6 (before
    triton-lang/triton#10494) read a callee's globals before computing the callee's key, so a
    callee not yet hashed in the process gave none: a kernel's key, and its entry in Triton's
    disk cache, depended on the kernels hashed before it. On an H200 the cross-entropy's split
    forward, which shares the exchange with the softmax's split kernels, was keyed one way after a
    softmax and another alone: a first loss call after ``portable-softmax warmup`` (which warms the
    softmax first) compiled it again. Hashed anew callees first (clearing ``.hash`` is how Triton
    itself invalidates a key), each function finds its callees' globals whole: every key is the
    same in every process, and later Triton's. One pass, inside a cold first call (hashing again
    until no key changed took three). Call it before anything is compiled."""
    from triton.runtime.jit import JITFunction

    prefix = package.__name__ + "."
    found = {id(value): value for name, module in list(sys.modules.items())
             if module is not None and (name == package.__name__ or name.startswith(prefix))
             for value in list(vars(module).values())
             if isinstance(value, JITFunction) and getattr(value.fn, "__module__", "").startswith(prefix)}
    functions = sorted(found.values(), key=lambda f: (f.fn.__module__, f.fn.__qualname__))
    order: list = []
    placed: set[int] = set()

    def place(function: Any) -> None:
        # The names a function's code reads that are jit functions of its module: its callees
        # (Triton calls no function recursively). Placed before it.
        placed.add(id(function))
        for name in function.fn.__code__.co_names:
            callee = function.fn.__globals__.get(name)
            if isinstance(callee, JITFunction) and id(callee) not in placed:
                place(callee)
        order.append(function)

    for function in functions:
        if id(function) not in placed:
            place(function)
    for function in order:
        function.hash = None
    for function in order:
        function.cache_key
    return len(order)


# Triton 3.2 to 3.4 link AMD code with an external ld.lld. 3.2 writes code objects v4
# (``amd.set_abi_version(module, 400)``), which Debian's LLD 14 links; 3.3 and 3.4 write v5 (500),
# which LLD 14 refuses ("unknown abi version") and LLD 15 and 16 link.
AMD_LLD_MIN_MAJOR = 15 if TRITON_VERSION >= Version("3.3") else None


def _lld_major(path: str) -> Optional[int]:
    """The LLVM major version of an ld.lld (``Debian LLD 14.0.6``, ``AMD LLD 17.0.0``), if it says."""
    try:
        text = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"\bLLD (\d+)\.", text)
    return int(found.group(1)) if found else None


def missing_toolchain(backend: str) -> Optional[str]:
    """Why this Triton cannot compile for ``backend`` (``cuda`` or ``hip``) on this machine, or None.

    Triton 3.2 to 3.4 link AMD code objects with an external ``ld.lld``, which they look for in
    ``TRITON_HIP_LLD_PATH``, beside the amd backend (pytorch-triton-rocm bundles one), in
    ``/opt/rocm/llvm/bin`` and as ``/usr/bin/ld.lld`` (Debian's ``lld`` package); newer ones link in
    process. Asked here with Triton's own lookup, so the answer is the linker a compile would run.
    """
    import triton.backends

    name = {"cuda": "nvidia", "hip": "amd"}.get(backend, backend)
    if name not in triton.backends.backends:
        return f"Triton {triton.__version__} has no {name} compiler backend"
    if name == "amd":
        from triton.backends.amd.compiler import HIPBackend

        lookup = getattr(HIPBackend, "path_to_rocm_lld", None)
        if lookup is None:
            return None
        if AMD_LLD_MIN_MAJOR:
            fix = (f"point TRITON_HIP_LLD_PATH at an ld.lld of LLVM {AMD_LLD_MIN_MAJOR} or newer (Debian 12: apt-get "
                   f"install lld-16, then TRITON_HIP_LLD_PATH=/usr/lib/llvm-16/bin/ld.lld) or ROCm's")
        else:
            fix = ("install one where Triton looks (Debian: apt-get install lld, which gives /usr/bin/ld.lld) or point "
                   "TRITON_HIP_LLD_PATH at one (ROCm's, LLVM's)")
        try:
            lld = str(lookup())
        except Exception as error:  # Triton raises a bare Exception naming the path it wanted
            return f"Triton {triton.__version__} links AMD code with an external ld.lld, and none is found ({error}): {fix}"
        major = _lld_major(lld)
        if AMD_LLD_MIN_MAJOR and major is not None and major < AMD_LLD_MIN_MAJOR:
            return (f"Triton {triton.__version__} links AMD code objects v5 with {lld}, LLD {major}, which cannot "
                    f"read them: {fix}")
    return None


# A cold first call's host work that is not its kernels' compile (issue 34 item 4; H200 host, Triton
# 3.6): the driver's utils, a C module built with gcc at the first use of the driver (0.3-0.4 s);
# Triton's compiler key (``triton_key``: its sources and libtriton hashed, 0.4 s, once a process) at
# the start of the first compile; and each kernel signature's launcher, a C module built with gcc
# after the compile (0.28-0.39 s, ``_init_handles``). gcc runs in a subprocess and hashlib hashes
# outside Python's lock: the key is computed beside the utils' build, the launcher beside the compile.
KEY_THREAD = "portable_softmax-compiler-key"
LAUNCHER_THREAD = "portable_softmax-launcher"
_key_thread: Optional[threading.Thread] = None
_ahead_lock = threading.Lock()


def _triton_key() -> Callable[[], str]:
    """Triton's compiler key, cached for the process: in triton.runtime.cache (3.6, 3.9), in
    triton.compiler.compiler (3.2)."""
    import importlib

    found = getattr(importlib.import_module("triton.runtime.cache"), "triton_key", None)
    return found or importlib.import_module("triton.compiler.compiler").triton_key


def _compute_compiler_key() -> None:
    try:
        _triton_key()()
    except Exception:  # noqa: BLE001  (the first compile computes it, and raises there)
        logger.debug("Triton's compiler key, computed ahead, failed; the first compile computes it", exc_info=True)


def compiler_key_ahead() -> None:
    """Start Triton's compiler key in a thread, once a process: called before this package's first
    use of a compiling backend's driver (whose utils that use builds), so that the first compile
    finds it made. Never raises: where no thread starts, the first compile computes it as before."""
    global _key_thread
    if _key_thread is not None:
        return
    with _ahead_lock:
        if _key_thread is None:
            _key_thread = threading.Thread(target=_compute_compiler_key, name=KEY_THREAD, daemon=True)
            try:
                _key_thread.start()
            except RuntimeError:  # no thread to be had
                logger.debug("no thread for Triton's compiler key; the first compile computes it", exc_info=True)


def wait_compiler_key() -> None:
    """Wait for the compiler key ``compiler_key_ahead`` started, if it is still being computed: a
    compile asking for it meanwhile would compute it again, beside it."""
    thread = _key_thread
    if thread is not None and thread.ident is not None:
        thread.join()


def _per_signature_launcher() -> bool:
    """Whether the active driver builds a launcher per kernel signature from a C source its module
    makes (``make_launcher``: Triton 3.2 and 3.6 read; 3.9 launches through its utils)."""
    try:
        launcher = triton.runtime.driver.active.launcher_cls
    except Exception:  # noqa: BLE001  (no active driver: "0 active drivers" without a GPU)
        return False
    # The globals of its module (Triton 3.2 loads its backends' drivers outside sys.modules), under
    # any wrapper of its __init__ (a profiler's, benchmarks/probes/compile_timeline.py's).
    import inspect

    return "make_launcher" in getattr(inspect.unwrap(getattr(launcher, "__init__", None)), "__globals__", {})


class _KnownMetadata:
    """A compiled kernel's metadata as far as it is known before the compile: the compile's options,
    which the metadata holds (HIP's launcher source reads the warp size); None for what the compile
    adds (tensor descriptors' metadata, which a source reads only for tensor descriptor arguments;
    scratch sizes, which it does not read)."""

    def __init__(self, options: Optional[Mapping[str, Any]]) -> None:
        vars(self).update(options or {})

    def __getattr__(self, name: str) -> None:
        return None


def _build_launcher(src: Any, options: Optional[Mapping[str, Any]]) -> None:
    # Triton's own launcher class makes the source and builds it into Triton's cache, keyed by the
    # source: the compiled kernel's ``_init_handles`` then loads it. The instance is dropped.
    try:
        triton.runtime.driver.active.launcher_cls(src, _KnownMetadata(options))
    except Exception:  # noqa: BLE001  (Triton builds it after the compile, as before)
        logger.debug("a launcher built beside its compile failed; Triton builds it after the compile", exc_info=True)


def _compile_beside_launcher(compile: Callable[..., Any], src: Any, *args: Any, **kwargs: Any) -> Any:
    """``compile(src, ...)`` with ``src``'s launcher built in a thread meanwhile, joined before it returns."""
    builder = threading.Thread(target=_build_launcher, args=(src, kwargs.get("options")),
                               name=f"{LAUNCHER_THREAD} {getattr(src, 'name', '')}", daemon=True)
    try:
        builder.start()
    except RuntimeError:  # no thread to be had: Triton builds it after the compile
        builder = None
    try:
        return compile(src, *args, **kwargs)
    finally:
        if builder is not None:
            builder.join()


@functools.lru_cache(maxsize=None)
def _launcher_beside_class(cls: type) -> type:
    """``cls`` (Triton's JITFunction) whose ``compile``, which Triton sets on the instance for each
    device (``create_binder``) and calls with the source it compiles, reads as that compile with its
    launcher built beside it. A property, so that Triton's setting it again is seen."""
    def get(self: Any) -> Callable[..., Any]:
        try:
            compile = vars(self)["compile"]
        except KeyError:
            raise AttributeError("compile") from None
        return functools.partial(_compile_beside_launcher, compile)

    def put(self: Any, compile: Callable[..., Any]) -> None:
        vars(self)["compile"] = compile

    return type(cls.__name__, (cls,), {"compile": property(get, put), "_launcher_beside_compile": True,
                                       "__module__": cls.__module__, "__qualname__": cls.__qualname__})


def launcher_beside_compile(kernel: Any) -> None:
    """Have each compile of ``kernel``, one of this package's Triton JIT functions, build its
    launcher beside it, where the active driver builds one per signature; nothing otherwise (another
    object, Triton 3.9, no driver). Only this kernel: its own class is changed, not Triton's, so
    other Triton kernels of the process compile as before. Idempotent."""
    from triton.runtime.jit import JITFunction

    if (getattr(type(kernel), "_launcher_beside_compile", False) or not isinstance(kernel, JITFunction)
            or not _per_signature_launcher()):
        return
    with _ahead_lock:
        if not getattr(type(kernel), "_launcher_beside_compile", False):
            kernel.__class__ = _launcher_beside_class(type(kernel))
