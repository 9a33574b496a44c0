"""A row's output reaches the terminal as a block; a known-harmless warning is named once a run."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.execute.output import report_output

# What Triton's interpreter leaves in a row's log when a kernel computes exp(-inf - -inf), as printed.
INTERPRETER_WARNING = (
    "/venv/lib/python3.11/site-packages/triton/runtime/interpreter.py:599: RuntimeWarning: invalid value "
    "encountered in subtract\n  output = op(lhs.data, rhs.data)\n"
)
OVERFLOW_WARNING = (
    "/venv/lib/python3.11/site-packages/triton/runtime/interpreter.py:704: RuntimeWarning: overflow "
    "encountered in exp\n  create_exp = lambda self, arg: self.unary_op(arg, np.exp)\n"
)
OWN_WARNING = "/home/me/my_kernel.py:12: UserWarning: falling back to the slow path\n  warnings.warn(msg)\n"


def _row_logs(tmp_path, run: str, *texts: str) -> list[tuple[str, str]]:
    """One staged log per text, as harness.execute.output.row_log names them: (staged, final) paths."""
    logs = []
    for i, text in enumerate(texts):
        staged = tmp_path / f"{run}.logs" / f"case{i}__mine.log"
        staged.parent.mkdir(exist_ok=True)
        staged.write_text(text)
        logs.append((str(staged), str(tmp_path / run / "logs" / staged.name)))
    return logs


def test_a_harmless_interpreter_warning_on_every_row_is_one_line_a_run_not_a_block_a_row(tmp_path, capsys):
    logs = _row_logs(tmp_path, "run", *[INTERPRETER_WARNING] * 5)
    for i, log in enumerate(logs):
        report_output(log, f"mine on case{i}")
    err = capsys.readouterr().err
    assert "--- output of" not in err
    (line,) = err.splitlines()
    assert line.startswith("note: mine on case0 printed 'invalid value encountered in subtract'") and "run/logs" in line
    assert all(Path(staged).read_text() == INTERPRETER_WARNING for staged, _ in logs), "the logs keep every warning"


def test_each_run_and_each_harmless_notice_is_named_once(tmp_path, capsys):
    for run in ("first", "second"):
        for log in _row_logs(tmp_path, run, INTERPRETER_WARNING + OVERFLOW_WARNING, OVERFLOW_WARNING):
            report_output(log, "mine")
    notes = capsys.readouterr().err.splitlines()
    assert [note.split("'")[1] for note in notes] == ["invalid value encountered in subtract",
                                                      "overflow encountered in exp"] * 2  # fmt: skip


@pytest.mark.parametrize(
    ("text", "shown", "hidden"),
    [
        (INTERPRETER_WARNING + "step 3: 0.25\n", "step 3: 0.25", "RuntimeWarning"),
        (OWN_WARNING, "UserWarning: falling back to the slow path", None),
        ("triton/runtime/interpreter.py:1: RuntimeWarning: something new\n", "something new", None),
    ],
    ids=["the rest of a row's output", "a plugin's own warning", "an interpreter warning not known harmless"],
)
def test_what_is_not_known_harmless_is_still_shown_as_the_rows_block(tmp_path, capsys, text, shown, hidden):
    (log,) = _row_logs(tmp_path, "run", text)
    report_output(log, "mine on case0")
    err = capsys.readouterr().err
    block = err[err.index("--- output of mine on case0") :]
    assert shown in block and (hidden is None or hidden not in block)
