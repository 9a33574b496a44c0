"""A hang costs one time limit; the default limit follows the row's cost; timing stays within its budget."""

from __future__ import annotations

import functools
import time

import pandas as pd
import pytest

from harness.cases.spec import load_case_file
from harness.cli.main import main
from harness.run import runner
from harness.timing import measure
from harness.timing.measure import LIMIT_FLOOR_S, row_time_limit
from harness.timing.timer import time_call
from tests.tiny_cases import write_cases

pytestmark = pytest.mark.usefixtures("clean_registry")

CASES = [{"name": "first"}, {"name": "second", "seed": 1}, {"name": "third", "seed": 2}]
LIMIT = 3


@pytest.mark.parametrize("scale", [[], ["--workers", "1"]], ids=["isolated", "workers"])
def test_a_backend_that_hangs_on_its_first_case_costs_one_limit_then_its_rows_are_skips_naming_the_case(
    tmp_path, plugin, scale
):
    write_cases(tmp_path / "cases.toml", *CASES)
    out = tmp_path / "run"
    started = time.monotonic()
    code = main(["run", str(tmp_path / "cases.toml"), "--plugin", str(plugin), "--backend", "hangs",
                 "--no-timing", "--no-progress", "--timeout", str(LIMIT), "--device", "cpu", "--out", str(out), *scale])  # fmt: skip
    elapsed = time.monotonic() - started
    assert code == 1
    rows = pd.read_parquet(out / "results.parquet").set_index("case")
    assert rows.loc["first", "status"] == "error" and "timed out after 3 s" in rows.loc["first", "reason"]
    for case in ("second", "third"):
        assert rows.loc[case, "status"] == "skip"
        assert rows.loc[case, "reason"] == "hung on first after 3 s; not run"
    assert len((tmp_path / "hung").read_text().split()) == 1  # called once: the hung backend got no more cases
    assert elapsed < 3 * LIMIT + 60  # one limit, plus starting workers on a busy machine; not three limits each


def test_the_default_limit_has_a_floor_and_grows_with_the_rows_cost(tmp_path):
    shape = {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "block_size": 16, "dtype": "bfloat16"}
    write_cases(tmp_path / "cases.toml", {"name": "small", "seq_lens": [16]},
                {"name": "big", "seq_lens": [131072], "q_lens": [4096]},
                {"name": "bigger", "seq_lens": [131072] * 4, "q_lens": [4096] * 4}, defaults=shape)  # fmt: skip
    small, big, bigger = load_case_file(tmp_path / "cases.toml")
    measured = {"read_gbps": 4000.0, "peak_tflops": {"bfloat16": 989.0}}
    assert row_time_limit(small, "cpu") == row_time_limit(small, "cuda", measured) == LIMIT_FLOOR_S
    assert LIMIT_FLOOR_S < row_time_limit(big, "cpu") < row_time_limit(bigger, "cpu")
    # the same case against a measured GPU is expected to run far faster than on the CPU
    assert row_time_limit(bigger, "cuda", measured) < row_time_limit(bigger, "cpu")


def test_a_deadline_stops_sampling_and_marks_the_timing_cut_short():
    started = time.monotonic()
    timing = time_call(lambda: time.sleep(0.05), "cpu", deadline=started + 0.2)
    assert timing.cut_short and 1 <= len(timing.samples_us) < 10
    assert time.monotonic() - started < 1.0
    fast = time_call(lambda: None, "cpu", deadline=time.monotonic() + 5)
    assert not fast.cut_short and len(fast.samples_us) >= 10


def test_a_row_timed_past_its_budget_says_so_in_its_note(tmp_path, monkeypatch, plugin):
    write_cases(tmp_path / "cases.toml", {"name": "first"})
    out = tmp_path / "run"
    assert measure.ROW_BUDGET_S >= 1  # lowered below for speed
    monkeypatch.setattr(runner, "TimingSettings", functools.partial(measure.TimingSettings, budget_s=0.3))
    code = main(["run", str(tmp_path / "cases.toml"), "--plugin", str(plugin), "--backend", "slow",
                 "--isolate", "none", "--no-progress", "--device", "cpu", "--out", str(out)])  # fmt: skip
    assert code == 0
    row = pd.read_parquet(out / "results.parquet").iloc[0]
    assert row["status"] == "pass"
    assert "timed within a 0.3 s budget:" in row["note"] and row["timing_reps"] < 10
