"""CPU tensors from several threads at once. Triton's interpreter keeps a launch's state in
globals (its patches of ``triton.language``, the program index and grid of its one builder), so
interpreted launches must take turns; results are compared with torch's."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import portable_softmax as ps
from portable_softmax import launch

THREADS = 8
CALLS = 40
# A mix of grids and row widths, so that concurrent launches differ in what they would share.
SHAPES = [(1, 5), (64, 16), (3, 17), (300, 24), (2, 64)]


def _one_call(generator: torch.Generator, step: int) -> list[str]:
    """One forward (and every third step a backward) call on a small CPU tensor; what went wrong."""
    shape = SHAPES[step % len(SHAPES)]
    log = step % 2 == 1
    ours, theirs = (ps.log_softmax, torch.log_softmax) if log else (ps.softmax, torch.softmax)
    x = torch.randn(shape, generator=generator).requires_grad_(step % 3 == 0)
    y = ours(x, -1)
    expected = theirs(x, -1)
    problems = []
    if not torch.allclose(y, expected, rtol=1e-5, atol=1e-6):
        problems.append(f"{ours.__name__} {shape}: wrong forward result")
    if x.requires_grad:
        dy = torch.randn(shape, generator=generator)
        grad = torch.autograd.grad(y, x, dy)[0]
        if not torch.allclose(grad, torch.autograd.grad(expected, x, dy)[0], rtol=1e-5, atol=1e-6):
            problems.append(f"{ours.__name__} {shape}: wrong gradient")
    return problems


def test_interpreted_calls_from_many_threads(monkeypatch):
    """8 threads x 40 calls. Grids of 8 programs (more than the interpreter's plans use) widen each
    launch's window for another thread to move the shared program index: before launches took
    turns this failed nearly every run, mostly with silently wrong rows."""
    monkeypatch.setenv(launch.PROGRAMS_ENV, "8")
    for step in range(len(SHAPES) * 2):  # prepare every launch once, outside the race
        _one_call(torch.Generator().manual_seed(step), step)
    problems: list[str] = []
    start = threading.Barrier(THREADS)

    def work(index: int) -> None:
        generator = torch.Generator().manual_seed(index)
        start.wait()
        for step in range(CALLS):
            try:
                problems.extend(_one_call(generator, index + step))
            except Exception as error:  # every failure is a result to report
                problems.append(f"{type(error).__name__}: {str(error)[:200]}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not problems, f"{len(problems)} of {THREADS * CALLS} calls went wrong, e.g. {sorted(set(problems))[:5]}"


_FIRST_CALLS = textwrap.dedent("""
    import threading
    import torch
    import portable_softmax as ps

    THREADS = 8
    start = threading.Barrier(THREADS)
    problems = []

    def work(index):
        generator = torch.Generator().manual_seed(index)
        start.wait()
        for step in range(3):
            x = torch.randn(3 + index, 17 + step, generator=generator)
            try:
                ok = torch.allclose(ps.log_softmax(x, -1), torch.log_softmax(x, -1), rtol=1e-5, atol=1e-6)
                if not ok:
                    problems.append("wrong result")
            except Exception as error:
                problems.append(f"{type(error).__name__}: {str(error)[:200]}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(len(problems), sorted(set(problems))[:3])
    raise SystemExit(1 if problems else 0)
""")


def test_first_interpreted_calls_come_from_many_threads_at_once():
    """A fresh process whose first CPU calls come from 8 threads at once: the interpreted kernels
    are loaded (and their functions rewritten) while other threads launch."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.path.dirname(os.path.dirname(ps.__file__)),
                                                                     os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", _FIRST_CALLS], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
