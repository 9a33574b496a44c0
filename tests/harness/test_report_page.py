"""The review and history pages: verdict first, escaped plugin strings, readable numbers, pivot, baseline, trends."""

from __future__ import annotations

import itertools
import re

import pytest

from harness.cli.main import main
from harness.cli.terminal import summarize
from harness.results.report import ceilings_of, plots, render_html, sig
from harness.review.history import find_runs, load_history
from tests.harness import review_frames as rf
from tests.harness.plot_text import drawn_texts, page_plots

EVIL = "<script>alert('x')</script>"
SCALE = {"mode": "workers", "workers": 2, "wall_s": 85.51, "worker_start_s": [4.8, 4.83], "case_busy_s": 160.9,
         "phase_s": {"inputs": 14.9, "timing: latency": 59.8, "grade": 4.3}}  # fmt: skip


def _first_row(frame, **values):
    frame.loc[0, list(values)] = list(values.values())
    return frame


# the page of rf.frame(cases) through ``change``, with ``meta``: (words it shows, words it shows exactly n times)
PAGES = {
    "all_rows_pass_says_pass": (10, None, rf.meta(), ["<b>PASS</b>: all 30 graded rows within tolerance"], {}),
    "strings_from_case_files_and_plugins_stay_escaped": (
        2, lambda f: _first_row(f, backend=EVIL, reason=EVIL, case=EVIL, status="error"),
        rf.meta(command=EVIL, cpu_model=EVIL), ["&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"],
        {EVIL: 0, "<script>": 2}),  # only the page's own two scripts
    "gbps_of_cpu_rows_keeps_significant_digits": (1, lambda f: f.assign(gbps=0.0123), rf.meta(), [">0.0123<"],
                                                  {">0.0<": 0}),
    "host_overhead_flagged_where_call_us_far_exceeds_latency": (
        1, lambda f: _first_row(f, call_us=f.loc[0, "latency_us"] * 3), rf.meta(), [], {"⚑ 3.0×": 1}),
    "header_shows_noise_judges_and_ceilings": (
        1, None, rf.meta(cpu_model="Xeon Test", logical_cpus=2, load_average=[3.5, 2.0, 1.0], timing_threads=1,
                         ceilings={"read_gbps": 20.0, "copy_gbps": 12.5, "peak_tflops": 1.5, "peak_source": "spec"}),
        ["Xeon Test, 2 logical CPUs", "timing threads 1", "busy machine", "read 20.0 GB/s", "peak 1.50 TFLOP/s (spec)"],
        {}),
    "a_process_pool_runs_time_summary_largest_phase_first": (1, None, rf.meta(scale=SCALE), [], {
        'id="time-summary">2 workers, 85.5 s from the first case to the last row, workers started in 4.8 s; '
        '160.9 s of case work: timing: latency 59.8, inputs 14.9, grade 4.3<': 1}),
    "no_time_summary_where_the_run_recorded_none": (1, None, rf.meta(), [], {'id="time-summary"': 0}),
    "a_resumed_runs_time_summary_says_so": (1, None, rf.meta(scale=SCALE, resumed={"journal_rows": 7}),
                                            ["(the resumed part only: 7 rows came from the journal)"], {}),
    "an_old_run_without_the_new_columns_still_renders": (
        2, lambda f: f.drop(columns=["latency_samples_us", "call_us", "tol_ratio"]), {"device": "cpu"},
        ["<b>PASS</b>", "not recorded (an older run)"], {}),
}  # fmt: skip


@pytest.mark.parametrize("name", PAGES)
def test_the_page_shows_the_words_of_its_rows_and_meta(name):
    num_cases, change, meta, shown, counted = PAGES[name]
    frame = rf.frame(num_cases=num_cases)
    html = render_html(change(frame) if change else frame, meta)
    assert [w for w in shown if w not in html] == []
    assert {w: html.count(w) for w in counted} == counted


def test_the_verdict_names_the_failing_row_its_location_and_count_before_any_table():
    frame = rf.frame(num_cases=3).assign(worst_location="", fail_count=0)
    failed = ["fail", "max abs err 3e-4 exceeds atol", 2.5, "seq 3, query 5, head 2", 17]
    mask = (frame["case"] == "case01") & (frame["backend"] == "tlsim")
    frame.loc[mask, ["status", "reason", "tol_ratio", "worst_location", "fail_count"]] = failed
    html = render_html(frame, rf.meta())
    verdict = html[html.index('id="verdict"') : html.index("Cases × backends")]
    assert "FAIL" in verdict and "tlsim" in verdict and "case01" in verdict
    assert "seq 3, query 5, head 2" in verdict and "17 elements outside tolerance" in verdict
    assert html.index('id="verdict"') < html.index('id="pivot"') < html.index('id="rows"')


def test_a_name_with_dollar_signs_is_drawn_as_text_not_parsed_as_tex(drawn_plots, plot_text_as_text):
    frame = rf.frame(num_cases=2)
    frame.loc[frame["backend"] == frame.loc[0, "backend"], "backend"] = "$\\frac{$"
    frame.loc[frame["case"] == "case00", "case"] = "a$b$"
    html = render_html(frame, rf.meta())
    pytest.importorskip("matplotlib", reason="plots need matplotlib")
    assert "$\\frac{$" in html and 'src="data:image/svg+xml;base64,' in html
    drawn = [t.text for uri in page_plots(html) for t in drawn_texts(uri)]
    assert "$\\frac{$" in drawn, "the name as it is, in the legend and under its column of points"
    assert not [t for t in drawn if "mathdefault" in t], "and the axes' own tick labels still typeset"


def test_plots_are_embedded_and_label_log_ticks_with_numbers_not_tex_source(drawn_plots, plot_text_as_text):
    pytest.importorskip("matplotlib", reason="plots need matplotlib")
    html = render_html(rf.frame(num_cases=4), rf.meta())
    assert html.count('<img src="data:image/svg+xml;base64,') >= 2
    assert not re.search(r'(src|href)="(https?:)?//', html), "the page loads nothing from the network"
    uris = page_plots(html)
    for uri in uris:
        drawn = [t.text for t in drawn_texts(uri)]
        assert not [t for t in drawn if "$" in t or "\\" in t], drawn
        assert any(re.fullmatch(r"10[−-]?[0-9]+", t) for t in drawn), drawn  # a log axis's decade: 10 and exponent


def test_close_bandwidth_ceilings_are_labelled_a_line_apart(drawn_plots, plot_text_as_text):
    pytest.importorskip("matplotlib", reason="plots need matplotlib")
    uri = plots.latency_and_bandwidth(rf.frame(num_cases=4), {"read": 20.0, "copy": 19.0, "l2": 120.0})
    labels = {t.text: t for t in drawn_texts(uri) if t.text.endswith(" GB/s")}
    assert set(labels) == {"read 20 GB/s", "copy 19 GB/s", "l2 120 GB/s"}
    heights = sorted((t.y, t.size) for t in labels.values())
    for (y_above, size), (y_below, _) in itertools.pairwise(heights):
        assert y_below - y_above >= size, f"labels overlap: {labels}"


def test_the_ceilings_drawn_are_those_meta_json_holds():
    limits = {"read_gbps": 1.0, "copy_gbps": 2.0}
    assert ceilings_of({"ceilings": dict(limits)}) == {"read": 1.0, "copy": 2.0}
    assert ceilings_of({"ceilings_gbps": dict(limits)}) == limits  # every limit of the old key
    new_wins = {"ceilings": {"read_gbps": 1.0}, "ceilings_gbps": {"cpu_copy": 3.0}}
    assert ceilings_of(new_wins) == {"read": 1.0}


def test_gbps_on_cpu_rows_keeps_significant_digits():
    assert sig(0.0123) == "0.0123" and sig(0.0004567) == "4.57e-04" and sig(1234.5) == "1234" and sig(12.345) == "12.3"


def test_pivot_has_a_cell_per_case_and_backend_and_a_speedup_select():
    html = render_html(rf.frame(num_cases=3), rf.meta())
    pivot = html[html.index('id="pivot"') : html.index("</table>", html.index('id="pivot"'))]
    assert pivot.count("<tr><td") == 3 and pivot.count("data-lat=") == 9
    assert '<select id="speedup-ref">' in html and '<option value="gather_sdpa">' in html


def test_skips_are_folded_away_and_details_hold_the_other_columns():
    frame = rf.frame(num_cases=1)
    frame.loc[2, ["status", "reason"]] = ["skip", "gather_sdpa runs on cuda, not cpu"]
    html = render_html(frame, rf.meta())
    folded = html[html.index('<details id="skipped">') :]
    assert "1 skipped row " in folded and "runs on cuda, not cpu" in folded
    assert '<details class="more">' in html and "bytes_moved" in html


def test_report_with_a_baseline_marks_and_lists_regressions(tmp_path):
    rf.write(rf.frame(seed=1), rf.meta(), tmp_path / "base")
    rf.write(rf.frame(seed=2, slow={"tlsim": 1.3}), rf.meta(), tmp_path / "new")
    assert main(["report", str(tmp_path / "new"), "--baseline", str(tmp_path / "base")]) == 0
    html = (tmp_path / "new" / "report.html").read_text()
    listed = html[html.index('id="regressions"') : html.index("Cases × backends")]
    assert "10 regressions" in listed and listed.count("<b>tlsim</b>") == 10
    assert html.count('class="pass regressed"') == 10


def test_the_page_says_no_linear_fit_where_the_line_does_not_hold_and_the_terminal_prints_no_fits():
    frame = rf.frame(num_cases=5)
    cloud = frame["backend"] == "tlsim"
    frame.loc[cloud, "latency_us"] = [400.0, 90.0, 350.0, 120.0, 300.0]  # no line through these
    html = render_html(frame, rf.meta())
    fits = html[html.index('id="fits"') : html.index("</table>", html.index('id="fits"'))]
    rows = {re.sub("<[^>]+>", " ", r).split()[0]: r for r in fits.split("<tr>")[2:]}
    assert "no linear fit (r²" in rows["tlsim"]
    assert "no linear fit" not in rows["reference"] and "no linear fit" not in rows["gather_sdpa"]
    assert "scaling" not in summarize(frame) and "us per" not in summarize(frame)


# --- harness history: runs of one machine in time order, the regression between them marked --------------


@pytest.fixture
def history_runs(tmp_path):
    root = tmp_path / "reports"
    rf.write(rf.frame(num_cases=3, seed=1), rf.meta(commit="1" * 40, time="2026-11-01T00:00:00"), root / "r1")
    rf.write(rf.frame(num_cases=3, seed=2), rf.meta(commit="2" * 40, time="2026-11-02T00:00:00"), root / "r2")
    slow = rf.with_row(rf.frame(num_cases=3, seed=3, slow={"tlsim": 1.4}), "case02", "reference", status="fail")
    rf.write(slow, rf.meta(commit="3" * 40, time="2026-11-03T00:00:00"), root / "r3")
    rf.write(rf.frame(num_cases=3, seed=4), rf.meta(commit="4" * 40, time="2026-11-04T00:00:00", device="cuda",
                                                   device_name="H200"), root / "r4")  # fmt: skip
    (root / ".r5.partial-1").mkdir()  # a half-written run is not a run
    return root


def test_history_orders_runs_per_machine_and_marks_only_the_regressed_run(history_runs):
    history = load_history([history_runs])
    assert len(find_runs([history_runs])) == 4
    cpu = history.runs[history.runs["machine"] == "cpu x86_64"]
    assert list(cpu["run_label"]) == ["1111111", "2222222", "3333333"]
    bad = history.rows[history.rows["regressed"]]
    assert set(bad["run_label"]) == {"3333333"}
    assert set(zip(bad["case"], bad["backend"], strict=True)) == {("case00", "tlsim"), ("case01", "tlsim"),
                                                                  ("case02", "tlsim"), ("case02", "reference")}  # fmt: skip
    assert not history.rows[history.rows["machine"] == "cuda H200"]["regressed"].any(), "a new machine has no baseline"


def test_history_verb_prints_the_trend_and_writes_a_page_with_plots(history_runs, tmp_path, capsys, drawn_plots,
                                                                     plot_text_as_text):  # fmt: skip
    page = tmp_path / "history.html"
    assert main(["history", str(history_runs), "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert "4 regression(s) between consecutive runs" in out and "▲ 3333333: tlsim on case00" in out
    assert "FAIL ▲" in out
    html = page.read_text()
    assert "4 regressions" in html
    pytest.importorskip("matplotlib", reason="plots need matplotlib")
    assert html.count('<img src="data:image/svg+xml;base64,') == 4  # latency and error, per machine
    for uri in page_plots(html):  # the log axes' ticks typeset ("10^2"), not left as TeX source
        drawn = [t.text for t in drawn_texts(uri)]
        assert not [t for t in drawn if "$" in t or "\\" in t] and any(re.fullmatch(r"10[−-]?[0-9]+", t) for t in drawn)


# The second of two runs moved as a whole (every backend 1.5x): its commit, and what history says of its ▲.
DRIFTS = {
    "same_commit": ("1" * 40, {}, "1111111#2", "the same commit as the run before: its latency ▲ are not a change of "
                    "the code"),
    "another_commit": ("2" * 40, {}, "2222222", "the two runs alone cannot tell the machine's load from the code: "
                       "`harness compare {root}/r1 {root}/r2` re-times its latency ▲ in paired rounds"),
    "same_commit_dirty": ("1" * 40, {"dirty": True}, "1111111+", "the two runs alone cannot tell"),
}  # fmt: skip


@pytest.mark.parametrize("name", DRIFTS)
def test_history_says_where_two_runs_drifted_and_what_the_two_alone_can_tell(tmp_path, capsys, name):
    """Drifted runs: history marks their ▲ and puts it on the load only where the code is the same."""
    commit, dirty, label, reading = DRIFTS[name]
    root = tmp_path / "reports"
    rf.write(rf.frame(num_cases=4, seed=1), rf.meta(commit="1" * 40, time="2026-11-01T00:00:00"), root / "r1")
    drifted = rf.frame(num_cases=4, seed=2, slow={b: 1.5 for b in rf.BACKENDS})
    rf.write(drifted, rf.meta(commit=commit, time="2026-11-02T00:00:00", **dirty), root / "r2")
    assert main(["history", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"▲ {label}:" in out
    notes = [line.strip() for line in out.splitlines() if line.strip().startswith("!")]
    assert len(notes) == 1 and notes[0].startswith(f"! {label}: latency drift: 12 of 12 timed rows"), out
    assert reading.format(root=root) in notes[0] and "more likely" not in notes[0]
