"""A run ends with PASS/FAIL, its counts, why rows skipped and the report's path; --version and bare harness."""

from __future__ import annotations

import pandas as pd
import pytest

import kernels.dispatch
from harness.cli.main import main
from harness.cli.terminal import verdict_lines

CASE_FILE = """
[[case]]
name = "tiny"
num_q_heads = 4
num_kv_heads = 2
head_dim = 32
block_size = 16
seq_lens = [40, 17]
"""


def _frame(statuses: list[tuple[str, str, str]]) -> pd.DataFrame:
    return pd.DataFrame([{"case": f"c{i}", "backend": b, "status": s, "reason": r} for i, (b, s, r) in
                         enumerate(statuses)])  # fmt: skip


def test_a_passing_run_counts_its_rows_and_groups_the_skips_by_backend_and_reason_most_first():
    frame = _frame([("tlsim", "pass", "")] * 3 + [("triton", "skip", "only small")] * 2 + [("cache", "skip", "x")])
    assert verdict_lines(frame, 0).splitlines() == [
        "PASS: 6 rows: 3 pass, 3 skip",
        "skip triton (2): only small",
        "skip cache (1): x",
    ]


def test_a_failing_run_puts_fail_and_error_first_and_cuts_long_or_many_reasons():
    rows = [("tlsim", "fail", "max abs"), ("triton", "error", "boom"), ("tlsim", "pass", "")]
    rows += [(f"b{i}", "skip", "r" * 200) for i in range(10)]
    lines = verdict_lines(_frame(rows), 1, most=3).splitlines()
    assert lines[0] == "FAIL: 13 rows: 1 fail, 1 error, 1 pass, 10 skip"
    assert len(lines) == 5 and all(len(line) <= 110 for line in lines[1:4]) and lines[1].endswith("...")
    assert lines[4] == "... and 7 more skips for 7 other reasons (the report lists them)"


@pytest.mark.parametrize("installed", [True, False])
def test_a_run_ends_with_the_verdict_and_why_triton_skipped(tmp_path, capsys, monkeypatch, installed):
    if not installed:  # what `pip install .` without Triton gives
        monkeypatch.setattr(kernels.dispatch, "has_triton", lambda: False)
    case_file = tmp_path / "tiny.toml"
    case_file.write_text(CASE_FILE)  # not tagged small: the interpreter skips it
    argv = ["run", str(case_file), "--out", str(tmp_path / "r"), "--no-progress", "--no-timing"]
    code = main(argv)  # every backend
    lines = capsys.readouterr().out.strip().splitlines()
    verdict = next(i for i, line in enumerate(lines) if line.startswith(("PASS: ", "FAIL: ")))
    assert lines[verdict].startswith("PASS: " if code == 0 else "FAIL: ") and " skip" in lines[verdict]
    assert lines[-1] == f"report: {tmp_path / 'r' / 'report.html'}", "the report's path is the last line"
    assert all(line.startswith("skip ") for line in lines[verdict + 1 : -1]), lines[verdict:]
    triton = [line for line in lines[verdict + 1 : -1] if line.startswith("skip triton (1): ")]
    why = "Triton is not installed" if not installed else "on the CPU it runs only cases tagged 'small'"
    assert len(triton) == 1 and why in triton[0], lines[verdict:]


def test_a_run_that_grades_nothing_ends_with_fail(tmp_path, capsys):
    case_file = tmp_path / "tiny.toml"
    case_file.write_text(CASE_FILE)
    argv = ["run", str(case_file), "--backend", "triton", "--out", str(tmp_path / "r"), "--no-progress"]
    assert main([*argv, "--no-timing"]) == 1
    assert capsys.readouterr().out.strip().splitlines()[-3:-1] == [
        "FAIL: 1 rows: 1 skip",
        "skip triton (1): the Triton interpreter is slow: on the CPU it runs only cases tagged 'small'",
    ]


def test_version_prints_the_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    out = capsys.readouterr().out.split()
    assert out[-1][0].isdigit() or out[-1] == "installed)", out


def test_bare_harness_prints_its_help_and_exits_0(capsys):
    assert main([]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("usage:") and "compare" in out and "exit codes:" in out and not err
