"""--shard I/N splits cases alike on every host; merge joins them into the one-process rows."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from harness.cases.loading import load_cases
from harness.cli.main import main
from harness.execute.shards import shard_cases
from harness.timing.metrics import case_cost
from tests.harness import review_frames as rf

SMOKE = ["run", "smoke", "--backend", "reference", "--backend", "tlsim", "--no-timing", "--no-progress",
         "--oracle-cache", "off"]  # fmt: skip


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_shards_partition_the_cases_and_deal_the_large_ones_round_robin(count):
    cases = load_cases(["harness/cases/suites/smoke.toml"], device="cpu")
    shards = [shard_cases(cases, index, count) for index in range(count)]
    ids = [case.id for shard in shards for case in shard]
    assert sorted(ids) == sorted(c.id for c in cases) and len(set(ids)) == len(ids)  # every case, once
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    largest = sorted(cases, key=lambda c: (-case_cost(c), c.id))[:count]
    assert [largest[i].id in {c.id for c in shards[i]} for i in range(count)] == [True] * count
    assert [c.id for c in shard_cases(cases, 0, count)] == [c.id for c in shards[0]]  # the same on every host
    assert all([c.id for c in s] == [c.id for c in cases if c in s] for s in shards)  # in file order


@pytest.fixture(scope="module")
def shard_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hosts")
    for index in range(2):
        assert main([*SMOKE, "--shard", f"{index}/2", "--out", str(root / f"host{index}")]) == 0
    assert main([*SMOKE, "--out", str(root / "whole")]) == 0
    return root


def test_merged_shards_give_the_one_process_rows_and_say_where_they_came_from(shard_runs, tmp_path):
    out = tmp_path / "merged"
    assert main(["merge", str(out), str(shard_runs / "host0"), str(shard_runs / "host1")]) == 0
    merged = pd.read_parquet(out / "results.parquet").set_index(["case", "backend"]).sort_index()
    whole = pd.read_parquet(shard_runs / "whole" / "results.parquet").set_index(["case", "backend"]).sort_index()
    assert merged.index.equals(whole.index)
    for column in ("status", "max_abs_err", "tol_ratio", "nan_count"):
        pd.testing.assert_series_equal(merged[column], whole[column])
    meta = json.loads((out / "meta.json").read_text())
    assert [entry["run"] for entry in meta["merged_from"]] == [str(shard_runs / "host0"), str(shard_runs / "host1")]
    assert sum(entry["rows"] for entry in meta["merged_from"]) == len(merged)
    assert (out / "report.html").is_file() and "scale" not in meta


def test_merge_keeps_incomplete_records_gpu_models_mixed_commits_warns_of_absent_shards(shard_runs, tmp_path, capsys):
    gpu = {"host": "node", "gpu_index": "0", "ceilings": {}}
    host0 = rf.copy_run(shard_runs / "host0", {"shard": "0/3", "gpus": [{**gpu, "gpu_name": "NVIDIA H200"}]},
                        to=tmp_path / "h0")  # fmt: skip
    host1 = rf.copy_run(shard_runs / "host1", {"shard": "1/3", "commit": "f" * 40, "gpus": [{**gpu, "gpu_name":
                        "NVIDIA H100"}], "incomplete": {"missing": ["x tlsim", "y tlsim"], "missing_pairs": 2}},
                        to=tmp_path / "h1")  # fmt: skip
    out = tmp_path / "merged"
    assert main(["merge", str(out), str(host0), str(host1), "--allow-mixed-commits"]) == 0
    assert "shards 2/3 are not among the runs" in capsys.readouterr().err
    meta = json.loads((out / "meta.json").read_text())
    assert meta["incomplete"]["missing"] == ["x tlsim", "y tlsim"] and meta["incomplete"]["runs"] == [str(host1)]
    assert meta["incomplete"]["shards"] == ["shards 2/3 are not among the runs"]
    assert [g["gpu_name"] for g in meta["gpus"]] == ["NVIDIA H100", "NVIDIA H200"]  # same host and index: both kept
    assert meta["device_name"].startswith("mixed GPU models") and meta["command"].startswith("harness merge ")
    assert [m["shard"] for m in meta["merged_from"]] == ["0/3", "1/3"] and meta["commit"].startswith("mixed: ")
