"""Running the kernel source on CPU tensors through Triton's interpreter, in an ordinary process.

Triton decides between compiling and interpreting when a function is decorated, reading
``TRITON_INTERPRET`` at that moment, and the standard library in ``triton.language`` (``tl.max``,
``tl.sum``, ...) is decorated once, when triton is imported. So that CPU tensors work without the
user setting anything, and GPU tensors keep working in the same process:

* the ``kernels`` package is loaded a second time as ``portable_softmax.kernels_interpreted``,
  decorated with the interpreter's ``InterpretedFunction`` (``kernels/jit.py``);
* that copy sees ``triton.language`` through :func:`interpreted_language`, a view in which the
  standard library's jit functions are interpreted ones;
* :func:`restored_language` undoes the interpreter's patches of ``triton.language`` after each
  launch: some Triton versions leave them in place, which breaks later GPU compilation.

The interpreter keeps a launch's state in globals: those patches, and the program index and grid
of its one builder. Two launches at once (from two threads) see each other's, so interpreted
launches take turns, and no GPU compile runs during one (:class:`_LanguageLock`).
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any, Optional

import numpy
import triton.language as _tl
from triton.runtime import interpreter as _interpreter
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

kernel_decorator = InterpretedFunction


class _Hold:
    """A ``with`` block that calls ``take`` on entry and ``drop`` on exit; one object serves every
    thread (the lock keeps each thread's holds)."""

    __slots__ = ("_take", "_drop")

    def __init__(self, take: Any, drop: Any) -> None:
        self._take, self._drop = take, drop

    def __enter__(self) -> None:
        self._take()

    def __exit__(self, *_: Any) -> None:
        self._drop()


class _LanguageLock:
    """Who may see ``triton.language`` now. An interpreted launch patches it for its duration, and
    the first load of the interpreted kernels rewrites them against it: each holds it alone
    (``alone``). A GPU compile only reads it: compiles share it (``shared``), so that a call's
    compile and one started ahead of its backward (``launch_compile.compile_ahead``) run at once.
    Both holds are reentrant in the thread that has them (a launch may load the kernels, a first
    launch compile), and a thread holding it alone may also take it shared; a thread holding it
    shared must not ask for it alone (no path does: a compile launches nothing interpreted)."""

    def __init__(self) -> None:
        # Taken directly (``with self._mutex``: no Python frame) on the uncontended path, a hold
        # of every compile's first launch and of every sharded launch; waited on through the
        # condition, notified only where a thread waits.
        self._mutex = threading.Lock()
        self._changed = threading.Condition(self._mutex)
        self._waiting = 0
        self._shared: dict[int, int] = {}  # thread -> depth of its shared holds
        self._owner: Optional[int] = None  # the thread holding it alone
        self._depth = 0
        self.shared = _Hold(self._take_shared, self._drop_shared)
        self.alone = _Hold(self._take_alone, self._drop_alone)

    def _wait(self) -> None:
        self._waiting += 1
        self._changed.wait()
        self._waiting -= 1

    def _take_shared(self) -> None:
        me = threading.get_ident()
        with self._mutex:
            while self._owner is not None and self._owner != me:
                self._wait()
            self._shared[me] = self._shared.get(me, 0) + 1

    def _drop_shared(self) -> None:
        me = threading.get_ident()
        with self._mutex:
            depth = self._shared.pop(me) - 1
            if depth:
                self._shared[me] = depth
            elif self._waiting:
                self._changed.notify_all()

    def _take_alone(self) -> None:
        me = threading.get_ident()
        with self._mutex:
            while self._owner not in (None, me) or any(thread != me for thread in self._shared):
                self._wait()
            self._owner, self._depth = me, self._depth + 1

    def _drop_alone(self) -> None:
        with self._mutex:
            self._depth -= 1
            if not self._depth:
                self._owner = None
                if self._waiting:
                    self._changed.notify_all()


_LANGUAGE = _LanguageLock()


class _InterpretedLanguage(types.ModuleType):
    """``triton.language`` with its jit functions swapped for interpreted ones.

    Other names are looked up on the real module at each use, because the interpreter patches
    that module's builtins for the duration of a launch.
    """

    def __init__(self, interpreted: dict[str, InterpretedFunction]) -> None:
        super().__init__("triton.language (interpreted)")
        self._interpreted = interpreted

    def __getattr__(self, name: str) -> Any:
        if name == "range":
            return _range
        found = self.__dict__["_interpreted"].get(name)
        return found if found is not None else getattr(_tl, name)


def _bound(value: Any) -> Any:
    """A loop bound as a Python int: the interpreter holds scalars as one-element arrays, which
    NumPy 2.4 no longer converts with ``int()`` (Triton 3.6's interpreter range does that)."""
    handle = getattr(value, "handle", None)
    data = getattr(handle, "data", None)
    return int(data.reshape(-1)[0]) if data is not None else value


def _range(*bounds: Any, **options: Any) -> Any:
    return _tl.range(*(_bound(b) for b in bounds), **options)


@functools.lru_cache(maxsize=None)
def interpreted_language() -> types.ModuleType:
    interpreted = {}
    for name in dir(_tl):
        value = getattr(_tl, name)
        if isinstance(value, JITFunction):
            function = InterpretedFunction(value.fn)
            # Rewriting inspects the function's references; done here, outside any launch,
            # it sees the unpatched language.
            if hasattr(function, "rewrite"):
                function.rewrite()
            interpreted[name] = function
    return _InterpretedLanguage(interpreted)


_kernels: Any = None


def interpreted_kernels() -> types.ModuleType:
    """The kernel package, decorated for the interpreter (loaded once, on first CPU use)."""
    global _kernels
    with _LANGUAGE.alone:
        if _kernels is None:
            # The package's files, found without importing the compiled package (which imports
            # nothing from here); registered first, so that its modules' relative imports load
            # the interpreted copies of their siblings.
            folder = importlib.util.find_spec("portable_softmax.kernels").submodule_search_locations
            name = "portable_softmax.kernels_interpreted"
            spec = importlib.util.spec_from_file_location(name, os.path.join(folder[0], "__init__.py"),
                                                          submodule_search_locations=list(folder))
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                for loaded in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
                    del sys.modules[loaded]
                raise
            _kernels = module
        return _kernels


def _patched_namespaces() -> list[Any]:
    namespaces = [_tl, _tl.core, _tl.math, _tl.tensor, _tl.dtype]
    for optional in ("condition", "tensor_descriptor_base"):
        if hasattr(_tl.core, optional):
            namespaces.append(getattr(_tl.core, optional))
    return namespaces


def _bfloat16_bits(data: numpy.ndarray) -> numpy.ndarray:
    """bfloat16 bits of ``data`` rounded to nearest even, as c10::BFloat16 and GPUs round (NaN
    stays NaN); float64 goes through float32 first, as in torch."""
    bits = numpy.asarray(data, dtype=numpy.float32).view(numpy.uint32)
    bias = ((bits >> numpy.uint32(16)) & numpy.uint32(1)) + numpy.uint32(0x7FFF)
    rounded = ((bits + bias) >> numpy.uint32(16)).astype(numpy.uint16)
    nan = (bits & numpy.uint32(0x7FFFFFFF)) > numpy.uint32(0x7F800000)
    return numpy.where(nan, numpy.uint16(0x7FC0), rounded)


def _rounding_cast(original: Any) -> Any:
    """The builder's cast, except that narrowing to bfloat16 rounds to nearest even: Triton 3.9's
    interpreter truncates float32 (GPUs and torch round), which biased bfloat16 results on CPU
    tensors, and casts float64 to bfloat16's bits as to an integer (1.0 became 9.2e-41)."""

    def cast(src: Any, dst_type: Any) -> Any:
        if dst_type.scalar == _tl.bfloat16 and src.dtype.scalar in (_tl.float32, _tl.float64):
            return _interpreter.TensorHandle(_bfloat16_bits(src.data), _tl.bfloat16)
        return original(src, dst_type)

    return cast


def _boolean_compare(original: Any) -> Any:
    """The builder's comparison, its result typed as the bool it holds: Triton's interpreter
    (3.2 to 3.9) types it as its operands, so a scalar comparison broadcast to a block (``n >=
    4`` joining a block mask, the split kernels' aligned edges) came out as their type, an int32
    mask that masked loads refuse (a float one would be 1.0 and 0.0)."""

    def compare(lhs: Any, rhs: Any) -> Any:
        result = original(lhs, rhs)
        return _interpreter.TensorHandle(result.data.astype(numpy.bool_), _tl.int1)

    return compare


class _GivenMask(_tl.core.tensor):
    """A mask that was given: true as a truth value, whatever it holds."""

    def __bool__(self) -> bool:
        return True


def _mask_given(original: Any, mask_at: int) -> Any:
    """``original`` (a ``triton.language.semantic`` function whose argument ``mask_at`` is a
    store's or an atomic's mask) seeing a given mask as given: Triton 3.2 asks ``if not mask``
    where it means ``is None``, and the interpreter answers that from the mask's values, so a
    one-element mask that holds nowhere stored (or added) anyway. A split row's arrival counter,
    reset by ``mask=last``, was reset by every chunk and no chunk was ever last."""

    def given(*args: Any, **kwargs: Any) -> Any:
        mask = args[mask_at]
        if isinstance(mask, _tl.core.tensor):
            mask = _GivenMask(mask.handle, mask.type)
            args = (*args[:mask_at], mask, *args[mask_at + 1:])
        return original(*args, **kwargs)

    return given


@functools.lru_cache(maxsize=None)
def _semantic_patches() -> tuple[tuple[str, int], ...]:
    """The semantic functions whose mask test is a truth value (Triton 3.2), and where their mask
    is: found by their source, so that a Triton that tests ``is None`` is left alone."""
    import inspect

    semantic = getattr(_tl, "semantic", None)
    found = []
    for name, mask_at in (("_store_legacy", 2), ("atom_red_typechecking_impl", 2)):
        function = getattr(semantic, name, None)
        if function is not None and "if not mask:" in inspect.getsource(function):
            found.append((name, mask_at))
    return tuple(found)


def _builder_patches(builder: Any) -> dict[str, Any]:
    """What one launch replaces on the interpreter's builder, by attribute: the cast
    (``_rounding_cast``) and every comparison (``_boolean_compare``)."""
    patches = {}
    if hasattr(builder, "cast_impl"):
        patches["cast_impl"] = _rounding_cast(builder.cast_impl)
    for name in dir(type(builder)):
        if name.startswith(("create_icmp", "create_fcmp")):
            patches[name] = _boolean_compare(getattr(builder, name))
    return patches


def _patching_once(original: Any) -> Any:
    """The interpreter's ``_patch_lang``, run once a launch for each set of language modules a
    function sees: Triton (3.2 to 3.9) runs it again at every call of a device function, about a
    millisecond each, which is most of an interpreted launch of kernels built from many small
    functions (the split kernels: 0.3 s an item). Patching again changes nothing: what it
    patched stays patched until the launch ends (``restored_language``)."""
    done: dict[frozenset[int], Any] = {}
    keys: dict[int, frozenset[int]] = {}

    def patch(fn: Any) -> Any:
        key = keys.get(id(fn.__globals__))
        if key is None:
            key = keys[id(fn.__globals__)] = frozenset(
                id(value) for value in fn.__globals__.values() if value is _tl or value is _tl.core)
        if key not in done:
            done[key] = original(fn)
        return done[key]

    return patch


def language_unpatched() -> _Hold:
    """Held while a GPU kernel compiles: an interpreted launch in another thread patches
    ``triton.language`` for its duration, which a compile must not see. Compiles share it."""
    return _LANGUAGE.shared


@contextlib.contextmanager
def restored_language() -> Iterator[None]:
    """Run one interpreted launch: alone (see :class:`_LanguageLock`), with bfloat16 rounded as on a
    GPU and comparisons typed as bools (``_builder_patches``), and with every attribute of the
    interpreter-patched namespaces put back as it was on entry."""
    with _LANGUAGE.alone:
        saved = [(ns, dict(vars(ns))) for ns in _patched_namespaces()]
        semantic = getattr(_tl, "semantic", None)
        if _semantic_patches():
            saved.append((semantic, dict(vars(semantic))))
            for name, mask_at in _semantic_patches():
                setattr(semantic, name, _mask_given(getattr(semantic, name), mask_at))
        builder = getattr(_interpreter, "interpreter_builder", None)
        patches = _builder_patches(builder) if builder is not None else {}
        own = {name: vars(builder).get(name, _MISSING) for name in patches}
        # Attributes of the instance, for this launch only: Triton's class stays as it is.
        for name, patch in patches.items():
            setattr(builder, name, patch)
        patch_lang = getattr(_interpreter, "_patch_lang", None)
        if patch_lang is not None:
            _interpreter._patch_lang = _patching_once(patch_lang)
        try:
            yield
        finally:
            if patch_lang is not None:
                _interpreter._patch_lang = patch_lang
            for name, before in own.items():
                if before is _MISSING:
                    delattr(builder, name)
                else:
                    setattr(builder, name, before)
            for namespace, before in saved:
                now = vars(namespace)
                for name in [n for n in now if n not in before]:
                    delattr(namespace, name)
                for name, value in before.items():
                    if now.get(name, _MISSING) is not value:
                        setattr(namespace, name, value)


_MISSING = object()
