"""A cold first call's host work moved beside other host work (``compat``, issue 34 item 4):
Triton's compiler key computed in a thread from the device layer's first use of a driver, once a
process; a kernel's launcher (a C module per signature, Triton 3.2 and 3.6) built in a thread
beside its compile, for this package's kernels only, from the source Triton's own launcher makes
after the compile. The real launchers' sources are compared by cross-compiling on the CPU under
Triton 3.2 and 3.6 (nothing is built with gcc here); under 3.9 there is none to build."""
from __future__ import annotations

import functools
import importlib
import logging
import threading
import time
import types

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from portable_softmax import compat, device


def _add_one(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) + 1, mask=offsets < n)


def _kernel() -> JITFunction:
    """A JIT function of its own (a test changes its class)."""
    return triton.jit(_add_one)


def make_launcher(*args):
    """What a Triton driver module with launchers per signature holds: the launchers below, whose
    module this is, count as such."""
    raise AssertionError("the launcher class is what is called")


def _launcher_of(driver: type) -> type:
    """The launcher class of a Triton driver class, from its module's globals (Triton 3.2 loads its
    backends' drivers outside sys.modules)."""
    return next(value for name, value in driver.__init__.__globals__.items()
                if name.endswith("Launcher") and isinstance(value, type))


def _set_active(monkeypatch, driver) -> None:
    config = triton.runtime.driver
    monkeypatch.setattr(config, "_active" if "_active" in vars(config) else "active", driver)


# Triton's compiler key


@pytest.fixture
def no_key_thread(monkeypatch):
    monkeypatch.setattr(compat, "_key_thread", None)


def test_the_compiler_key_is_computed_once_in_a_thread_of_its_own(monkeypatch, no_key_thread):
    calls = []

    def key():
        calls.append(threading.current_thread().name)
        time.sleep(0.05)
        return "key"
    monkeypatch.setattr(compat, "_triton_key", lambda: key)
    askers = [threading.Thread(target=compat.compiler_key_ahead) for _ in range(4)]
    for asker in askers:
        asker.start()
    compat.compiler_key_ahead()
    for asker in askers:
        asker.join()
    compat.wait_compiler_key()
    assert calls == [compat.KEY_THREAD]
    compat.compiler_key_ahead()
    compat.wait_compiler_key()
    assert len(calls) == 1


def test_the_compiler_key_never_raises(monkeypatch, no_key_thread, caplog):
    def failing():
        raise RuntimeError("no sources to hash")
    monkeypatch.setattr(compat, "_triton_key", lambda: failing)
    with caplog.at_level(logging.DEBUG, logger=compat.__name__):
        compat.compiler_key_ahead()
        compat.wait_compiler_key()
    assert "the first compile computes it" in caplog.text

    class NoThread(threading.Thread):
        def start(self):
            raise RuntimeError("can't start new thread")
    monkeypatch.setattr(compat, "_key_thread", None)
    monkeypatch.setattr(compat.threading, "Thread", NoThread)
    compat.compiler_key_ahead()
    compat.wait_compiler_key()  # a thread never started is not waited for


def test_the_compiler_key_is_the_one_the_compile_reads():
    key = compat._triton_key()
    composer = (getattr(importlib.import_module("triton.runtime.cache"), "get_cache_key", None)
                or importlib.import_module("triton.compiler.compiler").compile)
    assert composer.__globals__["triton_key"] is key
    assert hasattr(key, "cache_info")  # cached for the process: computed ahead, found by the compile


def test_the_device_layer_starts_the_key_for_a_driver_only(monkeypatch):
    started = []
    monkeypatch.setattr(compat, "compiler_key_ahead", lambda: started.append(True))
    device.device_record("cpu")  # interpreted: no driver
    assert started == []
    fake = types.SimpleNamespace()
    _set_active(monkeypatch, fake)
    assert device._active_driver() is fake
    assert started == [True]


# The launcher beside the compile


def _launcher_class(built: list, seconds: float = 0.0, fail: bool = False, met: threading.Event = None) -> type:
    class Launcher:
        """A driver's launcher class: made from the compiled kernel's source and metadata."""

        def __init__(self, src, metadata):
            if met is not None:
                met.set()
            time.sleep(seconds)
            if fail:
                raise RuntimeError("gcc failed")
            built.append((threading.current_thread().name, src, metadata.warp_size, metadata.tensordesc_meta))
    return Launcher


def test_only_this_packages_kernels_build_their_launcher_beside(monkeypatch):
    _set_active(monkeypatch, types.SimpleNamespace(launcher_cls=_launcher_class([])))
    ours, also_ours, theirs = _kernel(), _kernel(), _kernel()
    compat.launcher_beside_compile(ours)
    beside = type(ours)
    compat.launcher_beside_compile(ours)
    compat.launcher_beside_compile(also_ours)
    assert type(ours) is beside and type(also_ours) is beside and beside.__bases__ == (JITFunction,)
    assert isinstance(ours, JITFunction) and type(ours).__name__ == "JITFunction"
    assert type(theirs) is JITFunction and "compile" not in vars(JITFunction)
    stand_in = types.SimpleNamespace(fn=_add_one)
    compat.launcher_beside_compile(stand_in)
    assert type(stand_in) is types.SimpleNamespace


def test_nothing_changes_where_triton_builds_no_launcher_per_signature(monkeypatch):
    module: dict = {}  # a driver module without make_launcher: Triton 3.9's
    exec("class Launcher:\n    def __init__(self, src, metadata):\n        pass", module)
    _set_active(monkeypatch, types.SimpleNamespace(launcher_cls=module["Launcher"]))
    kernel = _kernel()
    compat.launcher_beside_compile(kernel)
    assert type(kernel) is JITFunction


@pytest.mark.parametrize("backend", ["nvidia", "amd"])
def test_the_installed_tritons_drivers_are_told_apart(monkeypatch, backend):
    from triton.backends import backends

    release = (compat.TRITON_VERSION.major, compat.TRITON_VERSION.minor)
    if release not in ((3, 2), (3, 6), (3, 9)) or backend not in backends:
        pytest.skip(f"Triton {triton.__version__}: its drivers were not read")
    launcher = _launcher_of(backends[backend].driver)
    _set_active(monkeypatch, types.SimpleNamespace(launcher_cls=launcher))
    assert compat._per_signature_launcher() == (release < (3, 9))
    profiler = {"init": launcher.__init__}  # a wrapper from a module without make_launcher
    exec("def init(*args, **kwargs):\n    return profiler_init(*args, **kwargs)", profiler)
    profiler["profiler_init"] = launcher.__init__
    monkeypatch.setattr(launcher, "__init__", functools.wraps(launcher.__init__)(profiler["init"]))
    assert compat._per_signature_launcher() == (release < (3, 9))  # under a profiler's wrapper too


def test_the_launcher_is_built_beside_the_compile_and_joined_before_it_returns(monkeypatch):
    built, met = [], threading.Event()
    _set_active(monkeypatch, types.SimpleNamespace(launcher_cls=_launcher_class(built, seconds=0.2, met=met)))
    kernel = _kernel()
    compat.launcher_beside_compile(kernel)
    waited = []

    def compile(src, target=None, options=None):
        waited.append(met.wait(10))  # the launcher's build started while this compile runs
        return ("compiled", src)

    kernel.compile = compile  # as Triton's create_binder sets it, for a device
    src = types.SimpleNamespace(name="add_one")
    assert kernel.compile(src, target="target", options={"warp_size": 64, "num_warps": 4}) == ("compiled", src)
    assert waited == [True]
    assert built == [(f"{compat.LAUNCHER_THREAD} add_one", src, 64, None)]  # joined: built when it returned
    kernel.compile = lambda src, **_: "another device's"  # set again: a second device's binder
    assert kernel.compile(src, options={}) == "another device's" and len(built) == 2


def test_a_failed_launcher_build_leaves_the_compile_as_it_was(monkeypatch, caplog):
    _set_active(monkeypatch, types.SimpleNamespace(launcher_cls=_launcher_class([], fail=True)))
    kernel = _kernel()
    compat.launcher_beside_compile(kernel)
    kernel.compile = lambda src, **_: "compiled"
    with caplog.at_level(logging.DEBUG, logger=compat.__name__):
        assert kernel.compile(types.SimpleNamespace(name="add_one"), options={}) == "compiled"
    assert "Triton builds it after the compile" in caplog.text

    def failing(src, **_):
        raise ValueError("the compile's own error")
    kernel.compile = failing
    with pytest.raises(ValueError, match="the compile's own error"):
        kernel.compile(types.SimpleNamespace(name="add_one"), options={})


class _Device:
    """Triton's active driver as its JIT and compiled kernels use it, with the installed Triton's
    own launcher class, for a target compiled on the CPU."""

    def __init__(self, target, launcher_cls) -> None:
        self.target, self.launcher_cls = target, launcher_cls

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device) -> int:
        return 0

    def get_current_target(self):
        return self.target


@pytest.mark.parametrize("target", [("nvidia", "cuda", 90, 32), ("amd", "hip", "gfx942", 64)], ids=["cuda", "hip"])
def test_the_launcher_built_beside_is_the_one_triton_builds_after_the_compile(monkeypatch, tmp_path, target):
    from triton.backends import backends
    from triton.backends.compiler import GPUTarget

    name, *target = target
    launcher = _launcher_of(backends[name].driver)
    module = launcher.__init__.__globals__  # the driver's module
    if "make_launcher" not in module:
        pytest.skip(f"Triton {triton.__version__} builds no launcher per signature")
    sources = []

    def build(*args, **kwargs):  # Triton's C module build, recording its source instead of running gcc
        sources.append((threading.current_thread().name, kwargs["src"] if "src" in kwargs else args[0]))
        return types.SimpleNamespace(launch=None)
    monkeypatch.setitem(module, "compile_module_from_src", build)
    # What a launcher's build asks of the machine: where libcuda is (ldconfig), where libamdhip64 is.
    for lookup, answer in (("library_dirs", []), ("_get_path_to_hip_runtime_dylib", "/opt/rocm/lib/libamdhip64.so")):
        if lookup in module:
            monkeypatch.setitem(module, lookup, lambda answer=answer: answer)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    _set_active(monkeypatch, _Device(GPUTarget(*target), launcher))
    kernel = _kernel()
    compat.launcher_beside_compile(kernel)
    # Through Triton's JIT: its binder sets the kernel's compile, its compile is given the source.
    compiled = kernel.warmup(torch.empty(64), 64, BLOCK=64, grid=(1,), num_warps=4)
    assert [thread for thread, _ in sources] == [f"{compat.LAUNCHER_THREAD} _add_one"]
    launcher(compiled.src, compiled.metadata)  # what the compiled kernel's _init_handles builds
    assert len(sources) == 2 and sources[0][1] == sources[1][1]
