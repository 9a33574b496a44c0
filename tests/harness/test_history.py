"""harness history: three runs of one machine, in time order, with the regression between them marked."""

from __future__ import annotations

import re

import pytest

from harness.cli.main import main
from harness.review.history import find_runs, load_history
from tests.harness import review_frames as rf
from tests.harness.plot_text import drawn_texts, page_plots


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "reports"
    rf.write(rf.frame(num_cases=3, seed=1), rf.meta(commit="1" * 40, time="2026-11-01T00:00:00"), root / "r1")
    rf.write(rf.frame(num_cases=3, seed=2), rf.meta(commit="2" * 40, time="2026-11-02T00:00:00"), root / "r2")
    slow = rf.with_row(rf.frame(num_cases=3, seed=3, slow={"tlsim": 1.4}), "case02", "reference", status="fail")
    rf.write(slow, rf.meta(commit="3" * 40, time="2026-11-03T00:00:00"), root / "r3")
    rf.write(rf.frame(num_cases=3, seed=4), rf.meta(commit="4" * 40, time="2026-11-04T00:00:00", device="cuda",
                                                   device_name="H200"), root / "r4")  # fmt: skip
    (root / ".r5.partial-1").mkdir()  # a half-written run is not a run
    return root


def test_history_orders_runs_per_machine_and_marks_only_the_regressed_run(runs):
    history = load_history([runs])
    assert len(find_runs([runs])) == 4
    cpu = history.runs[history.runs["machine"] == "cpu x86_64"]
    assert list(cpu["run_label"]) == ["1111111", "2222222", "3333333"]
    bad = history.rows[history.rows["regressed"]]
    assert set(bad["run_label"]) == {"3333333"}
    assert set(zip(bad["case"], bad["backend"], strict=True)) == {("case00", "tlsim"), ("case01", "tlsim"),
                                                                  ("case02", "tlsim"), ("case02", "reference")}  # fmt: skip
    assert not history.rows[history.rows["machine"] == "cuda H200"]["regressed"].any(), "a new machine has no baseline"


def test_history_verb_prints_the_trend_and_writes_a_page_with_plots(runs, tmp_path, capsys, drawn_plots,
                                                                     plot_text_as_text):  # fmt: skip
    page = tmp_path / "history.html"
    assert main(["history", str(runs), "--html", str(page)]) == 0
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
