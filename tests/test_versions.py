"""The supported Python, torch and Triton versions: declared in pyproject.toml, checked when the
package is imported (``portable_softmax.compat``), with one message naming what was found and
what is needed."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from portable_softmax import compat

ROOT = Path(__file__).resolve().parent.parent


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _lower_bound(requirements: list[str], name: str) -> str:
    """The ``>=`` bound of ``name`` in a list of requirement strings; fails if absent or pinned."""
    found = [r for r in requirements if re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() == name]
    assert len(found) == 1, f"{name}: {found}"
    spec = found[0][len(name):].replace(" ", "")
    assert re.fullmatch(r">=[0-9.]+", spec), f"{found[0]}: a lower bound only (a pin or cap could replace a vendor's build)"
    return spec[2:]


def test_pyproject_declares_the_versions_checked_at_import():
    project = _pyproject()["project"]
    assert project["requires-python"] == ">=" + ".".join(map(str, compat.MIN_PYTHON))
    assert _lower_bound(project["dependencies"], "torch") == str(compat.MIN_TORCH)
    extras = project["optional-dependencies"]
    for extra in ("cpu", "cuda"):
        assert _lower_bound(extras[extra], "triton") == str(compat.MIN_TRITON), extra
    assert _lower_bound(extras["ascend"], "triton-ascend") == str(compat.MIN_TRITON)
    # ROCm's Triton comes with its torch (pytorch-triton-rocm): asking for one could replace it.
    assert not any("triton" in r for r in extras["rocm"])


def test_the_versions_here_pass():
    import torch
    import triton

    assert compat.requirement_problems(sys.version_info, torch.__version__, triton.__version__) == []


@pytest.mark.parametrize("python, torch, triton, expected", [
    ((3, 9, 0), "2.6.0", "3.2.0", []),
    ((3, 13, 1), "2.13.0+cpu", "3.9.0", []),
    # Vendor builds: local labels, pre-releases of a supported release, or a version that does not parse.
    ((3, 11, 7), "2.8.0a0+5228986c39.nv25.06", "3.3.0+git96316ce5", []),
    ((3, 11, 7), "2.6.0a0+ecf3bae40a", "3.2.0rc4", []),
    ((3, 11, 7), "2.7.1", "unknown", []),
    ((3, 8, 18), "2.6.0", "3.2.0", ["Python 3.8.18 found, 3.9 or newer needed"]),
    ((3, 11, 7), "2.5.1+cu124", "3.1.0", ["torch 2.5.1+cu124 found, 2.6 or newer needed",
                                           "Triton 3.1.0 found, 3.2 or newer needed"]),
    ((3, 11, 7), "2.6.0", None, ["Triton is not installed, 3.2 or newer needed"]),
    ((3, 11, 7), None, "3.2.0", ["torch is not installed, 2.6 or newer needed"]),
])
def test_requirement_problems(python, torch, triton, expected):
    assert compat.requirement_problems(python, torch, triton) == expected


def _import_error(tmp_path: Path, fakes: dict, prelude: str = "") -> str:
    """The last line a fresh interpreter prints importing the package with fake ``torch`` /
    ``triton`` modules of the given versions ahead of the real ones."""
    for name, version in fakes.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"__version__ = {version!r}\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    result = subprocess.run([sys.executable, "-c", f"{prelude}import portable_softmax"], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode != 0, result.stdout
    return result.stderr.strip().splitlines()[-1]


def test_an_old_triton_is_refused_at_import_naming_both_versions(tmp_path):
    line = _import_error(tmp_path, {"triton": "3.1.0"})
    assert line.startswith("ImportError: portable_softmax needs Python >= 3.9, torch >= 2.6 and Triton >= 3.2")
    # Only what is wrong: the real torch here is new enough.
    assert ": Triton 3.1.0 found, 3.2 or newer needed. To fix:" in line


def test_old_torch_and_triton_are_named_in_one_message(tmp_path):
    line = _import_error(tmp_path, {"torch": "2.5.1", "triton": "3.0.0"})
    assert "torch 2.5.1 found, 2.6 or newer needed; Triton 3.0.0 found, 3.2 or newer needed" in line


def test_a_missing_triton_says_how_to_install_one(tmp_path):
    line = _import_error(tmp_path, {}, prelude="import sys; sys.modules['triton'] = None; ")
    assert "Triton is not installed, 3.2 or newer needed" in line
    # From where: PyPI's triton, or the extra from a checkout (no index has portable-softmax[cpu]).
    assert '`pip install "triton>=3.2"`' in line and '`pip install -e ".[cpu]"`' in line
    assert '"portable-softmax[' not in line and "pytorch-triton-rocm" in line and "triton-ascend" in line
    assert "torch from PyPI" not in line  # only what is missing


def _missing_triton(tmp_path: Path) -> dict:
    """An environment in which ``import triton`` fails as where it is not installed."""
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'triton'\", name='triton')\n")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))


@pytest.mark.parametrize("how", ["console_script", "python_m"])
def test_the_command_without_triton_prints_one_line(tmp_path, how):
    """``portable-softmax`` (pip's console script, copied here as pip writes it) and ``python -m
    portable_softmax`` without Triton: one line naming what to install from where, exit status 1,
    no traceback."""
    if how == "python_m" and sys.version_info < (3, 10):
        pytest.skip("sys.orig_argv (Python 3.10+) tells python -m apart")
    script = tmp_path / "bin" / compat.COMMAND
    script.parent.mkdir()
    script.write_text("import sys\nfrom portable_softmax.cli import main\nif __name__ == '__main__':\n"
                      "    sys.argv[0] = sys.argv[0].removesuffix('.exe')\n    sys.exit(main())\n")
    command = [str(script), "info"] if how == "console_script" else ["-m", "portable_softmax", "info"]
    result = subprocess.run([sys.executable, *command], capture_output=True, text=True, env=_missing_triton(tmp_path),
                            cwd=tmp_path, timeout=300)
    assert result.returncode == 1 and not result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("portable-softmax: portable_softmax needs") and '`pip install "triton>=3.2"`' in lines[0]


def test_a_library_import_without_triton_still_raises_import_error(tmp_path):
    """Code importing the package (not the command) gets the ImportError, which it can catch."""
    result = subprocess.run([sys.executable, "-c", "import portable_softmax"], capture_output=True, text=True,
                            env=_missing_triton(tmp_path), cwd=tmp_path, timeout=300)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("ImportError: portable_softmax needs")


def test_the_c_launch_is_taken_only_where_measured(monkeypatch):
    # Triton 3.6's CUDA launcher object is bypassed for its C launch only there (the version and
    # driver measured, NOTES v51) and only for a binary that asks for no scratch, which the
    # launcher object would allocate.
    class CudaLauncher:
        global_scratch_size = profile_scratch_size = 0

        def launch(self, *args):
            pass

    found = CudaLauncher()
    monkeypatch.setattr(compat, "C_LAUNCH", True)
    assert compat._c_launch(found) == found.launch
    for size in ("global_scratch_size", "profile_scratch_size"):
        scratched = CudaLauncher()
        setattr(scratched, size, 256)
        assert compat._c_launch(scratched) is None, size

    class HIPLauncher(CudaLauncher):
        pass

    assert compat._c_launch(HIPLauncher()) is None
    monkeypatch.setattr(compat, "C_LAUNCH", False)
    assert compat._c_launch(found) is None
