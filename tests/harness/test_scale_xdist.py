"""pytest -n 2: a GPU per worker; --harness-report merges the rows into the one-process run folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.cli.main import main
from tests.tiny_cases import write_cases

ROOT = Path(__file__).resolve().parents[2]
# Columns that differ between equal runs: timing, where a row ran, whether its oracle came from the cache.
TIMING = ("latency", "call_", "timing_", "host_overhead_us", "host", "gpu_index", "worker", "oracle_cached")

CASES = ({"name": "first"}, {"name": "second", "seed": 1}, {"name": "third", "block_size": 8})


@pytest.mark.slow  # three interpreters start (controller and two workers): about 45 s on a busy 2-core box
def test_xdist_workers_rows_merge_into_one_run_folder_equal_to_a_one_process_run(tmp_path):
    pytest.importorskip("xdist", reason="pytest-xdist is an optional extra: pip install '.[xdist]'")
    cases = write_cases(tmp_path / "cases.toml", *CASES)
    backends = ["--backend", "reference", "--backend", "tlsim"]
    one = tmp_path / "one"
    assert main(["run", str(cases), *backends, "--no-timing", "--no-progress", "--out", str(one)]) == 0
    merged = tmp_path / "merged"
    env = {**os.environ, "HARNESS_ORACLE_CACHE": str(tmp_path / "cache"), "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "xdist", "-n", "2", "-p", "no:cacheprovider",
         "tests/harness/test_case_suite.py", "--cases", str(cases), *backends, "--harness-report", str(merged)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    expected, got = pd.read_parquet(one / "results.parquet"), pd.read_parquet(merged / "results.parquet")
    keep = [c for c in expected.columns if not c.startswith(TIMING)]
    assert len(got) == 6
    pd.testing.assert_frame_equal(got[keep], expected[keep])
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob("harness-xdist-rows-*/gw*.jsonl"))  # cleaned up


def test_each_xdist_worker_is_pinned_to_its_own_gpu_round_robin(monkeypatch):
    execnet = pytest.importorskip("execnet", reason="pytest-xdist (and execnet) not installed")
    from harness.execute.xdist import pin_gpus

    class Config:
        def getoption(self, name, default=None):
            return "cuda" if name == "harness_device" else default

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    specs = [execnet.XSpec("popen"), execnet.XSpec("popen"), execnet.XSpec("popen//env:CUDA_VISIBLE_DEVICES=7")]
    pin_gpus(Config(), specs)
    assert [spec.env["CUDA_VISIBLE_DEVICES"] for spec in specs] == ["3", "5", "7"]


def test_no_gpu_pinning_on_a_cpu_run():
    execnet = pytest.importorskip("execnet", reason="pytest-xdist (and execnet) not installed")
    from harness.execute.xdist import pin_gpus

    class Config:
        def getoption(self, name, default=None):
            return "cpu" if name == "harness_device" else default

    spec = execnet.XSpec("popen")
    pin_gpus(Config(), [spec])
    assert "CUDA_VISIBLE_DEVICES" not in spec.env


def test_worker_rows_travel_as_json_lines_that_load_as_data(tmp_path):
    """A worker's rows travel as JSON lines (samples as lists, NaN kept), never a pickle that runs code."""
    import json
    import math

    import numpy as np

    from harness.execute import xdist

    class Worker:
        def __init__(self):
            self.workerinput = {"workerid": "gw0", xdist.ROWS_DIR: str(tmp_path)}

        def getoption(self, name, default=None):
            return "cpu" if name == "harness_device" else default

    rows = [{"case": "a", "backend": "tlsim", "latency_samples_us": np.array([1.5, 2.0]), "max_abs_err": math.nan}]
    path = xdist.save_worker_rows(Worker(), rows)
    assert path.name == "gw0.jsonl"
    (line,) = path.read_text().splitlines()
    assert json.loads(line)["latency_samples_us"] == [1.5, 2.0] and json.loads(line)["worker"] == "gw0"

    class Controller:
        def __init__(self):
            self.stash = pytest.Stash()

    controller = Controller()
    controller.stash[xdist._FOLDER_KEY] = str(tmp_path)
    (row,) = xdist.collect_rows(controller)
    assert row["case"] == "a" and row["latency_samples_us"] == [1.5, 2.0] and math.isnan(row["max_abs_err"])
    assert not tmp_path.exists()  # the hand-off folder is removed once read
