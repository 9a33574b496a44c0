"""compare beyond latency: accuracy, status, one-sided rows, machine mismatches, duplicates, exit codes, HTML."""

from __future__ import annotations

import pandas as pd
import pytest

from harness.cli.main import main
from harness.review import compare
from harness.review.compare import EXIT_INCOMPLETE, EXIT_OK, EXIT_UNCONFIRMED, EXIT_WORSE, compare_runs
from tests.harness import review_frames as rf


def _set(frame: pd.DataFrame, case: str, backend: str, **values) -> pd.DataFrame:
    frame = frame.copy()
    mask = (frame["case"] == case) & (frame["backend"] == backend)
    for key, value in values.items():
        frame.loc[mask, key] = value
    return frame


@pytest.fixture
def base():
    return rf.frame(num_cases=4, seed=1)


@pytest.fixture
def rerun():
    return rf.frame(num_cases=4, seed=2)


def whys(comparison) -> dict:
    return {(r["case"], r["backend"]): r["why"] for _, r in comparison.regressions.iterrows()}


WORSE_ROWS = {
    "accuracy": (
        "case01", "tlsim", {"status": "fail", "max_abs_err": 3e-4, "tol_ratio": 2.7, "reason": "max abs err 3e-4"},
        ("status pass -> fail", "max abs err", "tolerance margin shrunk"),
    ),
    "nan_count": ("case00", "tlsim", {"status": "fail", "nan_count": 12}, ("NaN count 0 -> 12",)),
}  # fmt: skip


@pytest.mark.parametrize("name", WORSE_ROWS)
def test_a_planted_accuracy_or_nan_count_regression_fails_compare_saying_what_grew(base, rerun, name):
    case, backend, values, words = WORSE_ROWS[name]
    comparison = compare_runs(base, _set(rerun, case, backend, **values))
    assert comparison.exit_code == EXIT_WORSE
    assert all(w in whys(comparison)[(case, backend)] for w in words), whys(comparison)


def test_error_growth_and_margin_shrink_inside_tolerance_still_count(base, rerun):
    new = _set(rerun, "case02", "reference", max_abs_err=5e-6, tol_ratio=0.6)
    why = whys(compare_runs(base, new))[("case02", "reference")]
    assert why == "max abs err 2.00e-07 -> 5.00e-06; tolerance margin shrunk: 0.02 -> 0.60 of the tolerance"
    tiny = _set(rerun, "case02", "reference", max_abs_err=5e-7, tol_ratio=0.05)  # grew, but far inside: noise
    assert compare_runs(base, tiny).exit_code == EXIT_OK


def test_a_row_now_skipped_is_worse_and_a_fix_is_better(base, rerun):
    new = _set(rerun, "case00", "gather_sdpa", status="skip", reason="gone")
    assert whys(compare_runs(base, new))[("case00", "gather_sdpa")] == "status pass -> skip"
    broken = _set(base, "case03", "tlsim", status="error", reason="RuntimeError")
    comparison = compare_runs(broken, rerun)
    assert comparison.exit_code == EXIT_OK
    assert comparison.improvements.set_index("case").loc["case03", "better"] == "fixed: error -> pass"


def test_rows_on_one_side_make_the_comparison_incomplete(base, rerun):
    fewer = rerun[rerun["backend"] != "gather_sdpa"]
    comparison = compare_runs(base, fewer)
    assert comparison.exit_code == EXIT_INCOMPLETE
    assert "4 row(s) missing from the new run" in comparison.problems
    more = compare_runs(fewer, rerun)
    assert more.exit_code == EXIT_INCOMPLETE and "4 row(s) new, with no baseline" in more.problems


def test_a_device_or_version_mismatch_is_incomplete_unless_allowed(base, rerun):
    other = rf.meta(torch="2.14.0", device_name="Other CPU")
    comparison = compare_runs(base, rerun, rf.meta(), other)
    assert comparison.exit_code == EXIT_INCOMPLETE
    assert any("torch 2.13.0 -> 2.14.0" in p for p in comparison.problems)
    assert compare_runs(base, rerun, rf.meta(), other, allow_mismatch=True).exit_code == EXIT_OK


def test_worse_wins_over_incomplete(base, rerun):
    new = _set(rerun[rerun["backend"] != "gather_sdpa"], "case01", "tlsim", status="fail")
    assert compare_runs(base, new).exit_code == EXIT_WORSE


def test_duplicated_rows_are_refused(base, rerun):
    doubled = pd.concat([rerun, rerun.iloc[:1]])
    with pytest.raises(compare.DuplicateRowsError, match=r"new run: duplicated .*reference on case00"):
        compare_runs(base, doubled)


def test_the_terminal_table_lists_changes_and_the_exit_reason(base, rerun):
    new = _set(rerun, "case01", "tlsim", status="fail")
    text = compare.format_comparison(compare_runs(base, new), "A", "B")
    assert "WORSE  tlsim" in text and "status pass -> fail" in text
    assert text.splitlines()[-1] == "exit 1: 1 row(s) got worse"


def test_cli_compare_exit_codes_and_html_page_escape_plugin_strings(tmp_path, base, rerun, capsys):
    rf.write(base, rf.meta(), tmp_path / "a")
    rf.write(rerun, rf.meta(), tmp_path / "b")
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == EXIT_OK
    evil = "<script>alert(1)</script>"
    bad = _set(rerun, "case01", "tlsim", status="fail", reason=evil)
    bad.loc[bad["backend"] == "reference", "backend"] = evil
    rf.write(bad, rf.meta(), tmp_path / "c")
    page = tmp_path / "cmp.html"
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "c"), "--html", str(page)]) == EXIT_WORSE
    html = page.read_text()
    assert evil not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "status pass -&gt; fail" in html and "exit 1" in html


def test_cli_compare_a_planted_slowdown_that_cannot_be_retimed_is_unconfirmed_and_a_rerun_passes(tmp_path):
    rf.write(rf.frame(seed=1), rf.meta(), tmp_path / "a")
    rf.write(rf.frame(seed=2), rf.meta(), tmp_path / "b")
    rf.write(rf.frame(seed=3, slow={"gather_sdpa": 1.25}), rf.meta(), tmp_path / "c")
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == EXIT_OK
    # these runs record no case files, so the slower rows are not re-timed in paired rounds: exit 5, not 1
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "c")]) == EXIT_UNCONFIRMED
