"""Probe variants of the kernel package: a copy of ``portable_softmax/kernels/`` with lines of its
modules replaced, loaded as a package of its own (compiled, as the library's are) for
``launch._kernel_module`` to return. Measurement only: most variants give wrong outputs.

    from kernel_variant import edited_kernels, load_kernels
"""
from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

KERNELS = Path(__file__).resolve().parents[2] / "portable_softmax" / "kernels"


def load_kernels(folder: Path | str, name: str) -> ModuleType:
    """The kernel package in ``folder`` (a copy of ``portable_softmax/kernels/``), as ``name``."""
    folder = Path(folder)
    spec = importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before its modules' relative imports
    spec.loader.exec_module(module)
    return module


def edited_kernels(name: str, edits: dict[str, list[tuple[str, str]]], folder: Path | str) -> ModuleType:
    """The kernel package with each ``(old, new)`` of ``edits[module]`` replaced in that module
    (``"split"`` for ``split.py``), loaded from ``folder/name``. Exits naming the module if its
    text no longer holds ``old``."""
    target = Path(folder) / name
    shutil.copytree(KERNELS, target, ignore=shutil.ignore_patterns("__pycache__"))
    for module, replacements in edits.items():
        path = target / f"{module}.py"
        source = path.read_text()
        for old, new in replacements:
            if old not in source:
                raise SystemExit(f"{name}: kernels/{module}.py no longer holds the text this probe edits")
            source = source.replace(old, new)
        path.write_text(source)
    return load_kernels(target, f"portable_softmax_probe_{name}")
