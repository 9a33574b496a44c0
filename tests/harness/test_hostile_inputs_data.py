"""Run folders, case files and the oracle cache are checked before use; what does not fit is exit 2."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


def _partial(folder: Path, name: str, file: str = PARTIAL_MARKER) -> Path:
    """``folder/.{name}.partial-{pid}`` of a process that has exited, holding ``file`` (by default the marker)."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    partial = folder / f".{name}.partial-{gone.pid}"
    partial.mkdir()
    (partial / file).write_text(f"{gone.pid}\n")
    return partial


def test_stale_cleanup_removes_only_partial_folders_carrying_the_marker_which_a_finished_run_does_not(tmp_path, runs):
    foreign, ours = _partial(tmp_path, "photos", "holiday.jpg"), _partial(tmp_path, "run")
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
    theirs = _partial(tmp_path, "theirs")
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


def test_the_sweep_limit_counts_every_table_and_can_be_raised(tmp_path, monkeypatch):
    from harness.cases.spec import CaseFileError, load_case_file

    path = write_cases(tmp_path / "two.toml", {"name": "a", "sweep": {"seed": [1, 2, 3]}},
                       {"name": "b", "sweep": {"seed": [1, 2], "block_size": [4, 8]}})  # fmt: skip
    monkeypatch.setenv("HARNESS_MAX_SWEEP_POINTS", "6")
    with pytest.raises(CaseFileError, match=r"7 cases, more than the limit of 6 .*case 'b': 4 = seed 2 x block_size 2"):
        load_case_file(path)
    monkeypatch.setenv("HARNESS_MAX_SWEEP_POINTS", "7")
    assert len(load_case_file(path)) == 7
    monkeypatch.setenv("HARNESS_MAX_SWEEP_POINTS", "6")
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--backend", "reference", "--no-timing",
                 "--no-progress", "--max-sweep-points", "7"]) == 0  # fmt: skip
    assert os.environ["HARNESS_MAX_SWEEP_POINTS"] == "7"  # the flag sets it (monkeypatch restores it)


def test_sequences_are_counted_over_the_sweep_before_any_point_is_built(tmp_path, monkeypatch):
    """A sweep's sequences are counted before any point is built; one list past MAX_SEQS is refused by field."""
    from harness.cases import spec

    built = []
    monkeypatch.setattr(spec, "expand_spec", lambda *a: built.append(a) or [])
    wide = write_cases(
        tmp_path / "wide.toml", {"name": "w", "seq_lens": [7] * 600, "sweep": {"seed": list(range(2000))}}
    )
    with pytest.raises(
        spec.CaseFileError, match=r"wide.toml: case 'w': field 'seq_lens': 2,000 case\(s\) of up to 600"
    ):
        spec.load_case_file(wide)
    assert not built
    monkeypatch.undo()
    long = write_cases(tmp_path / "long.toml", {"name": "l", "seq_lens": [7] * (spec.MAX_SEQS + 1)})
    with pytest.raises(spec.CaseFileError, match=r"long.toml: case 'l': field 'seq_lens'.*at most 4096 items"):
        spec.load_case_file(long)
    assert len(spec.load_case_file(write_cases(tmp_path / "ok.toml", {"name": "o", "seq_lens": [7] * 600, "q_lens": 1,
                                                                      "sweep": {"seed": [1, 2]}}))) == 2  # fmt: skip


def test_a_run_folder_and_a_journal_are_sized_before_they_are_read(tmp_path, monkeypatch, capsys):
    """A results.parquet is sized by its metadata before pandas reads it; meta.json and journals by their size."""
    from harness.results import journal, storage

    run = tmp_path / "run"
    run.mkdir()
    pd.DataFrame({"case": ["c"] * 11, "backend": ["b"] * 11, "status": ["pass"] * 11}).to_parquet(
        run / "results.parquet"
    )
    (run / "meta.json").write_text("{}")
    monkeypatch.setattr(pd, "read_parquet", lambda *a, **k: pytest.fail("read before it was sized"))
    monkeypatch.setattr(storage, "MAX_ROWS", 10)
    assert main(["report", str(run)]) == 2
    assert f"{run / 'results.parquet'}: 11 rows, 0.0 GiB uncompressed: past the 10 rows" in capsys.readouterr().err
    monkeypatch.setattr(storage, "MAX_META_BYTES", 1)
    assert main(["report", str(run)]) == 2
    assert f"{run / 'meta.json'}: 2 bytes, past the 1 a meta.json may hold" in capsys.readouterr().err
    (tmp_path / "stopped.journal.jsonl").write_text('{"journal": 1}\n')
    monkeypatch.setattr(journal, "MAX_BYTES", 4)
    assert main(["run", "--resume", str(tmp_path / "stopped")]) == 2
    assert "stopped.journal.jsonl: 15 bytes, past the 4 a journal may hold" in capsys.readouterr().err
