"""The mutant catalogue (scripts/mutants.toml) stays in step with the kernels, and its runner works.

Every mutant's text must occur exactly once in its file (a second, always). The whole catalogue
against the quick tests takes several minutes on 2 cores (docs/mutants.md): it runs here only
with HARNESS_MUTANTS=1 (or as `nox -s mutants`); HARNESS_MUTANTS=sample runs four (about two
minutes); unset, that test skips.
"""

from __future__ import annotations

import importlib.util
import os
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


def test_every_mutant_applies_to_the_current_code():
    runner = _runner()
    mutants = runner.load_catalogue()
    assert len(mutants) >= 30
    problems = {m.id: reason for m in mutants if (reason := runner.applies(m, ROOT))}
    assert not problems, f"mutants whose text is gone from the code (update scripts/mutants.toml): {problems}"
    assert all(m.replace != m.find for m in mutants)
    files = {m.file for m in mutants}
    assert {"kernels/reference.py", "kernels/tlsim.py", "kernels/triton_paged.py", "kernels/contract.py"} <= files


def test_a_mutant_whose_text_is_gone_is_not_applied(tmp_path):
    runner = _runner()
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "x.py").write_text("a = 1\n")
    mutant = runner.Mutant("gone", "kernels/x.py", "a = 2", "a = 3", "")
    assert runner.run_mutant(mutant, tmp_path, [], 10).verdict == "not-applied"


MODE = os.environ.get("HARNESS_MUTANTS", "")
SAMPLE = ["triton-combine-unweighted-acc", "tlsim-window-mask-one-wide", "reference-window-one-wide",
          "common-query-tiles-without-padding"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.interpreter
def test_the_quick_tests_catch_the_planted_slips(capsys):
    """scripts/mutants.py, baseline included: every mutant (HARNESS_MUTANTS=1) or a sample of four (=sample)."""
    if MODE not in ("1", "sample"):
        pytest.skip("minutes of interpreted kernels: set HARNESS_MUTANTS=1 (all) or =sample, or run `nox -s mutants`")
    runner = _runner()
    args = ["--jobs", "2"] + ([] if MODE == "1" else ["--only", *SAMPLE])
    status = runner.main(args)
    report = capsys.readouterr().out
    assert status == 0, report
