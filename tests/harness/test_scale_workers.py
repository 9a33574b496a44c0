"""--workers or --ray give the one-process rows; a killed worker costs one retry and one error row."""

from __future__ import annotations

import json
import multiprocessing
import os

import pandas as pd
import pytest

from harness.backends.builtin import load_plugin, resolve_backends
from harness.cases.loading import load_cases
from harness.cli.main import main
from harness.execute.workers import EXTRA_COLUMNS, run_pool, worker_count, worker_threads
from harness.run.runner import RunConfig
from harness.timing.metrics import case_cost
from tests.tiny_cases import write_cases

SMOKE = ["run", "smoke", "--backend", "reference", "--backend", "tlsim", "--no-timing", "--no-progress"]
# Timing columns, where a row ran (empty in a one-process run) and the cache state.
TIMING = ("latency", "call_", "timing_", "host_overhead_us", "host", "gpu_index", "worker", "oracle_cached")


pytestmark = pytest.mark.usefixtures("clean_registry")  # backends registered here vanish after each test


@pytest.fixture(autouse=True)
def private_oracle_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HARNESS_ORACLE_CACHE", str(tmp_path_factory.getbasetemp() / "oracle"))


@pytest.fixture(scope="module")
def one_process_rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "run"
    assert main([*SMOKE, "--out", str(out), "--oracle-cache", "off"]) == 0
    return pd.read_parquet(out / "results.parquet")


def _without_timing(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[[c for c in frame.columns if not c.startswith(TIMING)]]


def test_two_workers_give_the_one_process_rows_row_for_row(one_process_rows, tmp_path):
    out, cache = tmp_path / "run", tmp_path / "cache"
    assert main([*SMOKE, "--out", str(out), "--workers", "2", "--oracle-cache", str(cache)]) == 0
    pooled = pd.read_parquet(out / "results.parquet")
    assert len(pooled) == len(one_process_rows) >= 10
    pd.testing.assert_frame_equal(_without_timing(pooled), _without_timing(one_process_rows))
    cases = one_process_rows["case"].nunique()
    assert len(list(cache.glob("*.oracle"))) == cases  # --oracle-cache reached the workers: one entry per case


KILLER = """
import os, signal, time
from pathlib import Path
import kernels
from harness import register_backend

def killer(q, *args, out=None, **kwargs):
    if q.shape[-1] == 48:  # the case with head_dim 48: a hang
        time.sleep(3600)
    if q.shape[-1] == 64:  # the case with head_dim 64 only: the worker dies on it, every time
        with open(Path(os.environ["HARNESS_TEST_DIR"]) / "kills", "a") as log:
            log.write(f"{os.getpid()}\\n")
        os.kill(os.getpid(), signal.SIGKILL)
    return kernels.paged_attention_tlsim(q, *args, out=out, **kwargs)

register_backend("killer", killer)
"""

DIES, HANGS = {"name": "dies_here", "head_dim": 64}, {"name": "hangs_here", "head_dim": 48}
FINE = [{"name": "fine_a"}, {"name": "fine_b", "seed": 1}]


@pytest.mark.slow  # a worker killed, one hung past its limit: about 16 s
def test_a_killed_worker_costs_one_retry_then_an_error_row_a_hung_one_an_error_row_and_every_other_row_is_kept(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("HARNESS_TEST_DIR", str(tmp_path))
    (tmp_path / "killer.py").write_text(KILLER)
    write_cases(tmp_path / "cases.toml", DIES, HANGS, *FINE)
    plugin = str(tmp_path / "killer.py")
    load_plugin(plugin)
    cases = load_cases([tmp_path / "cases.toml"], "cpu")
    config = RunConfig(device="cpu", backends=resolve_backends(["tlsim", "killer"]), timing=False,
                       progress=False, plugins=(plugin,), threads=1, timeout_s=10.0)  # fmt: skip
    rows: list[dict] = []
    run_pool(cases, config, rows.append, workers=2)

    by_pair = {(r["case"], r["backend"]): r for r in rows}
    assert len(rows) == len(by_pair) == 8  # every (case, backend) once, the run completed
    died = by_pair[("dies_here", "killer")]
    assert died["status"] == "error"
    assert "killed by SIGKILL" in died["reason"] and "on 2 workers" in died["reason"]
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


def test_finished_workers_are_reaped_in_the_background_and_exit(tmp_path):
    import time

    write_cases(tmp_path / "cases.toml", *FINE)
    cases = load_cases([tmp_path / "cases.toml"], "cpu")
    config = RunConfig(device="cpu", backends=resolve_backends(["tlsim"]), timing=False, progress=False, threads=1)
    rows: list[dict] = []
    pool = run_pool(cases, config, rows.append, workers=2)
    assert len(rows) == len(cases)
    deadline = time.monotonic() + 20
    while any(slot.process is not None for slot in pool.slots) and time.monotonic() < deadline:
        time.sleep(0.05)  # the reap thread joins each worker, then clears its slot
    assert all(slot.process is None for slot in pool.slots)
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("harness-worker")]


def test_workers_auto_is_one_per_core_on_a_cpu_and_a_bad_count_is_refused(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert worker_count("auto", "cpu", threads=1) == 8
    assert worker_count("auto", "cpu", threads=2) == 4
    assert worker_count("3", "cpu") == 3
    with pytest.raises(ValueError, match="positive integer"):
        worker_count("0", "cpu")


def test_workers_split_the_cores_between_them_on_cuda_too(monkeypatch):
    """Each worker's torch threads: the run's (or every core) over the workers, never oversubscribed."""
    monkeypatch.setattr(os, "cpu_count", lambda: 32)
    assert worker_threads(None, 1) == 32
    assert worker_threads(None, 2) == 16  # two GPU workers on a 32-core host: 16 each, not 32 each
    assert worker_threads(6, 4) == 1
    assert worker_threads(None, 100) == 1


def test_workers_auto_on_cuda_is_one_per_visible_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5,7")
    assert worker_count("auto", "cuda") == 3


def test_cases_go_out_longest_first(tmp_path):
    (tmp_path / "c.toml").write_text(
        '[[case]]\nname = "small"\nnum_q_heads = 4\nnum_kv_heads = 2\nhead_dim = 32\nblock_size = 4\nseq_lens = [3]\n'
        '[[case]]\nname = "big"\nnum_q_heads = 4\nnum_kv_heads = 2\nhead_dim = 32\nblock_size = 4\nseq_lens = [300]\n'
        "q_lens = [30]\n"
    )
    small, big = load_cases([tmp_path / "c.toml"], "cpu")
    assert case_cost(big) > case_cost(small)


def test_each_worker_is_spawned_seeing_only_its_own_gpu_and_the_parent_keeps_all(monkeypatch):
    from harness.execute.workers import PoolRun

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    pool = PoolRun(RunConfig(device="cuda", backends=[], timing=False, progress=False), workers=3)
    seen = []

    class SpawnRecorder:  # stands in for the spawned process: records the environment it would inherit
        def __init__(self, **kwargs):
            self.kwargs = kwargs

        def start(self):
            seen.append(os.environ.get("CUDA_VISIBLE_DEVICES"))

    monkeypatch.setattr(pool.context, "Process", SpawnRecorder)
    for slot in pool.slots:
        pool._start(slot)
        slot.conn.close()
    assert seen == ["4", "6", "4"]  # round robin past the GPU count
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,6"
    assert [pool.labels(slot)["gpu_index"] for slot in pool.slots] == ["4", "6", "4"]


@pytest.mark.slow  # a local Ray: about 50 s on a busy 2-core box
def test_on_ray_a_killed_and_a_hung_task_are_error_rows_and_the_innocent_rows_are_the_one_process_rows(
    tmp_path, monkeypatch
):
    pytest.importorskip("ray", reason="Ray is an optional extra: pip install '.[ray]'")
    monkeypatch.setenv("HARNESS_TEST_DIR", str(tmp_path))  # inherited by the local Ray's workers
    (tmp_path / "killer.py").write_text(KILLER)
    write_cases(tmp_path / "cases.toml", DIES, HANGS, *FINE)
    out = tmp_path / "run"
    code = main(["run", str(tmp_path / "cases.toml"), "--plugin", str(tmp_path / "killer.py"), "--backend", "tlsim",
                 "--backend", "killer", "--no-timing", "--no-progress", "--ray", "--workers", "2", "--timeout", "30",
                 "--out", str(out)])  # fmt: skip
    assert code == 1
    rows = pd.read_parquet(out / "results.parquet").set_index(["case", "backend"])
    died = rows.loc[("dies_here", "killer")]
    assert died["status"] == "error" and "WorkerCrashedError" in died["reason"] and "in 2 tasks" in died["reason"]
    assert "while running this backend" in died["reason"]
    hung = rows.loc[("hangs_here", "killer")]
    assert hung["status"] == "error" and hung["reason"].startswith("timed out after 30 s")
    # 30 s, not 10: with the whole suite beside it on two cores, a fresh Ray worker's first tlsim row once
    # took more than 10 s and timed out (an innocent row as an error)
    assert rows.loc[("dies_here", "tlsim"), "status"] == "pass"  # the innocent backends of those cases
    assert rows.loc[("hangs_here", "tlsim"), "status"] == "pass"
    others = rows.drop([("dies_here", "killer"), ("hangs_here", "killer")])
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
