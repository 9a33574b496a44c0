"""Compare verdicts: latency (a rerun is not 'slower', a planted 25% slowdown is), accuracy, status, exit codes."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from benchmarks import saved
from harness.cli.main import main
from harness.review import stats
from harness.review.compare import EXIT_INCOMPLETE, EXIT_OK, EXIT_WORSE, compare_runs, format_comparison
from harness.run.runner import NOT_TIMED
from tests.harness import review_frames as rf
from tests.harness.review_frames import with_row


def test_reruns_of_one_distribution_give_at_most_one_false_alarm_in_a_hundred_rows():
    base = rf.frame(num_cases=40, seed=1)  # 120 rows
    false_alarms = 0
    for seed in range(2, 7):  # five reruns: 600 row comparisons
        rows = compare_runs(base, rf.frame(num_cases=40, seed=seed)).rows
        false_alarms += int((rows["verdict"] == "slower").sum())
    assert false_alarms <= 6, f"{false_alarms} false 'slower' verdicts in 600 rows"


def test_a_planted_25pct_slowdown_is_slower_on_every_case_and_nowhere_else():
    base = rf.frame(num_cases=12, seed=1)
    new = rf.frame(num_cases=12, seed=2, slow={"tlsim": 1.25})
    comparison = compare_runs(base, new)
    rows = comparison.rows.set_index("backend")
    assert (rows.loc["tlsim", "verdict"] == "slower").all(), rows.loc["tlsim", "verdict_reason"].tolist()
    assert not (rows.drop(index="tlsim")["verdict"] == "slower").any()
    assert comparison.exit_code == EXIT_WORSE
    assert all(w.startswith("latency ") for w in comparison.regressions["why"])


def test_a_slowdown_smaller_than_the_minimum_effect_is_not_slower():
    base, new = rf.frame(seed=1, spread=0.01), rf.frame(seed=2, spread=0.01, slow={"tlsim": 1.04})
    comparison = compare_runs(base, new)
    tlsim = comparison.rows[comparison.rows["backend"] == "tlsim"]
    assert not (tlsim["verdict"] == "slower").any()
    strict = compare_runs(base, new, min_effect=0.02)
    assert (strict.rows[strict.rows["backend"] == "tlsim"]["verdict"] == "slower").all()


def test_cuda_rows_use_a_3pct_effect_by_default():
    assert stats.default_effect("cuda") == 0.03 and stats.default_effect("cuda:1") == 0.03
    assert stats.default_effect("cpu") == 0.10


_DRAWS = np.random.default_rng(0).normal(0, 1, 60)


@pytest.mark.parametrize(
    ("base", "new", "verdict", "words"),
    [
        ([100, 101, 99], [150, 151, 149], "cannot tell", "too few samples"),
        (100 * np.exp(0.5 * _DRAWS[:12]), 115 * np.exp(0.5 * _DRAWS[12:24]), "cannot tell", "too noisy"),  # wide
        (100 * np.exp(0.02 * _DRAWS[:30]), 100 * np.exp(0.02 * _DRAWS[30:]), "same", "inside ±10%"),  # the CI fits
    ],
)
def test_few_samples_or_a_spread_straddling_the_effect_cannot_tell_a_ci_inside_it_is_same(base, new, verdict, words):
    t = stats.compare_samples(base, new)
    v = stats.decide(t, stats.adjust_p_values([t.p_value])[0], min_effect=0.1)
    assert v.verdict == verdict and words in v.reason, v


def test_benjamini_hochberg_and_holm_match_hand_computed_values():
    p = [0.01, 0.04, 0.03, np.nan, 0.005]
    bh = stats.adjust_p_values(p, "bh")
    np.testing.assert_allclose(bh[[4, 0, 2, 1]], [0.02, 0.02, 0.04, 0.04])
    assert np.isnan(bh[3])
    holm = stats.adjust_p_values(p, "holm")
    np.testing.assert_allclose(holm[[4, 0, 2, 1]], [0.02, 0.03, 0.06, 0.06])
    with pytest.raises(ValueError, match="unknown p-value correction"):
        stats.adjust_p_values(p, "bonferroni-ish")


def test_old_runs_without_samples_fall_back_to_p10_p90_marked_weak():
    base, new = rf.frame(seed=1), rf.frame(seed=2, slow={"tlsim": 1.5})
    for f in (base, new):
        del f["latency_samples_us"]
    comparison = compare_runs(base, new)
    tlsim = comparison.rows[comparison.rows["backend"] == "tlsim"]
    assert (tlsim["verdict"] == "slower").all() and (tlsim["evidence"] == "p10/p90 (weak)").all()
    assert all("weak evidence" in why for why in comparison.regressions["why"])
    median = base.loc[0, "latency_us"]  # 15% slower, its p10..p90 straddling the base's: noise
    noisy = with_row(base, "case00", base.loc[0, "backend"], latency_us=1.15 * median, latency_p10_us=0.9 * median,
                     latency_p90_us=1.4 * median)  # fmt: skip
    assert compare_runs(base, noisy).ok, "a slowdown inside the spread is noise"


def test_normalizing_by_an_unchanged_backend_cancels_a_machine_wide_drift():
    """All rows 15% slower, tlsim 25% more: normalized, only tlsim is slower; a case without the anchor is counted."""
    base = rf.frame(num_cases=8, seed=1, spread=0.01)
    drift = {b: 1.15 for b in rf.BACKENDS}
    new = rf.frame(num_cases=8, seed=2, spread=0.01, slow={**drift, "tlsim": 1.15 * 1.25})
    raw = compare_runs(base, new).rows
    assert (raw["verdict"] == "slower").all()
    rows = compare_runs(base, new, normalize_by="reference").rows.set_index("backend")
    assert (rows.loc["tlsim", "verdict"] == "slower").all()
    assert (rows.loc["reference", "verdict"] == "anchor").all()
    others = rows.drop(index=["tlsim", "reference"])
    assert not others["verdict"].isin(["slower", "faster"]).any(), others["verdict"].tolist()
    unanchored = new[~((new["case"] == "case00") & (new["backend"] == "reference"))]  # a case left raw, and counted
    problems = compare_runs(base, unanchored, normalize_by="reference").problems
    assert any("not normalized" in p and "reference" in p for p in problems), problems


def test_a_row_graded_not_timed_over_its_budget_in_one_run_is_said_and_leaves_the_comparison_complete():
    base, new = rf.frame(num_cases=3, seed=1), rf.frame(num_cases=3, seed=2)
    timing = [c for c in new.columns if c.startswith("latency") or c == "call_us"]
    new = rf.with_row(
        new, "case01", "tlsim", **dict.fromkeys(timing), note=f"{NOT_TIMED} 4.2 s, past the row's 3 s timing budget"
    )
    result = compare_runs(base, new)
    assert not result.incomplete
    assert any("outlasted the row's timing budget" in p and p.startswith("1 graded row") for p in result.problems)
    no_timing = rf.with_row(new, "case01", "tlsim", note="")  # the same hole without the note: a --no-timing run
    assert compare_runs(base, no_timing).incomplete


def test_rows_faster_by_two_drifted_runs_alone_are_marked_doubtful():
    """Rows faster only by two drifted runs are 'better?', not improvements; one backend faster alone is faster."""
    base = rf.frame(num_cases=12, seed=1)
    drifted = rf.frame(num_cases=12, seed=2, slow={name: 0.6 for name in rf.BACKENDS})  # the machine got quieter
    comparison = compare_runs(base, drifted)
    assert any(p.startswith("latency drift") for p in comparison.problems)
    text = format_comparison(comparison, "A", "B")
    assert "better?" in text and "faster by the two runs alone while they drifted" in text
    quiet = compare_runs(base, rf.frame(num_cases=12, seed=2, slow={"tlsim": 0.6}))  # one backend: no drift
    assert not any(p.startswith("latency drift") for p in quiet.problems)
    assert "better?" not in format_comparison(quiet, "A", "B")
    assert (quiet.rows.set_index("backend").loc["tlsim", "verdict"] == "faster").all(), "faster, and no failure"
    assert quiet.exit_code == EXIT_OK and len(quiet.improvements) == 12


# --- beyond latency: accuracy, status, one-sided rows, machine mismatches, exit codes, HTML ---------------------


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


# --- nox -s bench's comparison of saved pytest-benchmark runs: a rerun passes, a planted slowdown fails --------------


def _run(path, seed: int, slow: dict[str, float] | None = None, samples: bool = True, case_file=None, **doc):
    """A saved run of 8 cases x 2 backends; ``case_file`` in each benchmark's extra_info, ``doc`` at the top."""
    rng = np.random.default_rng(seed)
    benchmarks = []
    for i in range(8):
        for backend in ("reference", "tlsim"):
            median = (200 + 50 * i) * (slow or {}).get(backend, 1.0)
            data = sorted(median * np.exp(rng.normal(0, 0.05, 15)))
            quart = np.quantile(data, [0.25, 0.5, 0.75]) * 1e-6
            benchmarks.append({
                "fullname": f"benchmarks/test_bench_backends.py::test_bench[case{i}-{backend}]",
                "stats": {"median": quart[1], "q1": quart[0], "q3": quart[2]},
                "extra_info": {"device": "cpu", **({"samples_us": [float(x) for x in data]} if samples else {}),
                               **({"case_file": case_file} if case_file else {})},
            })  # fmt: skip
    path.write_text(json.dumps({"benchmarks": benchmarks, **doc}))
    return path


def test_a_rerun_passes_and_a_planted_slowdown_fails_with_a_readable_summary(tmp_path):
    base = _run(tmp_path / "base.json", 1)
    passed, summary = saved.compare_files(base, _run(tmp_path / "rerun.json", 2))
    assert passed, summary
    passed, summary = saved.compare_files(base, _run(tmp_path / "slow.json", 3, slow={"tlsim": 1.25}))
    assert not passed
    assert summary.count("SLOWER") == 8 and "test_bench[case0-tlsim]" in summary
    assert summary.splitlines()[-1] == "bench: FAIL: 8 benchmark(s) slower"
    assert "Traceback" not in summary


def test_runs_without_samples_fall_back_to_quartiles_marked_weak(tmp_path):
    base = _run(tmp_path / "base.json", 1, samples=False)
    passed, summary = saved.compare_files(base, _run(tmp_path / "slow.json", 3, slow={"tlsim": 1.5}, samples=False))
    assert not passed and "(weak evidence)" in summary


def test_saved_runs_are_numbered_and_the_newest_is_the_default_baseline(tmp_path, capsys):
    storage = tmp_path / ".benchmarks"
    assert saved.main(["compare", str(_run(tmp_path / "a.json", 1)), "--storage", str(storage)]) == 0
    assert "nothing to compare with" in capsys.readouterr().out
    first = saved.save(_run(tmp_path / "a.json", 1), storage)
    second = saved.save(_run(tmp_path / "b.json", 2), storage)
    assert first.name.startswith("0001_") and second.name.startswith("0002_")
    assert saved.find_baseline(None, storage) == second and saved.find_baseline("0001", storage) == first
    with pytest.raises(SystemExit, match="no saved run matches '0009'"):
        saved.find_baseline("0009", storage)
    slow = _run(tmp_path / "c.json", 3, slow={"reference": 1.3})
    assert saved.main(["compare", str(slow), "--storage", str(storage)]) == 1
    assert saved.main(["compare", str(slow), "--storage", str(storage), "--min-effect", "0.5"]) == 0


@pytest.mark.parametrize(("commit_info", "why"), [
    ({"id": "fetched"}, "the baseline's commit_info: field 'commit': {fetched} is not in your history"),
    ({"id": "head", "dirty": True}, "the baseline was made from a tree with uncommitted changes"),
])  # fmt: skip
def test_a_baseline_is_re_timed_only_from_your_own_clean_history(tmp_path, git_history, monkeypatch, commit_info, why):
    """A saved baseline is data: --confirm checks out its commit only when it is in your history and clean."""
    ids = git_history
    monkeypatch.setattr(saved, "ROOT", tmp_path / "repo")
    base = _run(tmp_path / "base.json", 1, commit_info={**commit_info, "id": ids[commit_info["id"]]})
    new = _run(tmp_path / "slow.json", 3, slow={"tlsim": 1.25}, case_file=str(tmp_path / "cases.toml"))
    passed, summary = saved.compare_files(base, new, confirm="all")
    assert not passed and f"confirm: skipped: {why.format(**ids)}" in summary
