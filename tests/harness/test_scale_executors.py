"""Every executor gives the one-process rows, row for row; a killed worker costs one retry and one error row."""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np
import pandas as pd
import pytest
import torch

from harness.backends.builtin import load_plugin, resolve_backends
from harness.cases.loading import load_cases
from harness.cli.main import main
from harness.execute import loop, xdist
from harness.execute.local import InProcess
from harness.execute.ray_cluster import case_task
from harness.execute.workers import EXTRA_COLUMNS, PoolRun, run_pool, worker_count, worker_threads
from harness.pytest_plugin import HarnessSession
from harness.run.oracle_cache import PoisonedCacheError
from harness.run.runner import RunConfig, to_frame
from harness.timing.metrics import case_cost
from tests.fresh_python import ROOT
from tests.tiny_cases import plugin_run_scope, write_cases

pytestmark = pytest.mark.usefixtures("clean_registry")  # backends registered here vanish after each test

# Columns that differ between equal runs: timing, where a row ran (empty in a one-process run), whether its oracle
# came from the cache (which depends on the order).
TIMING = ("latency", "call_", "timing_", "host_overhead_us", "host", "gpu_index", "worker", "oracle_cached")
NAMES = ["reference", "tlsim", "raises", "cuda_only"]  # pass, pass, error, skip on the CPU (the plugin fixture's)


def _without_timing(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[[c for c in frame.columns if not c.startswith(TIMING)]]


def _comparable(rows: list[dict]) -> pd.DataFrame:
    return _without_timing(to_frame(rows).sort_values(["case", "backend"]).reset_index(drop=True))


@pytest.fixture(autouse=True)
def private_oracle_cache_and_threads(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HARNESS_ORACLE_CACHE", str(tmp_path_factory.getbasetemp() / "oracle"))
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)  # a Ray task's body sets its process's threads, here this one's


def _pytest_config(options: dict, **attributes) -> SimpleNamespace:
    """What HarnessSession and the xdist hooks read from pytest's config: options, and ``attributes`` as given."""
    return SimpleNamespace(getoption=lambda name, default=None: options.get(name, default), rootpath=Path.cwd(),
                           **attributes)  # fmt: skip


def test_every_executor_gives_the_same_rows_row_for_row(killed_ready_workers):
    """Two workers (the killed_ready_workers run, its killer's rows set aside), an isolated backend, a Ray task's
    body and pytest's case suite each give the one-process rows."""
    cases_file, plugin = killed_ready_workers.cases_file, killed_ready_workers.plugin
    load_plugin(str(plugin))
    cases = load_cases([cases_file], "cpu")
    config = RunConfig(device="cpu", backends=resolve_backends(NAMES), timing=False, progress=False,
                       plugins=(str(plugin),), threads=torch.get_num_threads())  # fmt: skip

    def through(executor, run_config=config) -> pd.DataFrame:
        rows: list[dict] = []
        executor.run(cases, run_config, rows.append, ())
        return _comparable(rows)

    expected = through(InProcess())
    assert list(expected["status"]) == ["skip", "error", "pass", "pass"] * 4  # cuda_only, raises, reference, tlsim
    assert expected.loc[expected["backend"] == "raises", "reason"].str.contains("no kernel here").all()

    got = {
        "isolated": through(InProcess(), dataclasses.replace(config, isolated=frozenset(NAMES))),
        "two workers": _comparable([row for row in killed_ready_workers.rows if row["backend"] != "killer"]),
    }
    shipped = dataclasses.replace(config, backends=[])
    events = [event for case in cases for event in case_task(case, NAMES, shipped, ())]  # plugin loaded here
    got["a Ray task's body"] = _comparable([event[1] for event in events if event[0] == "row"])
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()  # no local Ray left running
    session = HarnessSession(_pytest_config({"harness_device": "cpu", "harness_plugins": [], "harness_backends": NAMES,
                                             "cases": [str(cases_file)], "harness_timing": False}))  # fmt: skip
    got["pytest"] = _comparable([session.run(c, b) for c in session.cases for b in session.config.backends])
    for path, frame in got.items():
        pd.testing.assert_frame_equal(frame, expected, obj=path)


def test_a_ray_tasks_poisoned_oracle_cache_entry_is_an_event_that_stops_the_run(tmp_path, monkeypatch):
    """A Ray task's poisoned cache entry is a 'poisoned' event (exit 2), not an exception read as a dead task."""

    def poisoned(*args, **kwargs):
        raise PoisonedCacheError("oracle cache entry abc: its sha256 does not match")

    monkeypatch.setattr(loop, "build_context", poisoned)
    cases = load_cases([write_cases(tmp_path / "cases.toml", {"name": "first"})], "cpu")
    config = RunConfig(device="cpu", backends=[], timing=False, progress=False, threads=torch.get_num_threads())
    events = list(case_task(cases[0], ["reference"], config, ()))
    assert events[-1] == ("poisoned", "oracle cache entry abc: its sha256 does not match")


DIES, HANGS = {"name": "dies_here", "head_dim": 64}, {"name": "hangs_here", "head_dim": 48}
FINE = [{"name": "fine_a"}, {"name": "fine_b", "seed": 1}]


def _killer_pool(plugin: Path, *cases: dict, names=("tlsim", "killer")) -> tuple[list[dict], PoolRun]:
    """The rows of ``names`` (the plugin fixture's killer among them) over ``cases`` on two workers, 10 s a call;
    the pool."""
    load_plugin(str(plugin))
    config = RunConfig(device="cpu", backends=resolve_backends(list(names)), timing=False,
                       progress=False, plugins=(str(plugin),), threads=1, timeout_s=10.0)  # fmt: skip
    rows: list[dict] = []
    cases = load_cases([write_cases(plugin.parent / "cases.toml", *cases)], "cpu")
    return rows, run_pool(cases, config, rows.append, workers=2)


class KilledRun(NamedTuple):
    rows: list[dict]
    pool: PoolRun
    kills: list[str]  # the pids killed
    cases_file: Path
    plugin: Path


@pytest.fixture(scope="module")
def killed_ready_workers(tmp_path_factory, write_plugin):
    """NAMES and killer on two workers, killer's workers killed four times, each once it was ready, over two cases,
    beside two fine ones."""
    folder = tmp_path_factory.mktemp("killed")
    plugin = write_plugin(folder)
    dies_again = {**DIES, "name": "dies_again", "seed": 2}
    with plugin_run_scope(folder):
        rows, pool = _killer_pool(plugin, DIES, dies_again, *FINE, names=[*NAMES, "killer"])
    return KilledRun(rows, pool, (folder / "kills").read_text().split(), folder / "cases.toml", plugin)


@pytest.mark.slow  # a worker killed, one hung past its limit: about 16 s
def test_a_killed_worker_costs_one_retry_then_an_error_row_a_hung_one_an_error_row_the_rest_are_kept(tmp_path, plugin):
    rows, _ = _killer_pool(plugin, DIES, HANGS, *FINE)
    by_pair = {(r["case"], r["backend"]): r for r in rows}
    assert len(rows) == len(by_pair) == 8  # every (case, backend) once, the run completed
    died = by_pair[("dies_here", "killer")]
    assert died["status"] == "error" and "killed by SIGKILL" in died["reason"] and "on 2 workers" in died["reason"]
    kills = (tmp_path / "kills").read_text().split()
    assert len(kills) == 2 and kills[0] != kills[1]  # tried once more, in another process
    hung = by_pair[("hangs_here", "killer")]
    assert hung["status"] == "error" and hung["reason"].startswith("timed out after 10 s")
    others = [r for pair, r in by_pair.items() if pair not in {("dies_here", "killer"), ("hangs_here", "killer")}]
    # killer is hung from then on: its rows not yet run when it timed out are skips naming the case
    hung_skip = "hung on hangs_here after 10 s; not run"
    assert all(r["status"] == "pass" or (r["backend"] == "killer" and r["reason"] == hung_skip) for r in others)
    assert [r["status"] for r in others if r["backend"] == "tlsim"] == ["pass"] * 4
    assert all(set(EXTRA_COLUMNS) <= set(r) for r in rows)
    assert {r["worker"] for r in rows} <= {0, 1} and all(r["gpu_index"] == "" for r in rows)


def test_workers_killed_after_they_are_ready_are_error_rows_not_a_broken_install(killed_ready_workers):
    """Four deaths of ready workers (not counted as failed starts) leave two error rows and the run goes on."""
    rows, kills = killed_ready_workers.rows, killed_ready_workers.kills
    status = {(r["case"], r["backend"]): r["status"] for r in rows if r["backend"] in ("tlsim", "killer")}
    assert len(rows) == 4 * 5 and len(status) == 8
    assert {pair for pair, s in status.items() if s != "pass"} == {("dies_here", "killer"), ("dies_again", "killer")}
    assert len(set(kills)) == 4


def test_finished_workers_are_reaped_in_the_background_and_exit(killed_ready_workers):
    pool = killed_ready_workers.pool
    deadline = time.monotonic() + 20
    while any(slot.process is not None for slot in pool.slots) and time.monotonic() < deadline:
        time.sleep(0.05)  # the reap thread joins each worker, then clears its slot
    assert all(slot.process is None for slot in pool.slots)
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("harness-worker")]


def test_workers_auto_is_one_per_core_on_a_cpu_one_per_visible_gpu_on_cuda_and_a_bad_count_is_refused(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert worker_count("auto", "cpu", threads=1) == 8
    assert worker_count("auto", "cpu", threads=2) == 4
    assert worker_count("3", "cpu") == 3
    with pytest.raises(ValueError, match="positive integer"):
        worker_count("0", "cpu")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5,7")
    assert worker_count("auto", "cuda") == 3
    # each worker's torch threads: the run's (or every core) over the workers, never oversubscribed, on CUDA too
    monkeypatch.setattr(os, "cpu_count", lambda: 32)
    assert worker_threads(None, 1) == 32
    assert worker_threads(None, 2) == 16  # two GPU workers on a 32-core host: 16 each, not 32 each
    assert worker_threads(6, 4) == 1
    assert worker_threads(None, 100) == 1


def test_cases_go_out_longest_first(tmp_path):
    path = write_cases(tmp_path / "c.toml", {"name": "small", "seq_lens": [3], "q_lens": [1]},
                       {"name": "big", "seq_lens": [300], "q_lens": [30]})  # fmt: skip
    small, big = load_cases([path], "cpu")
    assert case_cost(big) > case_cost(small)


def test_each_worker_is_spawned_seeing_only_its_own_gpu_and_the_parent_keeps_all(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    pool = PoolRun(RunConfig(device="cuda", backends=[], timing=False, progress=False), workers=3)
    seen = []
    # stands in for the spawned process: records the environment it would inherit
    started = SimpleNamespace(start=lambda: seen.append(os.environ.get("CUDA_VISIBLE_DEVICES")))
    monkeypatch.setattr(pool.context, "Process", lambda **kwargs: started)
    for slot in pool.slots:
        pool._start(slot)
        slot.conn.close()
    assert seen == ["4", "6", "4"]  # round robin past the GPU count
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,6"
    assert [pool.labels(slot)["gpu_index"] for slot in pool.slots] == ["4", "6", "4"]


@pytest.mark.slow  # a local Ray: about 50 s on a busy 2-core box
def test_on_ray_a_killed_and_a_hung_task_are_error_rows_and_the_others_are_the_one_process_rows(tmp_path, plugin):
    pytest.importorskip("ray", reason="Ray is an optional extra: pip install '.[ray]'")
    write_cases(tmp_path / "cases.toml", DIES, HANGS, *FINE)
    out = tmp_path / "run"
    code = main(["run", str(tmp_path / "cases.toml"), "--plugin", str(plugin), "--backend", "tlsim",
                 "--backend", "killer", "--no-timing", "--no-progress", "--ray", "--workers", "2", "--timeout", "30",
                 "--out", str(out)])  # fmt: skip
    assert code == 1
    rows = pd.read_parquet(out / "results.parquet").set_index(["case", "backend"])
    died = rows.loc[("dies_here", "killer")]
    assert died["status"] == "error" and "WorkerCrashedError" in died["reason"] and "in 2 tasks" in died["reason"]
    assert "while running this backend" in died["reason"]
    hung = rows.loc[("hangs_here", "killer")]
    # 30 s: beside the whole suite on two cores, a fresh Ray worker's first tlsim row can take more than 10 s
    assert hung["status"] == "error" and hung["reason"].startswith("timed out after 30 s")
    others = rows.drop([("dies_here", "killer"), ("hangs_here", "killer")])  # tlsim of those cases too
    assert (others["status"] == "pass").all() and len(rows) == 8
    assert len((tmp_path / "kills").read_text().split()) == 2  # the case's task, then killer again in a new one
    scale = json.loads((out / "meta.json").read_text())["scale"]
    assert scale["mode"] == "ray" and scale["tasks"] == 5 and scale["init_s"] > 0
    # and the Ray tasks' rows are the one-process run's, row for row (the local Ray's one start in the suite)
    one = tmp_path / "one"
    assert main(["run", str(tmp_path / "cases.toml"), "--backend", "tlsim", "--no-timing", "--no-progress",
                 "--out", str(one)]) == 0  # fmt: skip
    on_ray = pd.read_parquet(out / "results.parquet")
    on_ray = on_ray[on_ray["backend"] == "tlsim"].reset_index(drop=True)
    expected = _without_timing(pd.read_parquet(one / "results.parquet"))
    # the same values; a column the error rows leave empty is float beside them, int in the one-process run
    pd.testing.assert_frame_equal(_without_timing(on_ray), expected, check_dtype=False)


@pytest.mark.slow  # pytest in a fresh interpreter (with -n, a controller and two workers): up to 45 s on 2 busy cores
@pytest.mark.parametrize("workers", [[], ["-p", "xdist", "-n", "2"]], ids=["one_process", "xdist"])
def test_pytest_harness_report_writes_the_one_process_rows_with_or_without_xdist_workers(tmp_path, workers):
    """`pytest --cases F --harness-report DIR` grades every (case, backend) and stores the run; under -n the
    workers' rows merge into that one folder."""
    if workers:
        pytest.importorskip("xdist", reason="pytest-xdist is an optional extra: pip install '.[xdist]'")
    cases = write_cases(tmp_path / "cases.toml", *FINE, {"name": "third", "block_size": 8})
    backends = ["--backend", "reference", "--backend", "tlsim"]
    one = tmp_path / "one"
    assert main(["run", str(cases), *backends, "--no-timing", "--no-progress", "--out", str(one)]) == 0
    merged = tmp_path / "merged"
    env = {**os.environ, "HARNESS_ORACLE_CACHE": str(tmp_path / "cache"), "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *workers, "-p", "no:cacheprovider",
         "tests/harness/test_case_suite.py", "--cases", str(cases), *backends, "--harness-report", str(merged)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0 and "6 passed" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]
    expected, got = pd.read_parquet(one / "results.parquet"), pd.read_parquet(merged / "results.parquet")
    assert len(got) == 6 and (merged / "report.html").is_file()
    pd.testing.assert_frame_equal(_without_timing(got), _without_timing(expected))
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob("harness-xdist-rows-*/gw*.jsonl"))  # cleaned up


@pytest.mark.parametrize(
    ("device", "specs", "pinned"),
    [
        pytest.param("cuda", ["popen", "popen", "popen//env:CUDA_VISIBLE_DEVICES=7"], ["3", "5", "7"], id="cuda"),
        pytest.param("cpu", ["popen"], [None], id="none_on_a_cpu_run"),
    ],
)
def test_each_xdist_worker_is_pinned_to_its_own_gpu_round_robin(monkeypatch, device, specs, pinned):
    execnet = pytest.importorskip("execnet", reason="pytest-xdist (and execnet) not installed")

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    specs = [execnet.XSpec(spec) for spec in specs]
    xdist.pin_gpus(_pytest_config({"harness_device": device}), specs)
    assert [spec.env.get("CUDA_VISIBLE_DEVICES") for spec in specs] == pinned


def test_worker_rows_travel_as_json_lines_that_load_as_data(tmp_path):
    """A worker's rows travel as JSON lines (samples as lists, NaN kept), never a pickle that runs code."""
    worker = _pytest_config({"harness_device": "cpu"}, workerinput={"workerid": "gw0", xdist.ROWS_DIR: str(tmp_path)})
    rows = [{"case": "a", "backend": "tlsim", "latency_samples_us": np.array([1.5, 2.0]), "max_abs_err": math.nan}]
    path = xdist.save_worker_rows(worker, rows)
    assert path.name == "gw0.jsonl"
    (line,) = path.read_text().splitlines()
    assert json.loads(line)["latency_samples_us"] == [1.5, 2.0] and json.loads(line)["worker"] == "gw0"

    controller = _pytest_config({}, stash=pytest.Stash())
    controller.stash[xdist._FOLDER_KEY] = str(tmp_path)
    (row,) = xdist.collect_rows(controller)
    assert row["case"] == "a" and row["latency_samples_us"] == [1.5, 2.0] and math.isnan(row["max_abs_err"])
    assert not tmp_path.exists()  # the hand-off folder is removed once read
