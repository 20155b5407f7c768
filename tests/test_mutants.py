"""``ci/mutants.py`` stays applicable: every mutant's snippet occurs exactly once in its file (the
script refuses to run otherwise, and nothing else runs it in CI), and each names its tests."""
from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@functools.lru_cache(maxsize=None)
def _mutants():
    spec = importlib.util.spec_from_file_location("ci_mutants", ROOT / "ci" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_mutant_applies_to_the_code_it_names():
    mutants = _mutants()
    stale = [f"{mutant.name}: {why}" for mutant in mutants.MUTANTS if (why := mutants._stale(mutant, ROOT))]
    assert not stale, "update these mutants in ci/mutants.py:\n" + "\n".join(stale)


def test_every_mutant_is_named_once_and_names_its_tests():
    mutants = _mutants().MUTANTS
    names = [mutant.name for mutant in mutants]
    assert len(set(names)) == len(names)
    for mutant in mutants:
        assert mutant.tests and all(test.startswith("tests/") and "::" in test for test in mutant.tests), mutant.name
        assert mutant.original != mutant.replacement, mutant.name
