"""The tuning row in force for a device: each backend brings its own rows (``Backend.tuning``,
the built-in ones in ``vendors.py`` beside their occupancy rules), and ``TUNING`` sets rows over
them by ``(backend, key)``, the key a device name, an architecture, or ``"*"`` for the backend's
default. The defaults (``record.Tuning``) were chosen from the H200 sweep recorded in
``benchmarks/NOTES.md``; a new target gets its backend's defaults until someone measures it.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace  # noqa: F401  (tests and sweeps derive rows with tuning.replace)
from typing import Any

from portable_softmax.backend import registered_backends
from portable_softmax.record import DeviceRecord, Tuning, both_directions  # noqa: F401  (re-exported)


_DEFAULT = Tuning()


def _own_rows(backend: str) -> Mapping[str, Tuning]:
    return getattr(registered_backends().get(backend), "tuning", None) or {}


class TuningTable(dict):
    """Rows set by ``(backend, arch)`` over the backends' own (sweeps, tests, a user's override):
    a dict that tells its observers of every change, so that what was planned from it
    (``launch``'s records) is planned again. Reading a key it does not hold gives the backend's
    own row for it (``Backend.tuning``)."""

    def __init__(self, rows: Mapping[tuple[str, str], Tuning]) -> None:
        super().__init__(rows)
        self._observers: list[Callable[[], None]] = []

    def __missing__(self, key: tuple[str, str]) -> Tuning:
        backend, arch = key
        found = _own_rows(backend).get(arch)
        if found is None:
            raise KeyError(key)
        return found

    def on_change(self, observer: Callable[[], None]) -> None:
        self._observers.append(observer)

    def _changed(self) -> None:
        for observer in self._observers:
            observer()

    def __setitem__(self, key: tuple[str, str], value: Tuning) -> None:
        super().__setitem__(key, value)
        self._changed()

    def __delitem__(self, key: tuple[str, str]) -> None:
        super().__delitem__(key)
        self._changed()

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        self._changed()

    def pop(self, *args: Any) -> Any:
        found = super().pop(*args)
        self._changed()
        return found


TUNING = TuningTable({})


def tuning_for(record: DeviceRecord) -> Tuning:
    """The row in force for ``record``: the table's for its device name, its architecture or its
    backend, else the backend's own rows (``Backend(tuning=...)``) for the same three, else the
    defaults. A row by name serves chips of one architecture that differ in what the planner
    does not see (the H200 is an H100 with 1.4 times the memory bandwidth)."""
    keys = (record.name, record.arch, "*")
    for key in keys:
        found = TUNING.get((record.backend, key))
        if found is not None:
            return found
    own = _own_rows(record.backend)
    for key in keys:
        if key in own:
            return own[key]
    return _DEFAULT
