"""Packaging: the license the metadata names is shipped, no extra replaces the user's torch,
every package the library imports is declared (or is a peer or vendor package, said why), and the
built wheel carries the metadata pip shows and the typing marker."""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

# Imported by the library but rightly not declared: Triton comes from the vendor (its distribution
# name differs per vendor; see pyproject.toml); the bench's peers are timed only when installed.
VENDOR = {"triton"}
PEERS = {"liger_kernel", "flag_gems", "quack", "cut_cross_entropy"}


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


def _built_wheel(tmp_path: Path) -> zipfile.ZipFile:
    """The wheel pip builds from a copy of the project (offline, with the setuptools installed
    here: the copy keeps build files out of the checkout)."""
    pytest.importorskip("setuptools")
    source = tmp_path / "source"
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "portable_softmax", source / "portable_softmax",
                    ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                    "-w", str(tmp_path / "wheel"), str(source)], check=True, capture_output=True, timeout=600)
    (wheel,) = (tmp_path / "wheel").glob("portable_softmax-*.whl")
    return zipfile.ZipFile(wheel)


def test_the_wheel_carries_the_metadata_pip_shows(tmp_path):
    """What pip shows and installs: the license as an SPDX expression with its file, authors,
    classifiers that agree with requires-python and the typing marker, no invented project URLs,
    and ``py.typed`` inside the package (PEP 561), with the recorded profiles and the tables of
    known kernel resources."""
    wheel = _built_wheel(tmp_path)
    names = wheel.namelist()
    (metadata_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    fields: dict[str, list[str]] = {}
    for line in wheel.read(metadata_name).decode().split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(": ")
        fields.setdefault(key, []).append(value)
    assert fields["License-Expression"] == ["MIT"] and fields["License-File"] == ["LICENSE"]
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert fields["Author"] == [author["name"] for author in PROJECT["authors"]]
    classifiers = set(fields["Classifier"])
    assert {"Programming Language :: Python :: 3 :: Only", "Typing :: Typed"} <= classifiers
    # PEP 639: with a license expression, license classifiers are refused; the expression is the license.
    assert not any(c.startswith("License ::") for c in classifiers)
    minimum = tuple(int(part) for part in PROJECT["requires-python"].removeprefix(">=").split("."))
    for classifier in classifiers:
        version = re.fullmatch(r"Programming Language :: Python :: (\d+)\.(\d+)", classifier)
        assert version is None or tuple(map(int, version.groups())) >= minimum, classifier
    assert "Project-URL" not in fields and "Home-page" not in fields
    assert "portable_softmax/py.typed" in names
    assert any(n.startswith("portable_softmax/profiles/") and n.endswith(".json") for n in names)
    assert any(n.startswith("portable_softmax/kernel_resources/") and n.endswith(".json") for n in names)


def test_the_readme_keeps_its_two_commands_and_tells_cpu_users_where_torch_is():
    """CI runs the README's two commands as written (they reach only the ordinary index); a
    CPU-only user is told where the CPU build of torch is (PyPI's Linux torch is the CUDA one)."""
    readme = (ROOT / "README.md").read_text()
    assert 'pip install torch==2.13.0 && pip install -e ".[cpu,test]" && portable-softmax\n' in readme
    assert "python -m pytest tests -q\n" in readme
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu\n" in readme
    assert '"portable-softmax[' not in readme  # no index has it: extras install from a checkout
