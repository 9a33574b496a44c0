"""The verbs beyond run: -k, backends, compare --json, bisect's search; the terminal words a run's rows right."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from harness.cli.bisect import search
from harness.cli.main import main
from harness.cli.options import compile_pattern
from harness.cli.terminal import row_printer, summarize, verdict_lines
from tests.harness import review_frames as rf

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
    new_frame = rf.frame(3, seed=2)
    new_frame.loc[0, "status"], new_frame.loc[0, "reason"] = "fail", "max abs err 1 at (token, head, dim) (0, 0, 0)"
    new = rf.write(new_frame, rf.meta(), tmp_path / "new")
    code = main(["compare", str(base), str(new), "--no-confirm", "--json"])
    out, err = capsys.readouterr()
    document = json.loads(out)  # stdout holds the JSON alone; the table went to stderr
    assert document["exit_code"] == code == 1 and str(new) in err
    assert len(document["rows"]) == len(new_frame) and not any(k.endswith("_samples_us") for k in document["rows"][0])
    worse = [r for r in document["rows"] if r["why"]]
    assert [(r["case"], r["backend"]) for r in worse] == [(new_frame.loc[0, "case"], new_frame.loc[0, "backend"])]
    assert main(["compare", str(base), str(new), "--no-confirm", "--json", str(tmp_path / "c.json")]) == 1
    assert json.loads((tmp_path / "c.json").read_text()) == document


def _frame(rows: list[dict]) -> pd.DataFrame:
    columns = ["case", "backend", "status", "reason", "tol_ratio", "max_abs_err", "atol", "rtol", "latency_us",
               "worst_location", "fail_count"]  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


def test_cuda_only_backends_skipped_on_a_cpu_share_one_verdict_line():
    rows = [{"case": f"c{i}", "backend": b, "status": "skip", "reason": f"{b} runs on cuda, not cpu"}
            for i in range(3) for b in ("varlen_flash", "flex_paged")]  # fmt: skip
    rows += [{"case": "c0", "backend": "tlsim", "status": "pass", "reason": ""}]
    rows += [{"case": "c0", "backend": "triton", "status": "skip", "reason": "triton only small"}]
    assert verdict_lines(_frame(rows), 0).splitlines() == [
        "PASS: 8 rows: 1 pass, 7 skip",
        "skip varlen_flash, flex_paged (3 each): runs on cuda, not cpu",
        "skip triton (1): triton only small",
    ]


@pytest.mark.parametrize(
    ("ratio", "words"),
    [(0.42, "closest to its tolerance: tlsim on c0: within it, at 0.42 of it"),
     (9.77, "furthest over its tolerance: tlsim on c0: 9.77x over it")],
)  # fmt: skip
def test_the_worst_row_is_worded_within_or_over_its_tolerance(ratio, words):
    status = "pass" if ratio <= 1 else "fail"
    row = {"case": "c0", "backend": "tlsim", "status": status, "reason": "max abs err", "tol_ratio": ratio,
           "max_abs_err": 1e-3, "atol": 1e-5, "rtol": 1e-4, "worst_location": "", "fail_count": 0}  # fmt: skip
    assert words in summarize(_frame([row]))


def test_a_failed_row_says_where_on_the_terminal_as_the_page_does():
    row = {"case": "c0", "backend": "mine", "status": "fail", "reason": "max abs err 0.5", "tol_ratio": 9.77,
           "max_abs_err": 0.5, "atol": 1e-5, "rtol": 1e-4, "worst_location": "seq 0, query 0, head 0",
           "fail_count": 311}  # fmt: skip
    assert ("FAIL: mine on c0: worst at seq 0, query 0, head 0, 311 elements outside the tolerance, error 9.77x "
            "the tolerance: max abs err 0.5") in summarize(_frame([row]))  # fmt: skip


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
