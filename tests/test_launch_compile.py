"""The compile door (``launch_compile._compiled_resources``) and the lock a compile holds on
``triton.language``, with a stand-in for Triton's JIT function: a binary asked for from two threads
compiles once, a failed compile is made again by the next asker (which raises it), and compiles of
two binaries run at once (what ``compile_ahead`` relies on), while an interpreted launch still
runs alone."""
from __future__ import annotations

import itertools
import subprocess
import sys
import threading
import time
import types

import pytest
import torch

from portable_softmax import launch_compile
from portable_softmax.backend import get_backend
from portable_softmax.interpreter import _LanguageLock, language_unpatched, restored_language

CUDA = get_backend("cuda")  # compiles (not interpreted); nothing here reaches a driver
_names = itertools.count()


class Compiled:
    """What ``_compiled_resources`` reads of a compiled kernel."""

    n_regs, n_spills, asm = 40, 0, {}
    metadata = types.SimpleNamespace(shared=0)

    def _init_handles(self) -> None:
        pass


class Kernel:
    """Stands for a JIT function: its warmup (the compile) takes ``seconds``, notes itself, waits
    for ``meet`` (another compile running) where given, and raises where ``fail`` says."""

    def __init__(self, seconds: float = 0.0, fail: int = 0, meet: threading.Event = None,
                 started: threading.Event = None) -> None:
        # A name of its own: the door's cache is the process's.
        self.fn = types.SimpleNamespace(__name__=f"stand_in_{next(_names)}")
        self.seconds, self.fail, self.meet, self.started = seconds, fail, meet, started
        self.compiles, self.met = 0, None

    def warmup(self, *args, grid, **options) -> Compiled:
        self.compiles += 1
        if self.started is not None:
            self.started.set()
        if self.meet is not None:
            self.met = self.meet.wait(10)
        time.sleep(self.seconds)
        if self.compiles <= self.fail:
            raise RuntimeError(f"compile {self.compiles} failed")
        return Compiled()


def _ask(kernel: Kernel):
    return launch_compile._compiled_resources(kernel, CUDA, torch.device("cpu"), (torch.empty(4), 7), {"BLOCK": 64},
                                              {"num_warps": 4})


def _in_thread(work) -> tuple[threading.Thread, list]:
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(work())
        except Exception as error:  # noqa: BLE001  (the test reads it)
            outcome.append(error)
    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def test_a_binary_asked_for_by_two_threads_compiles_once():
    started = threading.Event()
    kernel = Kernel(seconds=0.3, started=started)
    thread, outcome = _in_thread(lambda: _ask(kernel))
    assert started.wait(10)
    mine = _ask(kernel)  # asked while the other thread compiles it: waits, and finds it
    thread.join(10)
    assert kernel.compiles == 1 and outcome == [mine] and mine.registers == 40


def test_a_compile_that_failed_in_another_thread_is_made_again_and_raises_here():
    started = threading.Event()
    kernel = Kernel(seconds=0.2, fail=2, started=started)
    thread, outcome = _in_thread(lambda: _ask(kernel))
    assert started.wait(10)
    with pytest.raises(RuntimeError, match="compile 2 failed"):
        _ask(kernel)
    thread.join(10)
    assert isinstance(outcome[0], RuntimeError) and kernel.compiles == 2
    assert _ask(kernel).registers == 40 and kernel.compiles == 3


def test_two_binaries_compile_at_once():
    """Each compile waits for the other to be under way: taking turns, the first would wait in vain."""
    first_started, second_started = threading.Event(), threading.Event()
    first = Kernel(meet=second_started, started=first_started)
    second = Kernel(meet=first_started, started=second_started)
    thread, outcome = _in_thread(lambda: _ask(first))
    _ask(second)
    thread.join(10)
    assert first.met and second.met


def test_compile_ahead_runs_its_work_in_a_thread_of_its_own_and_drops_its_errors(monkeypatch):
    monkeypatch.setattr(launch_compile, "backend_for", lambda device: CUDA)
    monkeypatch.setattr(launch_compile, "device_record", lambda device: None)
    ran: list = []

    def work() -> None:
        ran.append(threading.current_thread().name)
        raise RuntimeError("the later call compiles again")
    thread = launch_compile.compile_ahead(torch.device("cpu"), work)
    thread.join(10)
    assert ran == [launch_compile.AHEAD_THREAD]
    # Nothing where nothing compiles.
    monkeypatch.setattr(launch_compile, "backend_for", lambda device: get_backend("interpreter"))
    assert launch_compile.compile_ahead(torch.device("cpu"), work) is None and len(ran) == 1


def test_the_process_exit_waits_for_a_compile_ahead(tmp_path):
    # A call may return before its compile ahead ends (the loss's stats and sum); a daemon thread
    # still in Triton's compiler when the interpreter exits aborted the process on the H200
    # ("FATAL: exception not rethrown", v39). Here the work outlives the script's last line.
    done = tmp_path / "done"
    script = f"""
import time, torch
from portable_softmax import launch_compile
from portable_softmax.backend import get_backend
launch_compile.backend_for = lambda device: get_backend("cuda")
launch_compile.device_record = lambda device: None
launch_compile._kernel_module = lambda backend: None
launch_compile.compile_ahead(torch.device("cpu"), lambda: (time.sleep(0.5), open({str(done)!r}, "w").close()))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert done.exists()


def _holding(hold, order: list, name: str) -> str:
    order.append(f"{name} asks")
    with hold:
        order.append(f"{name} holds")
    return name


@pytest.mark.parametrize("held, asked, asker, done", [(language_unpatched, restored_language, "launch", "compiled"),
                                                       (restored_language, language_unpatched, "compile", "launched")])
def test_an_interpreted_launch_waits_for_a_compile_and_a_compile_for_it(held, asked, asker, done):
    order: list = []
    with held():
        thread, _ = _in_thread(lambda: _holding(asked(), order, asker))
        time.sleep(0.2)
        order.append(done)
    thread.join(10)
    assert order == [f"{asker} asks", done, f"{asker} holds"]


def test_the_language_lock_is_reentrant_for_its_holder():
    lock = _LanguageLock()
    with lock.alone, lock.alone, lock.shared, lock.shared:
        pass
    order: list = []
    with lock.shared, lock.shared:
        thread, outcome = _in_thread(lambda: _holding(lock.shared, order, "another compile"))
        thread.join(10)
    assert outcome == ["another compile"]
