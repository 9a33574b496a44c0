"""The mutant catalogue (scripts/mutants.toml) stays in step with the kernels, and the quick tests catch it.

Every mutant's text must occur exactly once in its file and name the quick test that catches
it (a second, always). The catch run itself (scripts/mutants.py: each mutant planted in a copy,
its caught_by test run against it) takes minutes of interpreted kernels, so it runs when what a
catch depends on (scripts/mutants.py's WATCHED files: kernels/, the quick tests and their
grading, the catalogue) differs from the last run that caught every mutant, whose fingerprint
scripts/mutants.passed keeps; HARNESS_MUTANTS=1 runs it anyway, HARNESS_MUTANTS=0 never.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _runner():
    spec = importlib.util.spec_from_file_location("mutants_runner", ROOT / "scripts" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_mutant_applies_to_the_current_code_and_names_its_catching_test():
    runner = _runner()
    mutants = runner.load_catalogue()
    assert len(mutants) >= 30
    problems = {m.id: reason for m in mutants if (reason := runner.applies(m, ROOT))}
    assert not problems, f"mutants whose text is gone from the code (update scripts/mutants.toml): {problems}"
    assert all(m.replace != m.find for m in mutants)
    files = {m.file for m in mutants}
    assert {"kernels/reference.py", "kernels/tlsim.py", "kernels/triton_paged.py", "kernels/contract.py"} <= files
    quick = tuple(f"{test}::" for test in runner.QUICK_TESTS)
    unnamed = [m.id for m in mutants if not m.caught_by.startswith(quick)]
    assert not unnamed, f"mutants without a quick test in caught_by (python scripts/mutants.py --record): {unnamed}"


def test_a_mutant_whose_text_is_gone_is_not_applied(tmp_path):
    runner = _runner()
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "x.py").write_text("a = 1\n")
    mutant = runner.Mutant("gone", "kernels/x.py", "a = 2", "a = 3", "")
    assert runner.run_mutant(mutant, tmp_path, [], 10).verdict == "not-applied"


def test_the_fingerprint_follows_the_watched_files(tmp_path):
    runner = _runner()
    for name in runner.WATCHED:
        source, copy = ROOT / name, tmp_path / name
        copy.parent.mkdir(parents=True, exist_ok=True)
        (runner.shutil.copytree if source.is_dir() else runner.shutil.copy2)(source, copy)
    assert runner.fingerprint(tmp_path) == runner.fingerprint(ROOT)
    edited = tmp_path / "kernels" / "tiling.py"
    edited.write_text(edited.read_text() + "\n")
    assert runner.fingerprint(tmp_path) != runner.fingerprint(ROOT)


MODE = os.environ.get("HARNESS_MUTANTS", "")


@pytest.mark.slow
@pytest.mark.interpreter
@pytest.mark.timeout(1500)
def test_the_quick_tests_catch_every_planted_slip():
    """scripts/mutants.py, baseline included, over the whole catalogue, in its own interpreter."""
    if MODE == "0" or (MODE != "1" and _runner().unchanged_since_last_pass()):
        pytest.skip("kernels, quick tests and catalogue as in the last full pass (scripts/mutants.passed)")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    done = subprocess.run([sys.executable, "scripts/mutants.py", "--jobs", "2"], cwd=ROOT, env=env,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
