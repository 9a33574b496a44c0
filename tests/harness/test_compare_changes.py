"""compare beyond latency: accuracy, status, one-sided rows, machine mismatches, exit codes, HTML."""

from __future__ import annotations

import pandas as pd
import pytest

from harness.cli.main import main
from harness.review.compare import EXIT_INCOMPLETE, EXIT_OK, EXIT_WORSE, compare_runs
from tests.harness import review_frames as rf
from tests.harness.review_frames import with_row


def _fewer(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["backend"] != "gather_sdpa"]


OTHER = rf.meta(torch="2.14.0", device_name="Other CPU")
# (base, rerun: 4 cases, seeds 1 and 2) -> (base, new run); keywords of compare_runs; exit; where to read: "problems"
# or (column, case, backend); a str is the whole text (of that cell, or one problem), a tuple words in it.
CHANGES = {
    "a planted accuracy regression": (
        lambda b, r: (b, with_row(r, "case01", "tlsim", status="fail", max_abs_err=3e-4, tol_ratio=2.7, reason="3e-4")),
        {}, EXIT_WORSE, ("why", "case01", "tlsim"), ("status pass -> fail", "max abs err", "tolerance margin shrunk")),
    "a planted NaN count": (lambda b, r: (b, with_row(r, "case00", "tlsim", status="fail", nan_count=12)), {},
                            EXIT_WORSE, ("why", "case00", "tlsim"), ("NaN count 0 -> 12",)),
    "error growth and a margin shrunk inside the tolerance": (
        lambda b, r: (b, with_row(r, "case02", "reference", max_abs_err=5e-6, tol_ratio=0.6)), {}, EXIT_WORSE,
        ("why", "case02", "reference"),
        "max abs err 2.00e-07 -> 5.00e-06; tolerance margin shrunk: 0.02 -> 0.60 of the tolerance"),
    "growth far inside the tolerance (noise)": (
        lambda b, r: (b, with_row(r, "case02", "reference", max_abs_err=5e-7, tol_ratio=0.05)), {}, EXIT_OK, None, ()),
    "a row now skipped": (lambda b, r: (b, with_row(r, "case00", "gather_sdpa", status="skip", reason="gone")), {},
                          EXIT_WORSE, ("why", "case00", "gather_sdpa"), "status pass -> skip"),
    "a fix": (lambda b, r: (with_row(b, "case03", "tlsim", status="error", reason="RuntimeError"), r), {}, EXIT_OK,
              ("better", "case03", "tlsim"), "fixed: error -> pass"),
    "rows missing from the new run": (lambda b, r: (b, _fewer(r)), {}, EXIT_INCOMPLETE, "problems",
                                      "4 row(s) missing from the new run"),
    "rows with no baseline": (lambda b, r: (_fewer(r), r), {}, EXIT_INCOMPLETE, "problems",
                              "4 row(s) new, with no baseline"),
    "a device or version mismatch": (lambda b, r: (b, r), {"base_meta": rf.meta(), "new_meta": OTHER},
                                     EXIT_INCOMPLETE, "problems", ("torch 2.13.0 -> 2.14.0",)),
    "a mismatch allowed": (lambda b, r: (b, r), {"base_meta": rf.meta(), "new_meta": OTHER, "allow_mismatch": True},
                           EXIT_OK, None, ()),
    "worse wins over incomplete": (lambda b, r: (b, with_row(_fewer(r), "case01", "tlsim", status="fail")), {},
                                   EXIT_WORSE, None, ()),
}  # fmt: skip


@pytest.mark.parametrize("name", CHANGES)
def test_what_got_worse_or_better_and_whether_the_comparison_is_complete_with_the_exit_code(name):
    make, keywords, exit_code, where, words = CHANGES[name]
    comparison = compare_runs(*make(rf.frame(num_cases=4, seed=1), rf.frame(num_cases=4, seed=2)), **keywords)
    assert comparison.exit_code == exit_code, comparison.problems
    if where == "problems":
        found = comparison.problems if isinstance(words, str) else "\n".join(comparison.problems)
        assert words in found if isinstance(words, str) else all(w in found for w in words), comparison.problems
    elif where is not None:
        column, case, backend = where
        text = comparison.rows.set_index(["case", "backend"]).loc[(case, backend), column]
        assert text == words if isinstance(words, str) else all(w in text for w in words), text


def test_cli_compare_exit_codes_its_table_and_html_page_escape_plugin_strings(tmp_path, capsys):
    base, rerun = rf.frame(num_cases=4, seed=1), rf.frame(num_cases=4, seed=2)
    rf.write(base, rf.meta(), tmp_path / "a")
    rf.write(rerun, rf.meta(), tmp_path / "b")
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == EXIT_OK
    evil = "<script>alert(1)</script>"
    bad = with_row(rerun, "case01", "tlsim", status="fail", reason=evil)
    bad.loc[bad["backend"] == "reference", "backend"] = evil
    rf.write(bad, rf.meta(), tmp_path / "c")
    page = tmp_path / "cmp.html"
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "c"), "--html", str(page)]) == EXIT_WORSE
    out = capsys.readouterr().out
    assert any(
        line.split()[:2] == ["WORSE", "tlsim"] and line.endswith("status pass -> fail") for line in out.split("\n")
    )
    assert out.splitlines()[-2:] == ["exit 1: 1 row(s) got worse", f"page: {page}"]
    html = page.read_text()
    assert evil not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "status pass -&gt; fail" in html and "exit 1" in html
