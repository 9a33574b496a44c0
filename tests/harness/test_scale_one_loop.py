"""Every executor runs the one per-case loop: the same cases give the same rows, row for row."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from harness.backends.builtin import load_plugin, resolve_backends
from harness.cases.loading import load_cases
from harness.execute.local import InProcess
from harness.execute.ray_cluster import case_task
from harness.execute.workers import ProcessPool
from harness.pytest_plugin import HarnessSession
from harness.run.runner import RunConfig, to_frame
from tests.tiny_cases import write_cases

pytestmark = pytest.mark.usefixtures("clean_registry")

# Timing columns, where a row ran, and whether its oracle came from the cache (which depends on the order).
TIMING = ("latency", "call_", "timing_", "host_overhead_us", "host", "gpu_index", "worker", "oracle_cached")
NAMES = ["reference", "tlsim", "raises", "cuda_only"]  # pass, pass, error, skip on the CPU

PLUGIN = """
import kernels
from harness import register_backend

def raises(*args, **kwargs):
    raise RuntimeError("no kernel here")

register_backend("raises", raises)
register_backend("cuda_only", kernels.paged_attention_tlsim, devices=("cuda",))
"""


def _comparable(rows: list[dict]) -> pd.DataFrame:
    frame = to_frame(rows).sort_values(["case", "backend"]).reset_index(drop=True)
    return frame[[c for c in frame.columns if not c.startswith(TIMING)]]


class _PytestOptions:
    """What HarnessSession reads from pytest's config: the same cases, backends and plugin."""

    def __init__(self, options: dict):
        self.options, self.rootpath = options, Path.cwd()

    def getoption(self, name, default=None):
        return self.options.get(name, default)


def test_every_executor_gives_the_same_rows_row_for_row(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_ORACLE_CACHE", str(tmp_path / "oracle"))
    plugin = tmp_path / "plugin.py"
    plugin.write_text(PLUGIN)
    load_plugin(str(plugin))
    cases_file = write_cases(tmp_path / "cases.toml", {"name": "first"}, {"name": "second", "seed": 1, "block_size": 8})
    cases = load_cases([cases_file], "cpu")
    config = RunConfig(device="cpu", backends=resolve_backends(NAMES), timing=False, progress=False,
                       plugins=(str(plugin),), threads=torch.get_num_threads())  # fmt: skip

    def through(executor, run_config=config) -> pd.DataFrame:
        rows: list[dict] = []
        executor.run(cases, run_config, rows.append, ())
        return _comparable(rows)

    expected = through(InProcess())
    assert list(expected["status"]) == ["skip", "error", "pass", "pass"] * 2  # cuda_only, raises, reference, tlsim
    assert expected.loc[expected["backend"] == "raises", "reason"].str.contains("no kernel here").all()

    got = {
        "isolated": through(InProcess(), dataclasses.replace(config, isolated=frozenset(NAMES))),
        "two workers": through(ProcessPool(2)),
    }
    threads = torch.get_num_threads()  # a Ray task's body sets its process's threads, here this one's
    try:
        shipped = dataclasses.replace(config, backends=[])
        events = [event for case in cases for event in case_task(case, NAMES, shipped, ())]  # plugin loaded here
        got["a Ray task's body"] = _comparable([event[1] for event in events if event[0] == "row"])
        assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()  # no local Ray left running
    finally:
        torch.set_num_threads(threads)
    session = HarnessSession(_PytestOptions({"harness_device": "cpu", "harness_plugins": [], "harness_backends": NAMES,
                                             "cases": [str(cases_file)], "harness_timing": False}))  # fmt: skip
    got["pytest"] = _comparable(
        [session.run(case, backend) for case in session.cases for backend in session.config.backends]
    )
    for path, frame in got.items():
        pd.testing.assert_frame_equal(frame, expected, obj=path)


def test_a_ray_tasks_poisoned_oracle_cache_entry_is_an_event_that_stops_the_run(tmp_path, monkeypatch):
    """A Ray task's poisoned cache entry is a 'poisoned' event (exit 2), not an exception read as a dead task."""
    from harness.execute import loop
    from harness.run.oracle_cache import PoisonedCacheError

    def poisoned(*args, **kwargs):
        raise PoisonedCacheError("oracle cache entry abc: its sha256 does not match")

    monkeypatch.setattr(loop, "build_context", poisoned)
    cases = load_cases([write_cases(tmp_path / "cases.toml", {"name": "first"})], "cpu")
    config = RunConfig(device="cpu", backends=[], timing=False, progress=False, threads=torch.get_num_threads())
    threads = torch.get_num_threads()
    try:
        events = list(case_task(cases[0], ["reference"], config, ()))
    finally:
        torch.set_num_threads(threads)
    assert events[-1] == ("poisoned", "oracle cache entry abc: its sha256 does not match")
