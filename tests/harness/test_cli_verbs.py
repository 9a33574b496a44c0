"""The verbs beyond run (-k, backends, compare --json, bisect, --version) and the terminal: rows, output, verdict."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import kernels.dispatch
from harness.cli.bisect import search
from harness.cli.main import main
from harness.cli.options import compile_pattern
from harness.cli.terminal import row_printer, summarize, verdict_lines
from harness.execute.output import report_output
from tests.fresh_python import ROOT, git_in
from tests.harness import review_frames as rf
from tests.tiny_cases import write_cases

IDS = ["decode/dtype=float32", "decode/dtype=bfloat16", "prefill_long", "chunked_prefill/dtype=float32", "mla_decode"]


@pytest.mark.parametrize(
    ("expression", "picked"),
    [
        ("decode", ["decode/dtype=float32", "decode/dtype=bfloat16", "mla_decode"]),
        ("decode and not bfloat16", ["decode/dtype=float32", "mla_decode"]),
        ("prefill*", ["prefill_long"]),  # a glob matches the whole id
        ("*prefill*", ["prefill_long", "chunked_prefill/dtype=float32"]),
        ("(mla or chunked) and float32", ["chunked_prefill/dtype=float32"]),
        ("DECODE/dtype=FLOAT32", ["decode/dtype=float32"]),  # any case
        ("not (decode or prefill)", []),
        ("mla_decode or prefill_long and chunked", ["mla_decode"]),  # and binds tighter than or
    ],
)
def test_k_picks_case_ids_as_pytest_does(expression, picked):
    matches = compile_pattern(expression)
    assert [i for i in IDS if matches(i)] == picked


def test_list_and_run_take_only_the_cases_k_picks(tmp_path, capsys):
    assert main(["list", "smoke", "-k", "decode_gqa and not bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "decode_gqa/dtype=float32" in out and "decode_gqa/dtype=bfloat16" not in out and out.endswith("2 cases\n")
    out = tmp_path / "run"
    argv = ["run", "smoke", "-k", "decode_gqa/dtype=float32", "--backend", "reference", "--no-timing"]
    assert main([*argv, "--no-progress", "--out", str(out)]) == 0
    assert list(pd.read_parquet(out / "results.parquet")["case"]) == ["decode_gqa/dtype=float32"]


def test_backends_lists_every_backend_with_its_devices_variants_and_why_it_cannot_run_here(capsys):
    from harness.backends.builtin import REGISTRY

    assert main(["backends", "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["backend", "kind", "devices", "runs", "here", "(cpu)", "variants"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(rows) == set(REGISTRY)
    assert "no: runs on cuda, not cpu" in rows["varlen_flash"] and rows["varlen_flash"].endswith("sliding_window")
    assert rows["reference"].split()[3:] == ["yes", "all"]
    assert "smoke cases (others: the Triton interpreter is slow" in rows["triton"]


def test_compare_json_writes_every_row_and_the_exit_code_to_stdout_or_a_file(tmp_path, capsys):
    base = rf.write(rf.frame(3, seed=1), rf.meta(), tmp_path / "base")
    new_frame = rf.with_row(rf.frame(3, seed=2), "case00", "reference", status="fail", reason="max abs err 1")
    new = rf.write(new_frame, rf.meta(), tmp_path / "new")
    code = main(["compare", str(base), str(new), "--no-confirm", "--json"])
    out, err = capsys.readouterr()
    document = json.loads(out)  # stdout holds the JSON alone; the table went to stderr
    assert document["exit_code"] == code == 1 and str(new) in err
    assert len(document["rows"]) == len(new_frame) and not any(k.endswith("_samples_us") for k in document["rows"][0])
    worse = [r for r in document["rows"] if r["why"]]
    assert [(r["case"], r["backend"]) for r in worse] == [("case00", "reference")]
    assert main(["compare", str(base), str(new), "--no-confirm", "--json", str(tmp_path / "c.json")]) == 1
    assert json.loads((tmp_path / "c.json").read_text()) == document


def _frame(rows: list[dict]) -> pd.DataFrame:
    columns = ["case", "backend", "status", "reason", "tol_ratio", "max_abs_err", "atol", "rtol", "latency_us",
               "worst_location", "fail_count"]  # fmt: skip
    return pd.DataFrame([{"case": f"c{i}", **row} for i, row in enumerate(rows)], columns=columns)


def _tolerance_row(status: str, tol_ratio: float, **extra) -> dict:
    return {"backend": "tlsim", "status": status, "reason": "max abs err", "tol_ratio": tol_ratio, "max_abs_err": 1e-3,
            "atol": 1e-5, "rtol": 1e-4, "worst_location": "", "fail_count": 0, **extra}  # fmt: skip


@pytest.mark.parametrize(
    ("row", "words"),
    [(_tolerance_row("pass", 0.42), "closest to its tolerance: tlsim on c0: within it, at 0.42 of it"),
     (_tolerance_row("fail", 9.77), "furthest over its tolerance: tlsim on c0: 9.77x over it"),
     (_tolerance_row("fail", 9.77, backend="mine", reason="max abs err 0.5", max_abs_err=0.5,
                     worst_location="seq 0, query 0, head 0", fail_count=311),  # where, on the terminal as on the page
      "FAIL: mine on c0: worst at seq 0, query 0, head 0, 311 elements outside the tolerance, error 9.77x the "
      "tolerance: max abs err 0.5"),
     (_tolerance_row("fail", float("inf"), reason="512 NaN/inf outputs", fail_count=512),  # no error ratio to give
      "FAIL: tlsim on c0: 512 elements outside the tolerance: 512 NaN/inf outputs")],
)  # fmt: skip
def test_the_summary_words_the_worst_row_within_or_over_its_tolerance_and_where_a_row_failed(row, words):
    assert words in summarize(_frame([row]))


def test_the_row_lines_say_a_cuda_only_backend_once_not_once_a_row(capsys):
    show = row_printer({"varlen_flash": "runs on cuda, not cpu", "flex_paged": "runs on cuda, not cpu"}, 28)
    for backend, status in (("varlen_flash", "skip"), ("tlsim", "pass"), ("flex_paged", "skip")):
        show({"case": "c0", "backend": backend, "status": status})
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "skip varlen_flash, flex_paged (28 cases each): runs on cuda, not cpu"
    assert len(lines) == 2 and lines[1].endswith("c0 tlsim: pass")


@pytest.mark.parametrize("first_bad", range(6))
def test_bisect_finds_the_first_bad_commit_in_about_log2_steps(first_bad):
    commits = [f"c{i}" for i in range(6)]
    asked = []

    def judge(commit):
        asked.append(commit)
        return "bad" if commits.index(commit) >= first_bad else "good"

    outcome, _, hi = search(commits, judge)
    assert outcome == "found" and commits[hi] == commits[first_bad]
    assert len(asked) <= 4 and len(set(asked)) == len(asked), asked  # ceil(log2(6)) + BAD itself, none twice


def test_bisect_says_when_bad_is_not_bad_and_where_an_undecided_step_leaves_it():
    commits = [f"c{i}" for i in range(5)]
    assert search(commits, lambda c: "good")[0] == "not bad"
    outcome, lo, hi = search(commits, lambda c: "undecided" if c == "c2" else "good")
    assert outcome == "undecided" and commits[lo + 1 : hi + 1] == ["c2", "c3", "c4"]  # c1 was judged good


def _untagged_case(tmp_path) -> Path:
    return write_cases(tmp_path / "tiny.toml", {"name": "tiny", "block_size": 16, "seq_lens": [40, 17], "q_lens": 1})


CUDA_ONLY = [(b, "skip", f"{b} runs on cuda, not cpu") for b in ("varlen_flash", "flex_paged")] * 3
VERDICT_LINES = {
    "cuda-only backends skipped on a cpu share one line": (
        [*CUDA_ONLY, ("tlsim", "pass", ""), ("triton", "skip", "triton only small")], 0, 8,
        ["PASS: 8 rows: 1 pass, 7 skip", "skip varlen_flash, flex_paged (3 each): runs on cuda, not cpu",
         "skip triton (1): triton only small"]),
    "skips grouped by backend and reason, most first": (
        [("tlsim", "pass", "")] * 3 + [("triton", "skip", "only small")] * 2 + [("cache", "skip", "x")], 0, 8,
        ["PASS: 6 rows: 3 pass, 3 skip", "skip triton (2): only small", "skip cache (1): x"]),
    "fail and error first, long and many reasons cut": (
        [("tlsim", "fail", "max abs"), ("triton", "error", "boom"), ("tlsim", "pass", "")]
        + [(f"b{i}", "skip", "r" * 200) for i in range(10)], 1, 3,
        ["FAIL: 13 rows: 1 fail, 1 error, 1 pass, 10 skip", *(f"skip b{i} (1): {'r' * 94}..." for i in range(3)),
         "... and 7 more skips for 7 other reasons (the report lists them)"]),
}  # fmt: skip


@pytest.mark.parametrize("name", VERDICT_LINES)
def test_the_verdict_counts_the_rows_then_the_skips_by_reason(name):
    rows, code, most, lines = VERDICT_LINES[name]
    frame = _frame([{"backend": b, "status": s, "reason": r} for b, s, r in rows])
    assert verdict_lines(frame, code, most=most).splitlines() == lines


@pytest.mark.parametrize("installed", [True, False])
def test_a_run_ends_with_the_verdict_and_why_triton_skipped(tmp_path, capsys, monkeypatch, installed):
    if not installed:  # what `pip install .` without Triton gives
        monkeypatch.setattr(kernels.dispatch, "has_triton", lambda: False)
    case_file = _untagged_case(tmp_path)  # not tagged small: the interpreter skips it
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


@pytest.mark.parametrize(
    ("backends", "said", "verdict"),
    [(["triton"], "nothing was graded: ", ["FAIL: 1 row: 1 skip", "skip triton (1): the Triton interpreter is slow: "
                                           "on the CPU it runs only cases tagged 'small'"]),
     (["flex_attention", "tlsim"], "--backend flex_attention ran on no case",
      ["FAIL: 2 rows: 1 pass, 1 skip", "skip flex_attention (1): flex_attention runs on cuda, not cpu"])],
    ids=["grades_nothing", "skips_a_requested_backend_on_every_case"],
)  # fmt: skip
def test_a_run_that_grades_nothing_or_runs_a_requested_backend_on_no_case_ends_with_fail(tmp_path, capsys, backends,
                                                                                         said, verdict):  # fmt: skip
    argv = ["run", str(_untagged_case(tmp_path)), "--out", str(tmp_path / "r"), "--no-progress", "--no-timing"]
    assert main([*argv, *(arg for name in backends for arg in ("--backend", name))]) == 1
    out, err = capsys.readouterr()
    assert said in err and (tmp_path / "r").is_dir(), "the report is still written"
    assert out.strip().splitlines()[-3:-1] == verdict


def test_bare_harness_prints_its_help_and_version_the_version_both_exit_0(capsys):
    assert main([]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("usage:") and "compare" in out and "exit codes:" in out and not err
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    out = capsys.readouterr().out.split()
    assert out[-1][0].isdigit() or out[-1] == "installed)", out


def test_a_closed_stdout_is_exit_141_without_a_traceback():
    child = subprocess.Popen([sys.executable, "-m", "harness", "schema"], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)  # fmt: skip
    child.stdout.close()  # the pipe's reader is gone before the schema is written (importing torch takes seconds)
    stderr = child.stderr.read().decode()
    assert child.wait(timeout=120) == 141, stderr
    assert "internal error" not in stderr and "Traceback" not in stderr


# --- continuous and bisect on real commits: a kernel 50 ms a call slower in the second, timed in paired rounds ----


PLUGIN = '''
import time

from harness import register_backend


def slowpoke(q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, scale=None, out=None):
    """The reference kernel, then a wait that each commit's slowpoke_kernel.py sets."""
    import slowpoke_kernel  # from the commit's checkout

    from kernels import paged_attention_reference

    result = paged_attention_reference(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, out)
    end = time.perf_counter() + slowpoke_kernel.WAIT_S
    while time.perf_counter() < end:
        pass
    return result


register_backend("slowpoke", slowpoke, devices=("cpu",))
'''
WAITS = {"first": 0.0, "second": 0.05, "third": 0.05}  # the second commit is the slower one (by 50 ms a call)


@pytest.fixture
def repo(tmp_path, monkeypatch, case_file):
    """A repository (the cwd) of three commits of slowpoke_kernel.py, plugin and case_file beside it; short rounds."""
    monkeypatch.setattr("harness.review.confirm.ROUND_S", 0.1)
    root = tmp_path / "repo"
    git = git_in(root)
    monkeypatch.chdir(root)
    for name, wait in WAITS.items():
        (root / "slowpoke_kernel.py").write_text(f"WAIT_S = {wait}  # {name}\n")
        git("add", "slowpoke_kernel.py")
        git("commit", "-q", "-m", name)
    (tmp_path / "plugin.py").write_text(PLUGIN)
    return tmp_path


@pytest.mark.slow
@pytest.mark.timeout(600)  # fresh worker processes each round: slow on a loaded machine
def test_continuous_runs_both_commits_and_confirms_the_slowdown_in_paired_rounds(repo, capsys):
    common = ["--cases", str(repo / "tiny.toml"), "--plugin", str(repo / "plugin.py"), "--backend", "slowpoke"]
    argv = ["continuous", "HEAD~2", "HEAD", *common, "--min-effect", "0.5", "--out", str(repo / "runs"), "--json",
            "--confirm-time", "3000"]  # fmt: skip
    assert main(argv) == 1
    out, err = capsys.readouterr()
    (row,) = json.loads(out)["rows"]
    assert row["verdict"] == "slower" and "paired rounds" in row["verdict_reason"] and row["ratio"] > 2, row
    assert (repo / "runs" / "base" / "results.parquet").is_file() and (repo / "runs" / "head" / "meta.json").is_file()
    assert "continuous: base" in err and "continuous: head" in err


@pytest.mark.slow
@pytest.mark.timeout(600)  # fresh worker processes each round: slow on a loaded machine
def test_bisect_names_the_first_commit_where_the_row_got_slower(repo, capsys, clean_registry):
    argv = ["bisect", "HEAD~2", "HEAD", "--case", "tiny", "--backend", "slowpoke", "--cases", str(repo / "tiny.toml"),
            "--plugin", str(repo / "plugin.py"), "--min-effect", "0.5", "--step-time", "3000"]  # fmt: skip
    assert main(argv) == 0  # registers the plugin's backend in this process, as a run does: clean_registry
    out, err = capsys.readouterr()
    assert out.startswith("first slower commit: ") and out.strip().endswith(" second"), out
    assert "bisect: 2 commit(s) after" in err


# --- a row's output reaches the terminal as a block; a known-harmless warning is named once a run ------------------


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


def test_each_harmless_interpreter_warning_is_one_line_a_run_not_a_block_a_row(tmp_path, capsys):
    texts = [INTERPRETER_WARNING + OVERFLOW_WARNING, OVERFLOW_WARNING, INTERPRETER_WARNING]
    for run in ("first", "second"):
        for i, log in enumerate(_row_logs(tmp_path, run, *texts)):
            report_output(log, f"mine on case{i}")
    notes = capsys.readouterr().err.splitlines()  # these notes and nothing else: no row's block
    assert [note.split("'")[1] for note in notes] == ["invalid value encountered in subtract",
                                                      "overflow encountered in exp"] * 2  # fmt: skip
    assert notes[0].startswith("note: mine on case0 printed 'invalid value encountered in subtract'")
    assert "first/logs" in notes[0] and "second/logs" in notes[2]
    staged = tmp_path / "first.logs"
    assert [(staged / f"case{i}__mine.log").read_text() for i in range(3)] == texts, "the logs keep every warning"


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
