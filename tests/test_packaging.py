"""Packaging: the license the metadata names is shipped, no extra replaces the user's torch, and
every package the library imports is declared (or is a peer or vendor package, said why)."""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

# Imported by the library but rightly not declared: Triton comes from the vendor (its distribution
# name differs per vendor; see pyproject.toml); the bench's peers are timed only when installed.
VENDOR = {"triton"}
PEERS = {"liger_kernel", "flag_gems", "quack"}


def _name(requirement: str) -> str:
    """The normalized distribution name of a requirement string (PEP 503)."""
    return re.sub(r"[-_.]+", "-", re.match(r"\s*([A-Za-z0-9._-]+)", requirement).group(1)).lower()


def test_the_license_the_metadata_names_is_shipped():
    assert PROJECT["license"] == "MIT"
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "Permission is hereby granted, free of charge" in text
    assert re.search(r"Copyright \(c\) \d{4} ", text)


def test_no_extra_replaces_the_users_torch():
    """torch and torch_npu (each torch_npu release requires one torch) come from the user's
    vendor: an extra naming either would let pip replace the torch in place."""
    for extra, requirements in PROJECT["optional-dependencies"].items():
        named = {_name(r) for r in requirements} & {"torch", "torch-npu"}
        assert not named, f"extra [{extra}] asks for {sorted(named)}"


def _third_party_imports() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in (ROOT / "portable_softmax").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "portable_softmax":
                    found.setdefault(top, set()).add(path.name)
    return found


@pytest.mark.skipif(not hasattr(sys, "stdlib_module_names"), reason="Python < 3.10")
def test_every_import_is_declared():
    declared = {_name(r) for r in PROJECT["dependencies"]}
    declared |= {_name(r) for extra in PROJECT["optional-dependencies"].values() for r in extra}
    undeclared = {module: sorted(files) for module, files in _third_party_imports().items()
                  if module not in VENDOR | PEERS and _name(module) not in declared}
    assert not undeclared, f"imported but declared in no dependency or extra: {undeclared}"


def test_bench_runs_without_tqdm(monkeypatch):
    """tqdm is an extra: without it the bench walks its cases with no bar."""
    from portable_softmax import bench

    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm now raises ImportError
    cases = [(1, 2), (3, 4)]
    assert list(bench._progress(cases, enabled=True)) == cases
