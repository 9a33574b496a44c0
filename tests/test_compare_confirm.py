"""compare --confirm: a drifted 'slower' row is cleared by interleaved re-timing; a real slowdown stays."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.review import confirm
from harness.review.compare import EXIT_WORSE, CompareOptions, compare_runs
from harness.review.confirm import _one_round, _plugins, confirm_slower
from tests import review_frames as rf

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "scripts" / "slowdown_plugin.py"
CASE_FILE = """
[[case]]
name = "tiny"
num_q_heads = 8
num_kv_heads = 2
head_dim = 64
block_size = 16
seq_lens = [300, 200, 500, 400]
"""


def _runs(tmp_path, factor: float):
    """Two hand-made runs where both rows look 'slower' by ``factor`` in the new one (as a load drift makes them)."""
    case_file = tmp_path / "tiny.toml"
    case_file.write_text(CASE_FILE)
    rng = np.random.default_rng(0)
    base = pd.DataFrame([rf.row("tiny", b, 300.0, rng) for b in ("reference", "reference_slowable")])
    new = pd.DataFrame([rf.row("tiny", b, 300.0 * factor, rng) for b in ("reference", "reference_slowable")])
    meta = rf.meta(
        case_files=[str(case_file)], command=f"python -m harness run {case_file} --plugin {PLUGIN}", timing_threads=1
    )
    return base, new, meta


# 9 rounds of two fresh worker processes each (18 torch imports); minutes on a loaded 2-core box.
@pytest.mark.timeout(600)
def test_confirm_keeps_a_real_slowdown_and_clears_one_that_interleaved_timing_does_not_reproduce(tmp_path, monkeypatch):
    # 0.1 s of calls per build and round instead of 0.8 s: the planted slowdown (9x) shows in a few
    # calls, and the slowed build's round would otherwise take 9 x 0.8 s.
    monkeypatch.setattr(confirm, "ROUND_S", 0.1)
    base, new, meta = _runs(tmp_path, 1.5)
    comparison = compare_runs(base, new, meta, meta)
    assert (comparison.rows["verdict"] == "slower").all() and comparison.exit_code == EXIT_WORSE
    envs = ({"HARNESS_SLOWDOWN": "0"}, {"HARNESS_SLOWDOWN": "8"})  # only reference_slowable is slower in "new"
    confirmed = confirm_slower(
        comparison,
        meta,
        meta,
        CompareOptions(),
        rounds=9,
        checkouts=(ROOT, ROOT),
        envs=envs,
        log=lambda _: None,
        plugins=[str(PLUGIN)],
    )
    rows = confirmed.rows.set_index("backend")
    assert (rows["evidence"] == "confirmed, interleaved").all()
    assert rows.loc["reference_slowable", "verdict"] == "slower", rows.loc["reference_slowable", "verdict_reason"]
    assert rows.loc["reference", "verdict"] != "slower", rows.loc["reference", "verdict_reason"]
    assert confirmed.exit_code == EXIT_WORSE and list(confirmed.regressions["backend"]) == ["reference_slowable"]
    assert "interleaved re-run, 9 paired rounds" in confirmed.regressions["why"][0]


def test_confirm_without_commits_changes_nothing_and_says_why(tmp_path):
    base, new, meta = _runs(tmp_path, 1.5)
    meta = {**meta, "commit": None}
    comparison = compare_runs(base, new, meta, meta)
    said = []
    assert confirm_slower(comparison, meta, meta, CompareOptions(), log=said.append) is comparison
    assert "cannot be re-run" in said[0]


@pytest.mark.parametrize(
    ("command", "plugins"), [("python -m harness run x --plugin a.py --plugin mod", ["a.py", "mod"]), ("", [])]
)
def test_confirm_reuses_the_plugins_of_the_original_command(command, plugins):
    assert _plugins(command) == plugins


def test_a_round_reports_each_rows_seconds_without_the_workers_start(tmp_path, monkeypatch):
    monkeypatch.setattr(confirm, "ROUND_S", 0.1)  # a short round: what is measured is the workers' start
    _, _, meta = _runs(tmp_path, 1.0)
    config = {
        "case_files": meta["case_files"],
        "device": "cpu",
        "plugins": [str(PLUGIN)],
        "threads": 1,
        "target_s": 0.05,
    }
    keys = [("tiny", "reference"), ("tiny", "reference_slowable")]
    pooled = {key: ([], []) for key in keys}
    began = time.monotonic()
    spent = _one_round((ROOT, ROOT), ({}, {}), config, keys, pooled, False)
    took = time.monotonic() - began
    assert set(spent) == set(keys) and all(s > 0 for s in spent.values()), spent
    assert all(len(pooled[key][0]) == len(pooled[key][1]) == 1 for key in keys)
    assert sum(spent.values()) < took - 0.5, (spent, took)  # importing torch in two fresh workers is not a row's


def test_too_few_confirm_rounds_is_bad_input_before_any_run_is_read(tmp_path, capsys):
    """--confirm-rounds below the first look (9) could never decide a row: exit 2 naming the option."""
    from harness.cli.main import main

    missing = str(tmp_path / "no_such_run")
    assert main(["compare", missing, missing, "--confirm", "all", "--confirm-rounds", "8"]) == 2
    assert "--confirm-rounds 8: at least 9 rounds" in capsys.readouterr().err
