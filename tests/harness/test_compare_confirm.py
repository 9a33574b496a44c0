"""compare --confirm: a drifted 'slower' row is cleared by interleaved re-timing; a real slowdown stays."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from harness.review import confirm
from harness.review.compare import EXIT_WORSE, CompareOptions, compare_runs
from harness.review.confirm import _one_round, _plugins, confirm_slower
from tests.harness import review_frames as rf

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "scripts" / "self" / "slowdown_plugin.py"


def _runs(tmp_path, factor: float):
    """Two hand-made runs where both rows look 'slower' by ``factor`` in the new one (as a load drift makes them)."""
    case_file = tmp_path / "tiny.toml"
    case_file.write_text(rf.TINY_CASE_FILE)
    rng = np.random.default_rng(0)
    base = pd.DataFrame([rf.row("tiny", b, 300.0, rng) for b in ("reference", "reference_slowable")])
    new = pd.DataFrame([rf.row("tiny", b, 300.0 * factor, rng) for b in ("reference", "reference_slowable")])
    meta = rf.meta(
        case_files=[str(case_file)], command=f"python -m harness run {case_file} --plugin {PLUGIN}", timing_threads=1
    )
    return base, new, meta


class SimulatedWorker:
    """A build's timing process in this process: ~1 ms a call, ``reference_slowable`` x (1 + HARNESS_SLOWDOWN)."""

    rng = np.random.default_rng(0)

    def __init__(self, checkout, config, env=None):
        self.slowdown = float((env or {}).get("HARNESS_SLOWDOWN", 0))
        self.speed = float(np.exp(self.rng.normal(0, 0.05)))
        self.proc = SimpleNamespace(pid=os.getpid())  # what _pin sets the affinity of

    def wait_ready(self) -> None:
        pass

    def time(self, case: str, backend: str, reps: int = 0) -> list[float]:
        factor = 1 + self.slowdown if backend == "reference_slowable" else 1.0
        return list(1000.0 * factor * self.speed * np.exp(self.rng.normal(0, 0.1, reps or 10)))

    def close(self) -> None:
        pass


SLOWED_IN_NEW = ({"HARNESS_SLOWDOWN": "0"}, {"HARNESS_SLOWDOWN": "8"})  # only reference_slowable is slower in "new"


def test_confirm_keeps_a_real_slowdown_and_clears_one_that_interleaved_timing_does_not_reproduce(tmp_path, monkeypatch):
    """The whole confirm driver (rounds, alternating steps, looks, verdicts) over simulated build processes."""
    monkeypatch.setattr(confirm, "Worker", SimulatedWorker)
    monkeypatch.setattr(SimulatedWorker, "rng", np.random.default_rng(0))
    base, new, meta = _runs(tmp_path, 1.5)
    comparison = compare_runs(base, new, meta, meta)
    assert (comparison.rows["verdict"] == "slower").all() and comparison.exit_code == EXIT_WORSE
    confirmed = confirm_slower(
        comparison,
        meta,
        meta,
        CompareOptions(),
        rounds=9,
        checkouts=(ROOT, ROOT),
        envs=SLOWED_IN_NEW,
        log=lambda _: None,
        plugins=[str(PLUGIN)],
    )
    rows = confirmed.rows.set_index("backend")
    assert (rows["evidence"] == "confirmed, interleaved").all()
    assert rows.loc["reference_slowable", "verdict"] == "slower", rows.loc["reference_slowable", "verdict_reason"]
    assert rows.loc["reference", "verdict"] != "slower", rows.loc["reference", "verdict_reason"]
    assert confirmed.exit_code == EXIT_WORSE and list(confirmed.regressions["backend"]) == ["reference_slowable"]
    assert "interleaved re-run, 9 paired rounds" in confirmed.regressions["why"][0]


@pytest.mark.slow  # two builds' worker processes timed in rounds
def test_a_real_round_of_two_build_processes_times_the_planted_slowdown_and_not_the_workers_start(
    tmp_path, monkeypatch
):
    """One round with real worker processes, after which no row's rounds fit the box, so confirm judges that round."""
    monkeypatch.setattr(confirm, "ROUND_S", 0.1)  # a short round: the planted slowdown (9x) shows in a few calls
    rounds = []

    def one_round(trees, envs, config, keys, pooled, new_first):
        began = time.monotonic()
        spent = _one_round(trees, envs, config, keys, pooled, new_first)
        rounds.append((spent, time.monotonic() - began))
        return spent

    monkeypatch.setattr(confirm, "_one_round", one_round)
    base, new, meta = _runs(tmp_path, 1.5)
    said = []
    confirmed = confirm_slower(
        compare_runs(base, new, meta, meta),
        meta,
        meta,
        CompareOptions(),
        rounds=9,
        time_s=1.0,  # less than the round itself took: nothing more fits
        checkouts=(ROOT, ROOT),
        envs=SLOWED_IN_NEW,
        log=said.append,
        plugins=[str(PLUGIN)],
        target_s=0.05,
    )
    assert len(rounds) == 1 and "confirm: round 1: 2 row(s) left undecided" in said[1], said
    ((spent, took),) = rounds
    assert set(spent) == {("tiny", "reference"), ("tiny", "reference_slowable")} and all(s > 0 for s in spent.values())
    assert sum(spent.values()) < took - 0.5, (spent, took)  # importing torch in two fresh workers is not a row's
    rows = confirmed.rows.set_index("backend")
    assert (rows["evidence"] == "confirmed, interleaved").all()
    assert rows["verdict_reason"].str.contains("1 paired rounds").all() and (rows["verdict"] == "cannot tell").all()
    # 9x planted in the new build's reference_slowable only; a process's own speed (up to 2-3x on a busy box)
    # moves both rows of one process alike, so the slowdown is read against the unslowed row's ratio
    assert rows.loc["reference_slowable", "ratio"] > 3 * rows.loc["reference", "ratio"], rows["ratio"]


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
