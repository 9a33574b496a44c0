"""The mutant catalogue (scripts/mutants.toml) stays in step with the kernels, and the quick tests catch it.

Every mutant applies once and names its catching test (a second); scripts/mutants.py then runs the whole
catalogue (80 to 110 CPU-seconds, marker ``mutants``, `nox -s mutants`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import mutants as runner

ROOT = Path(__file__).resolve().parents[2]


def test_every_mutant_applies_to_the_current_code_and_names_its_catching_test():
    mutants = runner.load_catalogue()
    assert len(mutants) >= 30
    problems = {m.id: reason for m in mutants if (reason := runner.applies(m, ROOT))}
    assert not problems, f"mutants whose text is gone from the code (update scripts/mutants.toml): {problems}"
    assert all(m.replace != m.find for m in mutants)
    files = {m.file for m in mutants}
    assert {"kernels/reference.py", "kernels/tlsim.py", "kernels/triton_paged.py", "kernels/contract.py"} <= files
    quick = tuple(f"{test}[" if "::" in test else f"{test}::" for test in runner.QUICK_TESTS)  # a file or a test
    unnamed = [m.id for m in mutants if not m.caught_by.startswith(quick)]
    assert not unnamed, f"mutants without a quick test in caught_by (python scripts/mutants.py --record): {unnamed}"


def test_a_mutant_whose_text_is_gone_is_not_applied(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "x.py").write_text("a = 1\n")
    mutant = runner.Mutant("gone", "kernels/x.py", "a = 2", "a = 3", "")
    assert runner.run_mutant(mutant, tmp_path, [], 10).verdict == "not-applied"


@pytest.mark.slow
@pytest.mark.mutants
@pytest.mark.interpreter
@pytest.mark.timeout(1500)
def test_the_quick_tests_catch_every_planted_slip():
    """scripts/mutants.py over the whole catalogue, in its own interpreter."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "scripts/mutants.py", "--jobs", "2"], cwd=ROOT, env=env,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
