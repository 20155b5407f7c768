"""The test seeds of ``conftest.py``: a test id gives the same data in every run, and a failure's
report names the seed."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import SEED_PROPERTY, seed_for

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def _pytest(args: list[str], hash_seed: str, cwd: Path) -> subprocess.CompletedProcess:
    # Python's string hashing is salted per process unless PYTHONHASHSEED fixes it: two values
    # stand for two runs.
    env = {**os.environ, "PYTHONHASHSEED": hash_seed,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), str(TESTS), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_draws(request: pytest.FixtureRequest) -> None:
    """The data this test sees (read by the test below through its output): drawn from the seed
    that ``conftest.py`` took from this test's id, and recorded for its failure report."""
    drawn = torch.randn(4)
    seed = seed_for(request.node.nodeid)
    assert dict(request.node.user_properties)[SEED_PROPERTY] == seed
    torch.manual_seed(seed)
    assert torch.equal(drawn, torch.randn(4)), "the test's data did not come from its id's seed"
    print("DRAWN", drawn.tolist())


def test_a_test_id_gives_the_same_data_in_every_run() -> None:
    runs = [_pytest([f"{Path(__file__).name}::test_draws", "-q", "-s"], hash_seed, TESTS) for hash_seed in ("1", "2")]
    drawn = [re.findall(r"DRAWN .*", run.stdout) for run in runs]
    assert all(run.returncode == 0 for run in runs) and drawn[0] and drawn[0] == drawn[1], drawn


def test_a_failure_names_its_seed(tmp_path: Path) -> None:
    (tmp_path / "test_fails.py").write_text(
        "import torch\n\n\ndef test_fails():\n    value = torch.randn(1).item()\n    assert value > 100, repr(value)\n")
    run = _pytest(["-p", "conftest", "-q", "test_fails.py"], "0", tmp_path)
    assert run.returncode == 1, run.stdout
    seed = re.search(r"torch\.manual_seed\((\d+)\)", run.stdout)
    assert seed, run.stdout
    shown = float(re.search(r"AssertionError: (\S+)", run.stdout).group(1))
    torch.manual_seed(int(seed.group(1)))
    assert torch.randn(1).item() == shown
