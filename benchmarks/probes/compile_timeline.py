"""A per-thread timeline of a cold first call's compiles (issue 34 item 4), installed in their fresh
processes by ``first_call.py --timeline`` and ``compile_overlap.py --calls --timeline``: what makes
the softmax's backward compile (``compile_ahead``'s thread) take turns with its forward's on a GPU.

``install()`` wraps, without changing what they do, and records (thread, event, start, end, kernel):
the package's compile door, its per-key lock waits (``door wait``), ``_compile``,
``settle_jit_hashes`` and ``language_unpatched`` waits; Triton's JIT misses (an instant, with a
digest of the key: a kernel compiled twice shows twice); ``triton.compile`` and each stage the
backends' ``add_stages`` make (CUDA's, HIP's), ``ast`` before them; slow ``triton_key``,
``get_cache_key`` and source hashes (once-only costs); ``_init_handles``, the drivers' launcher and
utils classes, their C builds and gcc (none per signature on Triton 3.9), ``load_binary`` (the module
load). A sampler waking every 5 ms records a wake-up 30 ms late as ``stall``: the GIL held in C
code, or no free core. Threads: ``main`` (the call's), ``ahead`` (``compile_ahead``'s), ``key``
(Triton's compiler key, started by the device layer) and ``launch1``, ``launch2``... (each launcher
built beside its compile, numbered as they appear; the kernel column names the compile's kernel).
"""
from __future__ import annotations

import functools
import hashlib
import sys
import threading
import time
import types
from typing import Any, Callable, Optional

_events: list[tuple[str, str, float, float, str]] = []  # (thread, event, start, end, kernel)
_installed = False
STALL_S = 0.030
WAIT_S = 0.0005  # lock waits shorter than this are left out
_THREADS = {"MainThread": "main"}  # and compile_ahead's: "ahead", the compiler key's: "key" (install)
_LAUNCHER_THREAD: Optional[str] = None  # compat.LAUNCHER_THREAD (install), followed by the kernel's name
_labels_lock = threading.Lock()


def _label(name: str) -> str:
    found = _THREADS.get(name)
    if found is None:
        with _labels_lock:
            launchers = sum(label.startswith("launch") for label in _THREADS.values())
            launcher = _LAUNCHER_THREAD is not None and name.startswith(_LAUNCHER_THREAD)
            found = _THREADS.setdefault(name, f"launch{launchers + 1}" if launcher else name[:10])
    return found


def _record(event: str, began: float, ended: float, kernel: str = "") -> None:
    _events.append((_label(threading.current_thread().name), event, began, ended, kernel))  # atomic under the GIL


def _named(value: Any, *_: Any, **__: Any) -> str:
    """A kernel's name from a wrapped callable's first argument: a source or a compiled kernel (its
    ``name``), a JIT function (its ``fn``'s), a string."""
    name = getattr(value, "name", value)
    return name if isinstance(name, str) else getattr(getattr(value, "fn", None), "__name__", "")


def _timed(original: Callable[..., Any], event: str, label: Callable[..., str] = lambda *a, **k: "",
           least: float = 0.0, after: Optional[Callable[..., None]] = None) -> Callable[..., Any]:
    """``original``, recording each call of ``least`` seconds or more; ``label`` names its kernel
    from its arguments; ``after`` runs after a call that returned."""
    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        try:
            kernel = label(*args, **kwargs)
        except Exception:  # noqa: BLE001  (a label is a nicety)
            kernel = ""
        began = time.perf_counter()
        try:
            result = original(*args, **kwargs)
            if after is not None:
                after(*args, **kwargs)
            return result
        finally:
            if time.perf_counter() - began >= least:
                _record(event, began, time.perf_counter(), kernel)

    timed._timeline = True  # type: ignore[attr-defined]
    return timed


def _wrap(owner: Any, name: str, event: str, *args: Any, **kwargs: Any) -> bool:
    """Replace ``owner.name`` by ``_timed`` of it; False where it is absent or already timed."""
    original = getattr(owner, name, None)
    if original is None or getattr(original, "_timeline", False):
        return False
    setattr(owner, name, _timed(original, event, *args, **kwargs))
    return True


def _timed_stages(add_stages: Callable[..., Any]) -> Callable[..., Any]:
    """A backend's ``add_stages`` whose stages, each a callable in its dict, are timed."""
    def wrapped(self: Any, stages: dict, *args: Any, **kwargs: Any) -> Any:
        result = add_stages(self, stages, *args, **kwargs)
        stages.update({name: _timed(fn, f"stage {name}") for name, fn in stages.items()})
        return result

    wrapped._timeline = True  # type: ignore[attr-defined]
    return wrapped


class _TimedLock:
    """A door's per-key lock (a value of ``launch_compile._compile_locks``) whose waits are recorded."""

    def __init__(self, lock: Any, kernel: str) -> None:
        self._lock, self._kernel = lock, kernel

    def __enter__(self) -> None:
        began = time.perf_counter()
        self._lock.acquire()
        if time.perf_counter() - began >= WAIT_S:
            _record("door wait", began, time.perf_counter(), self._kernel)

    def __exit__(self, *_: Any) -> None:
        self._lock.release()


class _Locks(dict):
    def setdefault(self, key: Any, default: Any = None) -> Any:
        return super().setdefault(key, _TimedLock(default, str(key[2])))


def _jit_miss(previous: Optional[Callable[..., Any]]) -> Callable[..., Any]:
    def hook(*args: Any, **kwargs: Any) -> Any:
        now = time.perf_counter()
        digest = hashlib.sha256(str(kwargs.get("key")).encode()).hexdigest()[:8]
        _record(f"jit miss {digest}", now, now, getattr(kwargs.get("fn"), "name", ""))
        return previous(*args, **kwargs) if previous is not None else None
    return hook


def _sample() -> None:
    while True:
        began = time.perf_counter()
        time.sleep(0.005)
        if time.perf_counter() - began - 0.005 >= STALL_S:
            _record("stall", began + 0.005, time.perf_counter())


def install() -> None:
    """Wrap what the module docstring lists, once per process; start the sampler."""
    global _installed, _LAUNCHER_THREAD
    if _installed:
        return
    _installed = True
    import triton
    import triton.compiler.compiler as compiler
    import triton.runtime.build as build
    import triton.runtime.cache as cache
    from triton.backends import backends
    from triton.runtime.jit import JITFunction

    from portable_softmax import compat, interpreter, launch, launch_compile, loss_launch

    _THREADS[launch_compile.AHEAD_THREAD] = "ahead"
    _THREADS[compat.KEY_THREAD] = "key"
    _LAUNCHER_THREAD = compat.LAUNCHER_THREAD
    timed_compile = _timed(compiler.compile, "triton.compile", _named)
    for owner in (triton, triton.compiler, compiler):  # the JIT imports triton.compiler's at its first run
        owner.compile = timed_compile
    _wrap(compiler.ASTSource, "make_ir", "stage ast", _named)
    for owner in (cache, compiler):
        _wrap(owner, "triton_key", "triton_key", least=0.001)
    _wrap(compiler, "get_cache_key", "get_cache_key", least=0.001)
    owner = next(cls for cls in JITFunction.__mro__ if "cache_key" in vars(cls))
    if isinstance(vars(owner)["cache_key"], property):  # the source hash, once a function
        getter = types.SimpleNamespace(fget=vars(owner)["cache_key"].fget)
        if _wrap(getter, "fget", "jit cache_key", _named, least=0.005):
            owner.cache_key = property(getter.fget)
    _wrap(compiler.CompiledKernel, "_init_handles", "_init_handles", _named, least=0.0001)
    _wrap(build, "_build", "gcc", _named)
    for backend in backends.values():
        if not getattr(backend.compiler.add_stages, "_timeline", False):
            backend.compiler.add_stages = _timed_stages(backend.compiler.add_stages)
        module = sys.modules[backend.driver.__module__]
        for builder in ("compile_module_from_src", "compile_module_from_file"):
            _wrap(module, builder, "C module build", lambda *a, **k: k.get("name") or a[1])
        for name, cls in [(n, c) for n, c in vars(module).items() if isinstance(c, type)]:
            if name.endswith("Launcher"):
                _wrap(cls, "__init__", f"{name}()", lambda self, src, *a, **k: _named(src))
            elif name.endswith("Utils"):  # load_binary: an attribute of its one instance
                timed_load = lambda self: _wrap(self, "load_binary", "load_binary", _named)  # noqa: E731
                if hasattr(getattr(cls, "instance", None), "load_binary"):
                    timed_load(cls.instance)
                _wrap(cls, "__init__", f"{name}()", after=timed_load)
    knobs = getattr(triton, "knobs", None)  # Triton 3.4 on; JITFunction.cache_hook before
    if knobs is not None:
        knobs.runtime.jit_cache_hook = _jit_miss(knobs.runtime.jit_cache_hook)
    else:
        JITFunction.cache_hook = _jit_miss(JITFunction.cache_hook)
    door = launch_compile._compiled_resources
    _wrap(launch_compile, "_compiled_resources", "door", _named)
    for module in (launch, loss_launch):  # they import it by name
        if getattr(module, "_compiled_resources", None) is door:
            module._compiled_resources = launch_compile._compiled_resources
    _wrap(launch_compile, "_compile", "_compile", _named)
    launch_compile._compile_locks = _Locks(launch_compile._compile_locks)
    _wrap(compat, "settle_jit_hashes", "settle_jit_hashes")
    for how in ("shared", "alone"):
        _wrap(getattr(interpreter._LANGUAGE, how), "_take", f"language lock wait ({how})", least=WAIT_S)
    threading.Thread(target=_sample, name="sampler", daemon=True).start()


def _overlap(prefix: str) -> tuple[dict[str, float], float]:
    """Per thread, the seconds inside events named ``prefix...`` (nested ones counted once); and
    the seconds during which two threads or more were inside one."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for thread, event, began, ended, _ in _events:
        if event.startswith(prefix):
            spans.setdefault(thread, []).append((began, ended))
    inside: dict[str, float] = {}
    edges: list[tuple[float, int]] = []
    for thread, intervals in spans.items():
        merged: list[list[float]] = []
        for began, ended in sorted(intervals):
            if merged and began <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], ended)
            else:
                merged.append([began, ended])
        inside[thread] = sum(e - b for b, e in merged)
        edges += [(b, 1) for b, _ in merged] + [(e, -1) for _, e in merged]
    both, count, last = 0.0, 0, 0.0
    for at, step in sorted(edges):
        if count >= 2:
            both += at - last
        count, last = count + step, at
    return inside, both


def report(origin: float) -> list[str]:
    """The timeline so far, one line an event (ms from ``origin``, a ``time.perf_counter()``; nested
    events indented, named by the kernel of the event around them; ``triton.compile (disk hit)``
    where no stage ran in it), then the overlap and the stalls."""
    events = sorted(_events, key=lambda e: (e[2], -e[3]))
    lines = [f"{'start ms':>9} {'ms':>8}  {'thread':<8} {'event':<36} kernel"]
    for thread, event, began, ended, kernel in events:
        around = [e for e in events
                  if e[0] == thread and e[2] <= began and ended <= e[3] and e[3] - e[2] > ended - began]
        kernel = kernel or next((e[4] for e in reversed(around) if e[4]), "")
        if event == "triton.compile" and not any(e[0] == thread and e[1].startswith("stage ") and began <= e[2] <= ended
                                                 for e in events):
            event += " (disk hit)"
        lines.append(f"{(began - origin) * 1e3:9.1f} {(ended - began) * 1e3:8.1f}  {thread:<8} "
                     f"{'  ' * len(around) + event:<36} {kernel[:48]}")
    for prefix, what in (("stage ", "a compile stage"), ("triton.compile", "triton.compile")):
        inside, both = _overlap(prefix)
        each = ", ".join(f"{thread} {seconds:.2f} s" for thread, seconds in sorted(inside.items()))
        lines.append(f"inside {what}: {each or 'none'}; two threads at once {both:.2f} s")
    stalls = [e[3] - e[2] for e in _events if e[1] == "stall"]
    lines.append(f"stalls (the sampler {STALL_S * 1e3:.0f} ms late or more): {len(stalls)}, {sum(stalls):.2f} s")
    return lines
