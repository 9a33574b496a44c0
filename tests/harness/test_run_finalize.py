"""A stopped run whose machine is gone: `run --resume RUN --finalize` writes its folder from the journal."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import kernels
from harness import register_backend
from harness.cases.loading import load_cases
from harness.cli.main import main
from harness.execute.shards import shard_cases
from harness.results.journal import Journal, journal_path
from tests.tiny_cases import write_cases


def _stopped_run(tmp_path, keep_rows: int, meta: dict | None, cases=None, backends=("reference", "tlsim"), shard=None):
    """A finished run's first ``keep_rows`` rows in the journal of a run (of the same ``shard``) that 'stopped'."""
    cases = cases or str(write_cases(tmp_path / "c.toml", {"name": "first"}, {"name": "second", "seed": 1}))
    flags = [arg for backend in backends for arg in ("--backend", backend)] + ["--shard", shard] * bool(shard)
    assert main(["run", cases, *flags, "--no-timing", "--no-progress", "--out", str(tmp_path / "whole")]) == 0
    rows = pd.read_parquet(tmp_path / "whole" / "results.parquet").to_dict("records")
    stopped = tmp_path / "stopped"
    shards = {"shard": shard} if shard else {}
    options = {"cases": [cases], "backends": list(backends), "device": "cpu", "plugins": [], "tags": None,
               "timing": False, "isolate": "plugins", "timeout": None, **shards}  # fmt: skip
    journal = Journal.create(stopped, options)
    if meta is not None:
        journal.record_meta(meta)
    for row in rows[:keep_rows]:
        journal.append(row)
    journal.close(stopped=True)
    return stopped, rows


@pytest.mark.parametrize("recorded", [{"device": "cuda", "device_name": "NVIDIA H200", "commit": "abc"}, None],
                         ids=["its_own_meta", "an_old_journals_without_meta_said_so_not_this_machines_borrowed"])  # fmt: skip
def test_finalize_writes_its_rows_with_the_runs_meta_and_lists_what_never_ran_on_the_page(tmp_path, capsys, recorded):
    stopped, rows = _stopped_run(tmp_path, 3, recorded)
    capsys.readouterr()
    assert main(["run", "--resume", str(stopped), "--finalize"]) == 4  # what ran passes; not all of it ran
    frame = pd.read_parquet(stopped / "results.parquet")
    assert len(frame) == 3 and list(frame["case"]) == [r["case"] for r in rows[:3]]
    meta = json.loads((stopped / "meta.json").read_text())
    kept = ("device_name", "commit")  # the run's meta, never this machine's
    assert {key: meta.get(key) for key in kept} == {key: (recorded or {}).get(key) for key in kept}
    assert ("meta_unknown" in meta["incomplete"]) == (recorded is None) and ("device_name" in meta) == bool(recorded)
    assert meta["incomplete"]["missing_pairs"] == 1 and meta["incomplete"]["missing"] == ["second tlsim"]
    assert not journal_path(stopped).exists()
    page = (stopped / "report.html").read_text()
    assert 'id="incomplete"' in page and "1 (case, backend) pair never ran" in page
    out = capsys.readouterr()
    assert "1 (case, backend) pairs never ran" in out.err and "INCOMPLETE: 3 rows: 3 pass" in out.out
    assert "PASS" not in out.out


def test_finalize_refuses_an_empty_journal_and_keeps_it(tmp_path, capsys):
    stopped, _ = _stopped_run(tmp_path, 0, None)
    before = journal_path(stopped).read_bytes()
    assert main(["run", "--resume", str(stopped), "--finalize"]) == 2
    assert "holds no row" in capsys.readouterr().err and journal_path(stopped).read_bytes() == before


def test_a_run_records_its_meta_in_the_journal_before_its_first_row(tmp_path, clean_registry):
    out, seen = tmp_path / "run", []

    def peek(*args, **kwargs):  # the journal's meta devices, read at the first call
        lines = journal_path(out).read_text().splitlines()
        seen.append([json.loads(line)["meta"]["device"] for line in lines if '"meta"' in line])
        return kernels.paged_attention_reference(*args, **kwargs)

    register_backend("peek", peek)
    cases = write_cases(tmp_path / "c.toml", {"name": "first"})
    assert main(["run", str(cases), "--isolate", "none", "--backend", "peek", "--no-timing", "--no-progress",
                 "--out", str(out)]) == 0  # fmt: skip
    assert seen[0][:1] == ["cpu"]


def test_a_journal_reads_back_its_meta_and_samples_as_json_values_not_text(tmp_path):
    """Nested meta values and timing samples (lists, or older journals' text "[1.5, 2.0]") read back as JSON."""
    journal = Journal.create(tmp_path / "run", {"cases": [], "backends": None, "device": "cuda"})
    journal.record_meta({"device": "cuda", "ceilings": {"read_gbps": 4210.5}, "load_average": (1.0, 2.0)})
    journal.append({"case": "c", "backend": "b", "status": "pass", "latency_samples_us": (1.5, 2.0)})
    journal._write({"case": "d", "backend": "b", "status": "pass", "latency_samples_us": "[3.0, 4.5]"})  # as text
    journal.close(stopped=True)
    read = Journal.read(journal_path(tmp_path / "run"))
    meta = read.header["meta"]
    assert meta["ceilings"] == {"read_gbps": 4210.5} and meta["load_average"] == [1.0, 2.0]
    assert [r["latency_samples_us"] for r in read.rows] == [[1.5, 2.0], [3.0, 4.5]]


def test_a_journal_whose_case_files_are_gone_is_still_written_saying_what_is_unknown(tmp_path):
    stopped, _ = _stopped_run(tmp_path, 3, {"device": "cuda", "device_name": "NVIDIA H200"})
    (tmp_path / "c.toml").unlink()  # a journal brought from another machine
    assert main(["run", "--resume", str(stopped), "--finalize"]) == 4
    meta = json.loads((stopped / "meta.json").read_text())
    assert meta["incomplete"]["missing_pairs"] is None and "not known here" in meta["incomplete"]["missing_unknown"]
    assert len(pd.read_parquet(stopped / "results.parquet")) == 3
    assert "not known here" in (stopped / "report.html").read_text()


def test_finalize_of_a_shard_lists_only_its_own_missing_pairs_and_reads_suite_names(tmp_path):
    """A --shard 0/2 run of the packaged smoke suite (named, not a path) stopped after 2 rows."""
    stopped, rows = _stopped_run(tmp_path, 2, None, "smoke", ("tlsim",), "0/2")
    assert main(["run", "--resume", str(stopped), "--finalize"]) == 4
    incomplete = json.loads((stopped / "meta.json").read_text())["incomplete"]
    mine = shard_cases(load_cases(["harness/cases/suites/smoke.toml"], device="cpu"), 0, 2)
    assert incomplete["missing_pairs"] == len(mine) - 2 == len(rows) - 2, incomplete.get("missing_unknown")
