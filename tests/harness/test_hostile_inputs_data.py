"""Run folders, case files and the oracle cache are checked before use; what does not fit is exit 2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.cases import spec
from harness.cli.main import main
from harness.results.schemas import COLUMN_KINDS, FLAG, NUMBER, SAMPLES, SCALAR, TEXT
from harness.results.storage import PARTIAL_MARKER, stale_leftovers
from tests.fresh_python import run_script
from tests.harness import review_frames as rf
from tests.tiny_cases import write_cases

# A value of another kind than each meta.json field (by its JSON kind) and each results.parquet column holds.
WRONG = {"str": "fast", "number": 5, "bool": True, "list": [1, "x"], "dict": {"a": "b"}}
# The JSON kind of a value: numbers are one kind (an int is a valid float).
KIND = {bool: "bool", int: "number", float: "number", str: "str", list: "list", dict: "dict"}
WRONG_VALUE = {TEXT: 7, NUMBER: "fast", SCALAR: {"a": 1}, SAMPLES: "fast", FLAG: "yes"}


def _bad_meta(runs: Path, data) -> tuple[Path, Path, str]:
    good = runs / "untimed"
    meta = json.loads((good / "meta.json").read_text())
    fields = {key: value for key, value in meta.items() if value is not None}
    fields |= {f"ceilings.{k}": v for k, v in meta["ceilings"].items() if v is not None}  # nested fields too
    field = data.draw(st.sampled_from(sorted(fields)), label="field")
    wrong = WRONG[data.draw(st.sampled_from([k for k in WRONG if k != KIND[type(fields[field])]]), label="kind")]
    outer, _, inner = field.partition(".")
    bad = rf.copy_run(good, {outer: {**meta[outer], inner: wrong} if inner else wrong})
    return good, bad, f"{bad / 'meta.json'}: field '{field}'"


def _bad_column(runs: Path, data) -> tuple[Path, Path, str]:
    good = runs / data.draw(st.sampled_from(["untimed", "timed"]), label="run")
    columns = [c for c in pd.read_parquet(good / "results.parquet").columns if c in COLUMN_KINDS]
    column = data.draw(st.sampled_from(columns), label="column")
    value = WRONG_VALUE[COLUMN_KINDS[column]]
    bad = rf.copy_run(good, frame_fn=lambda frame: frame.assign(**{column: [value] * len(frame)}))
    return good, bad, f"{bad / 'results.parquet'}: column '{column}'"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_meta_field_or_results_column_of_another_type_is_bad_input(runs, capsys, data):
    good, bad, words = data.draw(st.sampled_from([_bad_meta, _bad_column]), label="file")(runs, data)
    verb = data.draw(st.sampled_from(["compare", "history"]), label="verb")
    assert main([verb, str(good), str(bad)]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err, err


# --- run folders: the stale cleanup ----------------------------------------------------------


def test_stale_cleanup_removes_only_partial_folders_carrying_the_marker_which_a_finished_run_does_not(tmp_path, runs):
    foreign, ours = rf.partial(tmp_path, "photos", "holiday.jpg"), rf.partial(tmp_path, "run")
    messages = stale_leftovers(tmp_path)
    assert (foreign / "holiday.jpg").exists() and not ours.exists()
    assert any(f"kept {foreign}" in m for m in messages) and any(f"removed {ours}" in m for m in messages)
    assert not (runs / "untimed" / PARTIAL_MARKER).exists()


def test_stale_cleanup_says_a_stopped_run_is_stopped_and_leaves_other_users_runs_alone(tmp_path, monkeypatch):
    """An --out under a shared folder (/tmp) looks only at this user's leftovers there."""
    from harness.results.journal import Journal

    Journal.create(tmp_path / "mine", {"cases": []}).close(stopped=True)
    assert stale_leftovers(tmp_path) == [
        f"note: unfinished run: 0 rows in {tmp_path / 'mine.journal.jsonl'} (stopped); "
        f"finish it with: python -m harness run --resume {tmp_path / 'mine'}"
    ]
    theirs = rf.partial(tmp_path, "theirs")
    monkeypatch.setattr(os, "getuid", lambda: os.stat(tmp_path).st_uid + 1)  # as another user sees them
    assert stale_leftovers(tmp_path) == [] and theirs.exists()


# --- case files: sweeps counted before they are built -----------------------------------------------


def test_a_six_field_sweep_of_600m_points_is_refused_fast_and_small(tmp_path, monkeypatch):
    """Six swept fields, 30 x 29^5 = 615M points (615,334,470), in 888 bytes."""
    values = lambda n, first: "[" + ", ".join(str(first + i) for i in range(n)) + "]"  # noqa: E731
    text = (
        '[[case]]\nname = "huge"\nnum_q_heads = 8\nhead_dim = 64\nseq_lens = [16]\n[case.sweep]\n'
        f"num_kv_heads = {values(29, 1)}\nblock_size = {values(29, 1)}\nseed = {values(30, 0)}\n"
        f"head_dim = {values(29, 16)}\nq_lens = {values(29, 1)}\n"
        "input_scale = [" + ", ".join(f"{1 + i / 10:g}" for i in range(29)) + "]\n"
    )
    huge = tmp_path / "huge.toml"
    huge.write_text(text + "# " + "-" * (888 - len(text) - 3) + "\n")  # the reported file's 888 bytes
    assert huge.stat().st_size == 888
    # The peak RSS is VmHWM of /proc/self/status: getrusage's ru_maxrss in a child starts at the RSS of
    # the process that forked it (Linux carries the high-water mark across fork and exec), here pytest's.
    probe = (
        "import sys, time\n"
        "from harness.cli.main import main\n"
        "start = time.perf_counter()\n"
        f"code = main(['run', {str(huge)!r}, '--out', {str(tmp_path / 'out')!r}, '--no-timing'])\n"
        "seconds = time.perf_counter() - start\n"
        "peak = [line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM:')][0]\n"
        "print('RESULT', code, seconds, peak)\n"
    )
    monkeypatch.delenv("HARNESS_MAX_SWEEP_POINTS", raising=False)
    result = run_script("-c", probe, timeout=120)
    assert "RESULT" in result.stdout, result.stderr[-2000:]
    code, seconds, peak_kib = result.stdout.split("RESULT")[-1].split()
    assert int(code) == 2, result.stderr[-2000:]
    assert float(seconds) < 5.0  # from the call to the refusal (the imports before it excluded)
    assert int(peak_kib) < 500 * 1024  # the whole process, torch's import included (about 300 MiB)
    assert "615,334,470 cases, more than the limit of 10,000" in result.stderr
    assert "num_kv_heads 29 x block_size 29 x seed 30 x head_dim 29 x q_lens 29 x input_scale 29" in result.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.journal.jsonl").exists()


SWEPT = ({"name": "a", "sweep": {"seed": [1, 2, 3]}}, {"name": "b", "sweep": {"seed": [1, 2], "block_size": [4, 8]}})
# a case file against the sweep limit (HARNESS_MAX_SWEEP_POINTS): (its cases, the limit, the cases built before the
# refusal, the refusal's words, or the number of cases loaded); every table counts, sequences too, before any is built
SWEEPS = {
    "7_points_past_a_limit_of_6": (SWEPT, "6", 0, r"c.toml: field 'sweep': 7 cases, more than the limit of 6 "
                                   r".*case 'b': 4 = seed 2 x block_size 2"),
    "7_points_within_a_raised_limit_of_7": (SWEPT, "7", 2, 7),
    "2000_points_of_600_sequences": (({"name": "w", "seq_lens": [7] * 600, "sweep": {"seed": list(range(2000))}},),
                                     None, 0, r"c.toml: case 'w': field 'seq_lens': 2,000 case\(s\) of up to 600"),
    "2_points_of_600_sequences": (({"name": "o", "seq_lens": [7] * 600, "q_lens": 1, "sweep": {"seed": [1, 2]}},),
                                  None, 1, 2),
    "one_list_past_max_seqs_refused_by_field": (({"name": "l", "seq_lens": [7] * (spec.MAX_SEQS + 1)},), None, 1,
                                                r"c.toml: case 'l': field 'seq_lens'.*at most 4096 items"),
}  # fmt: skip


@pytest.mark.parametrize("name", SWEEPS)
def test_a_sweep_is_counted_against_its_limit_before_any_point_is_built(tmp_path, monkeypatch, name):
    cases, limit, built_before, outcome = SWEEPS[name]
    monkeypatch.setenv("HARNESS_MAX_SWEEP_POINTS", limit or "")  # empty: the default limit
    built, expand = [], spec.expand_spec
    monkeypatch.setattr(spec, "expand_spec", lambda *a: built.append(a) or expand(*a))
    path = write_cases(tmp_path / "c.toml", *cases)
    if isinstance(outcome, int):
        assert len(spec.load_case_file(path)) == outcome
    else:
        with pytest.raises(spec.CaseFileError, match=outcome):
            spec.load_case_file(path)
    assert len(built) == built_before


def test_max_sweep_points_raises_the_limit_for_the_run(tmp_path, monkeypatch):
    path = write_cases(tmp_path / "two.toml", *SWEPT)
    monkeypatch.setenv("HARNESS_MAX_SWEEP_POINTS", "6")
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--backend", "reference", "--no-timing",
                 "--no-progress", "--max-sweep-points", "7"]) == 0  # fmt: skip
    assert os.environ["HARNESS_MAX_SWEEP_POINTS"] == "7"  # the flag sets it (monkeypatch restores it)
