"""Each GPU judged by its own ceilings, phases kept; --resume keeps the run's options; --finalize writes its rows."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import kernels
from harness import register_backend
from harness.cases.loading import load_cases
from harness.cli.main import build_parser, main
from harness.cli.options import BadInput
from harness.cli.resume import resume, run_options
from harness.execute.shards import shard_cases
from harness.execute.xdist import run_gpus
from harness.results.journal import Journal, journal_path
from harness.results.report import render_html
from harness.run import runner
from harness.run.runner import to_frame
from harness.timing import ceilings
from harness.timing.ceilings import GpuLedger, mixed_models_note
from harness.timing.phases import add_phases, phase, rounded, take_phases
from tests.tiny_cases import write_cases


@pytest.fixture
def cases_file(tmp_path):
    return write_cases(
        tmp_path / "cases.toml", {"name": "a", "q_lens": 1}, {"name": "b", "seq_lens": [5, 7], "q_lens": [2, 1]}
    )


def _report(name: str, read_gbps: float, peak: float) -> dict:
    return {"gpu_name": name, "ceilings": {"read_gbps": read_gbps, "peak_tflops": {"bfloat16": peak}}, "measure_s": 1}


def _row(gpu_index: str, **values) -> dict:
    return {"host": "h", "gpu_index": gpu_index, "dtype": "bfloat16", "max_q_len": 4, **values}


def test_each_row_is_judged_against_its_own_gpus_ceilings_and_meta_lists_every_gpu():
    ledger = GpuLedger()
    ledger.add("h", "1", 1, _report("NVIDIA H200", read_gbps=4000.0, peak=1000.0))
    ledger.add("h", "0", 0, _report("NVIDIA A100-SXM4-80GB", read_gbps=2000.0, peak=300.0))
    ledger.add("h", "0", 2, _report("NVIDIA A100-SXM4-80GB", read_gbps=1.0, peak=1.0))  # shares GPU 0: first wins
    ledger.add("h", "", 3, {"gpu_name": "", "ceilings": {}, "measure_s": 0})  # a CPU worker: nothing to record

    on_h200 = ledger.apply(_row("1", gbps=1000.0, tflops=100.0, pct_of_ceiling=1.0))
    on_a100 = ledger.apply(_row("0", gbps=1000.0, tflops=100.0, pct_of_ceiling=1.0))
    assert (on_h200["pct_of_ceiling"], on_h200["pct_of_peak"], on_h200["gpu_name"]) == (25.0, 10.0, "NVIDIA H200")
    assert on_a100["pct_of_ceiling"] == 50.0 and on_a100["pct_of_peak"] == pytest.approx(100 / 3)
    untimed = ledger.apply(_row("0", gbps=float("nan")))
    assert "pct_of_ceiling" not in untimed and untimed["gpu_name"] == "NVIDIA A100-SXM4-80GB"
    assert ledger.apply(_row("7", gbps=1.0)) == _row("7", gbps=1.0)  # no record of that GPU: as it came

    gpus = ledger.to_meta()
    assert [(g["gpu_index"], g["workers"]) for g in gpus] == [("0", [0, 2]), ("1", [1])]
    assert gpus[0]["ceilings"]["read_gbps"] == 2000.0
    note = mixed_models_note(gpus)
    assert note.startswith("mixed GPU models: NVIDIA A100-SXM4-80GB + NVIDIA H200")
    assert mixed_models_note(gpus[1:]) == "" and mixed_models_note([]) == ""


FAKE_GPU = """
import harness.timing.ceilings

def own_device(device, dtype_names, timing):  # every worker "measures" a GPU of its own
    return {"gpu_name": "Fake GPU", "ceilings": {"read_gbps": 0.001, "peak_tflops": {}}, "measure_s": 0.5}

harness.timing.ceilings.own_device = own_device
"""


def test_workers_report_their_device_and_meta_keeps_it_with_where_time_went(cases_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ceilings, "own_device", ceilings.own_device)  # the plugin patches it here too: restored
    (tmp_path / "fake_gpu.py").write_text(FAKE_GPU)
    out, cache = tmp_path / "run", tmp_path / "cache"
    code = main(["run", str(cases_file), "--backend", "tlsim", "--plugin", str(tmp_path / "fake_gpu.py"),
                 "--isolate", "none", "--no-progress", "--workers", "9", "--oracle-cache", str(cache),
                 "--out", str(out)])  # fmt: skip
    assert code == 0
    assert len(list(cache.glob("*.oracle"))) == 2, "--oracle-cache reached the workers: one entry per case"
    meta = json.loads((out / "meta.json").read_text())
    rows = pd.read_parquet(out / "results.parquet")
    assert [g["gpu_name"] for g in meta["gpus"]] == ["Fake GPU"] and sorted(meta["gpus"][0]["workers"]) == [0, 1]
    assert (rows["gpu_name"] == "Fake GPU").all()
    assert rows["pct_of_ceiling"].to_numpy() == pytest.approx(100 * rows["gbps"].to_numpy() / 0.001)
    scale = meta["scale"]  # never more workers than cases: 9 asked for, 2 started
    assert scale["mode"] == "workers" and scale["workers"] == 2 and len(scale["worker_start_s"]) == 2
    assert scale["ceilings_measure_s"] == [0.5, 0.5] and scale["cases"] == 2 and scale["rows"] == 2
    assert scale["wall_s"] >= scale["case_busy_s"] / 2 > 0
    assert min(scale["dispatch_wait_s"], scale["journal_s"], scale["merge_s"]) >= 0
    phases = scale["phase_s"]  # where the busy time went, summed over both workers (harness.timing.phases)
    assert {"inputs", "oracle", "guard", "graded call", "grade"} <= set(phases)
    assert 0 < sum(phases.values()) <= scale["case_busy_s"] + 0.01
    from scripts.self.scale_table import main as table_main

    capsys.readouterr()
    assert table_main([str(out), "12.5"]) == 0
    assert "where the cases' busy time went" in capsys.readouterr().out


def test_phases_sum_each_block_once_even_when_it_raises_and_start_again_after_take():
    take_phases()
    with phase("a"):
        pass
    with pytest.raises(ValueError), phase("b"):
        raise ValueError("counted anyway")
    with phase("a"):
        pass
    spent = take_phases()
    assert set(spent) == {"a", "b"} and min(spent.values()) >= 0
    assert take_phases() == {}
    assert add_phases({"a": 1.0, "c": 0.5}, {"a": 0.25, "b": 2.0}) == {"a": 1.25, "b": 2.0, "c": 0.5}
    total: dict[str, float] = {}
    for _ in range(400):  # 400 cases of 0.4 ms: summed unrounded, then rounded once (per case, each would be 0.0)
        total = add_phases(total, {"guard": 0.0004})
    assert rounded(total) == {"guard": 0.16}


def test_isolate_all_runs_built_ins_in_the_worker_their_phases_count_in_one_process(cases_file, tmp_path, monkeypatch):
    def no_local_call(*args, **kwargs):
        raise AssertionError("a built-in ran in-process under --isolate all")

    # The driver's own name for calling a backend (a spawned worker imports its own, unpatched copy): an
    # in-process call would raise here. The driver still builds the oracle and grades: that is its job.
    monkeypatch.setattr(runner, "call_backend", no_local_call)
    out = tmp_path / "run"
    assert main(["run", str(cases_file), "--backend", "tlsim", "--backend", "reference", "--isolate", "all",
                 "--no-timing", "--no-progress", "--out", str(out)]) == 0  # fmt: skip
    assert set(pd.read_parquet(out / "results.parquet")["status"]) == {"pass"}
    phases = json.loads((out / "meta.json").read_text())["scale"]["phase_s"]
    assert {"inputs", "oracle", "graded call", "grade"} <= set(phases) and phases["graded call"] > 0


def _stopped_run(tmp_path, cases_file, *flags: str, rows=(), meta: dict | None = None):
    """A run (through tlsim unless ``flags`` name backends) that reserved its folder and journal with these flags,
    recorded ``meta`` when given, then stopped after ``rows``."""
    out = tmp_path / "run"
    tlsim = [] if "--backend" in flags else ["--backend", "tlsim"]
    args = build_parser().parse_args(["run", str(cases_file), *tlsim, "--no-timing", *flags])
    journal = Journal.create(out, run_options(args, "cpu"))
    if meta is not None:
        journal.record_meta(meta)
    for row in rows:
        journal.append(row)
    journal.close(stopped=True)
    return out


def test_resume_of_a_run_in_one_process_runs_in_one_process(tmp_path, cases_file):
    out = _stopped_run(tmp_path, cases_file)
    assert main(["run", "--resume", str(out), "--no-progress"]) == 0
    scale = json.loads((out / "meta.json").read_text())["scale"]
    assert scale["mode"] == "one process" and scale.get("workers") is None
    assert len(pd.read_parquet(out / "results.parquet")) == 2


CLUSTER = ["--ray", "ray://head:10001", "--workers", "4"]


# the options that change no result: kept from the run, those given again win (--workers and --ray together);
# a journal may say a local Ray, never a cluster's address; a run caps the workers at its cases
# (test_workers_report_their_device_and_meta_keeps_it_with_where_time_went)
@pytest.mark.parametrize(
    ("first", "again", "expected"),
    [
        (["--shard", "1/3"], [], {"shard": "1/3"}),
        (["--workers", "9"], [], {"workers": "9"}),
        (["--timeout", "300", "--isolate", "none"], [], {"timeout": 300.0, "isolate": "none"}),
        (["--timeout", "300", "--isolate", "none"], ["--timeout", "5"], {"timeout": 5.0, "isolate": "none"}),
        (["--ray", "--workers", "4"], [], {"ray": "local", "workers": "4"}),
        (CLUSTER, ["--ray", "ray://head:10001"], {"ray": "ray://head:10001", "workers": None}),
        (CLUSTER, ["--workers", "2"], {"ray": None, "workers": "2"}),
    ],
)
def test_resume_takes_the_runs_own_options_unless_given_again(tmp_path, cases_file, first, again, expected):
    args = build_parser().parse_args(["run", "--resume", str(_stopped_run(tmp_path, cases_file, *first)), *again])
    resume(args).close(stopped=True)
    assert {name: getattr(args, name) for name in expected} == expected


def test_resume_of_a_run_on_a_ray_cluster_needs_its_address_given_again_unless_it_finalizes(tmp_path, cases_file):
    out = _stopped_run(tmp_path, cases_file, *CLUSTER)
    with pytest.raises(BadInput, match=r"the Ray cluster at ray://head:10001; name it again .*--ray ray://head:10001"):
        resume(build_parser().parse_args(["run", "--resume", str(out)]))
    with pytest.raises(BadInput, match="holds no row"):  # past the Ray check: --finalize sends nothing anywhere
        resume(build_parser().parse_args(["run", "--resume", str(out), "--finalize"]))


def test_a_gpus_ceilings_are_measured_once_per_process_and_per_gpu_where_processes_share(tmp_path, monkeypatch):
    measured = []
    monkeypatch.setattr(ceilings, "measure_ceilings", lambda device, dtypes: measured.append(1) or {"read_gbps": 7.0})
    monkeypatch.setattr(ceilings.torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(ceilings, "_OWN", {})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    first = ceilings.own_device("cuda", ["bfloat16"], timing=True)
    assert ceilings.own_device("cuda", ["bfloat16"], timing=True) is first and len(measured) == 1
    assert first["gpu_name"] == "NVIDIA H200" and first["ceilings"] == {"read_gbps": 7.0}

    monkeypatch.setenv(ceilings.SHARE_ENV, str(tmp_path / "shared"))  # a Ray run: a process per task
    for _ in range(2):
        monkeypatch.setattr(ceilings, "_OWN", {})  # the next task's fresh process
        report = ceilings.own_device("cuda", ["bfloat16"], timing=True)
    assert len(measured) == 2 and report["ceilings"] == {"read_gbps": 7.0} and report["measure_s"] == 0.0
    assert [p.name for p in (tmp_path / "shared").iterdir()] == ["1.json"]
    monkeypatch.setattr(ceilings, "_OWN", {})
    on_cpu = {"gpu_name": "", "ceilings": {}, "measure_s": pytest.approx(0, abs=0.1)}
    assert ceilings.own_device("cpu", ["float32"], timing=True) == on_cpu


def test_the_report_lists_each_gpu_with_its_read_ceiling():
    h200 = {"gpu_index": "1", "gpu_name": "NVIDIA H200"}
    frame = to_frame([{"case": "c", "backend": "triton", "status": "pass", **h200}])
    gpus = [{"host": "h", **h200, "ceilings": {"read_gbps": 4210.0}, "workers": [1]}]
    page = render_html(frame, {"device": "cuda", "device_name": "NVIDIA H200", "gpus": gpus})
    assert "h GPU 1: NVIDIA H200, read 4210 GB/s (worker 1)" in page


def test_a_pytest_n_run_lists_its_workers_gpus_and_names_mixed_models():
    rows = [{"host": "h", "gpu_index": "0", "worker": "gw0", "gpu_name": "NVIDIA H200"},
            {"host": "h", "gpu_index": "0", "worker": "gw0", "gpu_name": "NVIDIA H200"},
            {"host": "h", "gpu_index": "1", "worker": "gw1", "gpu_name": "NVIDIA A100-SXM4-80GB"}]  # fmt: skip
    gpus, note = run_gpus(rows)
    assert [(g["gpu_index"], g["workers"]) for g in gpus] == [("0", ["gw0"]), ("1", ["gw1"])]
    assert note.startswith("mixed GPU models: NVIDIA A100-SXM4-80GB + NVIDIA H200")
    assert run_gpus([{**row, "gpu_name": ""} for row in rows]) == ([], "")  # a CPU run


# --- --finalize: a stopped run whose machine is gone gets its folder written from the journal ------------


def _rows_journal(tmp_path, keep_rows: int, meta: dict | None, cases=None, backends=("reference", "tlsim"), shard=None):
    """A finished run's first ``keep_rows`` rows in the journal of a run (of the same ``shard``) that 'stopped'."""
    cases = cases or str(write_cases(tmp_path / "c.toml", {"name": "first"}, {"name": "second", "seed": 1}))
    flags = [arg for backend in backends for arg in ("--backend", backend)] + ["--shard", shard] * bool(shard)
    assert main(["run", cases, *flags, "--no-timing", "--no-progress", "--out", str(tmp_path / "whole")]) == 0
    rows = pd.read_parquet(tmp_path / "whole" / "results.parquet").to_dict("records")
    return _stopped_run(tmp_path, cases, *flags, rows=rows[:keep_rows], meta=meta), rows


@pytest.mark.parametrize("recorded", [{"device": "cuda", "device_name": "NVIDIA H200", "commit": "abc"}, None],
                         ids=["its_own_meta", "an_old_journals_without_meta_said_so_not_this_machines_borrowed"])  # fmt: skip
def test_finalize_writes_its_rows_with_the_runs_meta_and_lists_what_never_ran_on_the_page(tmp_path, capsys, recorded):
    stopped, rows = _rows_journal(tmp_path, 3, recorded)
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
    stopped, _ = _rows_journal(tmp_path, 3, {"device": "cuda", "device_name": "NVIDIA H200"})
    (tmp_path / "c.toml").unlink()  # a journal brought from another machine
    assert main(["run", "--resume", str(stopped), "--finalize"]) == 4
    meta = json.loads((stopped / "meta.json").read_text())
    assert meta["incomplete"]["missing_pairs"] is None and "not known here" in meta["incomplete"]["missing_unknown"]
    assert len(pd.read_parquet(stopped / "results.parquet")) == 3
    assert "not known here" in (stopped / "report.html").read_text()


def test_finalize_of_a_shard_lists_only_its_own_missing_pairs_and_reads_suite_names(tmp_path):
    """A --shard 0/2 run of the packaged smoke suite (named, not a path) stopped after 2 rows."""
    stopped, rows = _rows_journal(tmp_path, 2, None, "smoke", ("tlsim",), "0/2")
    assert main(["run", "--resume", str(stopped), "--finalize"]) == 4
    incomplete = json.loads((stopped / "meta.json").read_text())["incomplete"]
    mine = shard_cases(load_cases(["harness/cases/suites/smoke.toml"], device="cpu"), 0, 2)
    assert incomplete["missing_pairs"] == len(mine) - 2 == len(rows) - 2, incomplete.get("missing_unknown")
