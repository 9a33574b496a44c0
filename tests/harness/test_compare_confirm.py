"""compare --confirm re-times doubtful 'slower' rows: drift is cleared, a real slowdown stays, the rest exit 5."""

from __future__ import annotations

import os
import re
import subprocess
import time
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from harness.cli.main import main
from harness.review import confirm
from harness.review.compare import EXIT_WORSE, CompareOptions, compare_runs
from harness.review.confirm import _one_round, _plugins, confirm_slower
from tests.fresh_python import ROOT
from tests.harness import review_frames as rf
from tests.tiny_cases import write_cases

PLUGIN = ROOT / "scripts" / "self" / "slowdown_plugin.py"
HEAD = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
TRULY_SLOWER = {"tlsim": 1.3}  # what paired rounds of the two builds measure; every other backend is unchanged
# The case of the runs re-timed here, in a file of its own: the shape review_frames.row gives its rows.
TINY = dict(name="tiny", num_q_heads=8, num_kv_heads=2, head_dim=64, block_size=16, seq_lens=[300, 200, 500, 400])


def _drifted(tmp_path, factor: float):
    """Two hand-made runs where both rows look 'slower' by ``factor`` in the new one (as a load drift makes them)."""
    case_file = write_cases(tmp_path / "tiny.toml", TINY, defaults={})
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


def _confirm(comparison, meta, **options):
    """confirm_slower in 9 rounds of two builds of this tree, reference_slowable slower in the new one only."""
    return confirm_slower(comparison, meta, meta, CompareOptions(), rounds=9, checkouts=(ROOT, ROOT),
                          envs=SLOWED_IN_NEW, plugins=[str(PLUGIN)], **options)  # fmt: skip


def test_confirm_keeps_a_real_slowdown_and_clears_one_that_interleaved_timing_does_not_reproduce(tmp_path, monkeypatch):
    """The whole confirm driver (rounds, alternating steps, looks, verdicts) over simulated build processes."""
    monkeypatch.setattr(confirm, "Worker", SimulatedWorker)
    monkeypatch.setattr(SimulatedWorker, "rng", np.random.default_rng(0))
    base, new, meta = _drifted(tmp_path, 1.5)
    comparison = compare_runs(base, new, meta, meta)
    assert (comparison.rows["verdict"] == "slower").all() and comparison.exit_code == EXIT_WORSE
    confirmed = _confirm(comparison, meta, log=lambda _: None)
    rows = confirmed.rows.set_index("backend")
    assert (rows["evidence"] == "confirmed, interleaved").all()
    assert rows.loc["reference_slowable", "verdict"] == "slower", rows.loc["reference_slowable", "verdict_reason"]
    assert rows.loc["reference", "verdict"] != "slower", rows.loc["reference", "verdict_reason"]
    assert confirmed.exit_code == EXIT_WORSE and list(confirmed.regressions["backend"]) == ["reference_slowable"]
    assert "interleaved re-run, 9 paired rounds" in confirmed.regressions["why"][0]


@pytest.mark.slow  # two builds' worker processes timed in rounds
def test_a_real_round_of_two_build_processes_times_the_planted_slowdown_not_the_workers_start(tmp_path, monkeypatch):
    """One round with real worker processes, after which no row's rounds fit the box, so confirm judges that round."""
    monkeypatch.setattr(confirm, "ROUND_S", 0.1)  # a short round: the planted slowdown (9x) shows in a few calls
    rounds = []

    def one_round(trees, envs, config, keys, pooled, new_first):
        began = time.monotonic()
        spent = _one_round(trees, envs, config, keys, pooled, new_first)
        rounds.append((spent, time.monotonic() - began))
        return spent

    monkeypatch.setattr(confirm, "_one_round", one_round)
    base, new, meta = _drifted(tmp_path, 1.5)
    said = []
    # a time box of less than the round itself took: nothing more fits
    confirmed = _confirm(compare_runs(base, new, meta, meta), meta, log=said.append, time_s=1.0, target_s=0.05)
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
    base, new, meta = _drifted(tmp_path, 1.5)
    meta = {**meta, "commit": None}
    comparison = compare_runs(base, new, meta, meta)
    said = []
    assert confirm_slower(comparison, meta, meta, CompareOptions(), log=said.append) is comparison
    assert "cannot be re-run" in said[0]


def test_confirm_reuses_the_plugins_of_the_original_command():
    assert _plugins("python -m harness run x --plugin a.py --plugin mod") == ["a.py", "mod"] and _plugins("") == []


# --- the compare command, its paired rounds without git or workers ---------------------------------------------------


@pytest.fixture
def rounds(monkeypatch):
    """Paired rounds without git or workers: empty checkouts, each round a shared load and per-process speed."""
    timed: list[list] = []
    rng = np.random.default_rng(7)

    def one_round(trees, envs, config, keys, pooled, new_first):
        timed.append(list(keys))
        load = float(np.exp(rng.normal(0, 0.4)))
        for key in keys:
            base = 100.0 * load * float(np.exp(rng.normal(0, 0.03)))
            new = 100.0 * TRULY_SLOWER.get(key[1], 1.0) * load * float(np.exp(rng.normal(0, 0.03)))
            pooled[key][0].append(base)
            pooled[key][1].append(new)
        return {key: 0.01 for key in keys}

    def worktree(commit, path):
        path.mkdir(parents=True)
        return path

    monkeypatch.setattr(confirm, "_one_round", one_round)
    monkeypatch.setattr(confirm, "worktree", worktree)
    return timed


def _runs(
    tmp_path, slow: dict, *, base_meta: dict | None = None, new_frame=None, both: dict | None = None
) -> tuple[str, str]:
    """Two run folders of one commit; ``slow`` makes backends look slower in the new run (a drift or a real change)."""
    case_file = write_cases(tmp_path / "tiny.toml", TINY, defaults={})
    meta = rf.meta(**{"commit": HEAD, "case_files": [str(case_file)], "timing_threads": 1, **(both or {})})
    base = rf.write(rf.frame(3, seed=0), {**meta, **(base_meta or {})}, tmp_path / "base")
    new = rf.write(new_frame if new_frame is not None else rf.frame(3, seed=1, slow=slow), meta, tmp_path / "new")
    return str(base), str(new)


def _table(out: str) -> dict[tuple[str, str], str]:
    """(backend, case) -> the first word of its line in compare's table."""
    found = {}
    for line in out.splitlines():
        words = line.split()
        if len(words) > 2 and words[0] in ("WORSE", "UNCONFIRMED", "better", "?"):
            found[(words[1], words[2])] = words[0]
    return found


def test_rows_a_drift_makes_slower_are_retimed_by_default_and_a_confirmed_slowdown_says_so(tmp_path, rounds, capsys):
    # every backend looks 1.5x slower in the new run (the load); paired rounds find only tlsim slower (1.3x)
    base, new = _runs(tmp_path, {"reference": 1.5, "tlsim": 1.5, "gather_sdpa": 1.5})
    page = tmp_path / "compare.html"
    assert main(["compare", base, new, "--html", str(page)]) == 1
    out, err = capsys.readouterr()
    assert {backend for keys in rounds for _, backend in keys} == {"reference", "tlsim", "gather_sdpa"}
    assert "time box 900 s: done within about 15 min" in err
    assert "confirm: round 1 of at most 32 done" in err  # stderr is no terminal: a line a round, no bar
    table = _table(out)
    assert {b for (b, _), what in table.items() if what == "WORSE"} == {"tlsim"}, out
    assert sum(what == "WORSE" for what in table.values()) == 3, out
    assert "interleaved re-run" in out and "UNCONFIRMED" not in out
    drift = [line for line in out.splitlines() if line.startswith("! latency drift: 9 of 9 timed rows")]
    assert len(drift) == 1, out
    assert "re-timed 9 row(s): 3 slower, 6 same; the 3 confirmed slower are a change of the code, not of the " \
           "machine's load" in drift[0]  # fmt: skip
    assert "likely" not in drift[0]
    html = page.read_text()
    assert "the 3 confirmed slower are a change of the code" in html and "likely" not in html
    body = html[html.index("<tbody>") : html.index("</tbody>")]  # the compare table's cells as text, by row
    cells = [[re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
             for row in body.split("</tr>") if "<td" in row]  # fmt: skip
    assert len(cells) == 9 and all(row[8] for row in cells), "every re-timed row has its adjusted p"
    assert all(float(row[8]) <= 0.05 for row in cells if row[9].startswith("slower"))
    # the same runs without paired rounds: the drift is read as the load's, and the note says none were re-timed
    assert main(["compare", base, new, "--no-confirm"]) == 5
    out = capsys.readouterr().out
    assert (
        "the machine's load likely changed between them, and no row was re-timed in paired rounds: --no-confirm" in out
    )


def _checkout_fails(commit, path):
    raise subprocess.CalledProcessError(128, ["git", "worktree", "add"], stderr=b"fatal: no space left")


UNCONFIRMED_TLSIM = (("UNCONFIRMED", "tlsim"),) * 3
# compare of two runs, tlsim 1.5x slower in the new one unless new_frame: (base_meta, both metas, new_frame, git
# worktree, extra argv, exit, table lines (first word, backend), words); nothing is re-timed in paired rounds.
NOT_RETIMED = {
    "--no-confirm": ({}, {}, None, None, ["--no-confirm"], 5, UNCONFIRMED_TLSIM,
                     ("not re-timed in paired rounds: --no-confirm", "latency verdicts: ", "unconfirmed 3",
                      "exit 5: nothing is confirmed worse, but 3 latency row(s)")),
    "no commit": ({"commit": None}, {}, None, None, [], 5, UNCONFIRMED_TLSIM, ("records no commit",)),
    "a dirty tree": ({"dirty": True}, {}, None, None, [], 5, UNCONFIRMED_TLSIM, ("uncommitted changes",)),
    "no case file": ({}, {"case_files": ["/no/such/cases.toml"]}, None, None, [], 5, UNCONFIRMED_TLSIM,
                     ("case file /no/such/cases.toml is not here",)),
    "no case files recorded": ({}, {"case_files": []}, None, None, [], 5, UNCONFIRMED_TLSIM,
                               ("the runs record no case files",)),
    "no such commit": ({"commit": "f" * 40}, {}, None, None, [], 5, UNCONFIRMED_TLSIM,
                       ("is not a commit of this repository",)),
    "a checkout failing": ({}, {}, None, _checkout_fails, [], 5, UNCONFIRMED_TLSIM,
                           ("checking out a commit failed: fatal: no space left",)),
    "--confirm of no such commit": ({"commit": "f" * 40}, {}, None, None, ["--confirm"], 2, (),
                                    ("is not a commit of this repository",)),
    "an accuracy regression": ({}, {}, lambda: rf.with_row(rf.frame(3, seed=0), "case01", "tlsim", max_abs_err=5e-6),
                               None, [], 1, (("WORSE", "tlsim"),),
                               ("max abs err 2.00e-07 -> 5.00e-06", "exit 1: 1 row(s) got worse")),
    "an accuracy regression beside unconfirmed latency": (
        {"commit": None}, {}, lambda: rf.with_row(rf.frame(3, seed=1, slow={"tlsim": 1.5}), "case00", "reference",
                                                  status="fail"),
        None, [], 1, (*UNCONFIRMED_TLSIM, ("WORSE", "reference")), ("status pass -> fail",)),
}  # fmt: skip


@pytest.mark.parametrize("name", NOT_RETIMED)
def test_rows_not_re_timed_get_their_exit_code_and_say_why(tmp_path, rounds, monkeypatch, capsys, name):
    """Unconfirmed slower rows exit 5 saying why; --confirm of a bad commit is 2; an accuracy regression is 1."""
    base_meta, both, new_frame, worktree, extra, exit_code, lines, words = NOT_RETIMED[name]
    if worktree is not None:
        monkeypatch.setattr(confirm, "worktree", worktree)
    new_frame = new_frame() if new_frame else None
    base, new = _runs(tmp_path, {"tlsim": 1.5}, base_meta=base_meta, both=both, new_frame=new_frame)
    assert main(["compare", base, new, *extra]) == exit_code
    out, err = capsys.readouterr()
    assert not rounds
    assert sorted((word, backend) for (backend, _), word in _table(out).items()) == sorted(lines), out
    assert all(w in (err if exit_code == 2 else out) for w in words), out + err


def test_only_a_commit_of_your_own_history_is_re_timed(tmp_path, git_history, monkeypatch):
    """Only commits reachable from HEAD or a local branch are re-timed; fetched or loose ones are refused by field."""
    ids = git_history
    monkeypatch.chdir(tmp_path / "repo")
    assert confirm.checked_commit(ids["head"][:10], "x/meta.json") == ids["head"]
    assert confirm.checked_commit(ids["branch"], "x/meta.json") == ids["branch"]
    for name in ("fetched", "loose"):
        with pytest.raises(
            confirm.ConfirmInputError, match=f"x/meta.json: field 'commit': {ids[name]} is not in your history"
        ):
            confirm.checked_commit(ids[name], "x/meta.json")
