"""``compare --confirm``: re-time the doubtful rows, alternating the two builds row by row.

Two runs made minutes apart on a shared machine see different loads: on a busy 2-core
box whole runs drift by 30% and more, while the samples inside one run are tight, so a
row can look "slower" with a tiny p-value because the machine was busier. No statistic
over two separate runs can tell that apart; timing both builds under the same load can.
Confirm mode does that, in the manner of ``asv continuous``:

1. each run's commit (meta.json ``commit``) is checked out with ``git worktree add
   --detach`` into a temporary folder (or given: ``checkouts``);
2. each round starts one fresh worker process per build in its checkout (its own
   ``harness`` and ``kernels`` on PYTHONPATH, the original run's plugins loaded, torch
   threads as the run recorded in ``timing_threads``); a worker builds a row's inputs and
   answers "time (case, backend)" with the samples of that build's ``time_call``;
3. in each of ``rounds`` rounds, every chosen row (by default those judged slower or
   "cannot tell"; ``all``: every timed row) is timed for about 50 ms by base then new
   (new then base on odd rounds), so both builds of a row are timed within a second;
4. each round gives one observation per build, its median: a process has its own
   persistent speed (memory placement: two identical processes on this loaded 2-core
   machine differed by 1.5-2x for a whole session, even pinned to one CPU), so samples of
   one process are not independent observations, while fresh processes per round make
   that effect part of the noise; the ``rounds`` observations per build are judged again
   with :mod:`harness.stats` (corrected over the re-judged rows): a slower verdict
   stands only when confirmed.

The worktrees are removed at the end. Without commits or case files it says why and
changes nothing. Rows only: status and accuracy changes are not re-run.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from . import stats
from .compare import CompareOptions, Comparison, _row_changes

WORKER = r"""
import json, sys
import torch
from harness.backends import REGISTRY, load_plugin
from harness.cases import load_cases
from harness.inputs import make_inputs
from harness.timing import time_call

cfg = json.loads(sys.argv[1])
if cfg.get("threads"):
    torch.set_num_threads(int(cfg["threads"]))
for plugin in cfg["plugins"]:
    load_plugin(plugin)
cases = {c.id: c for c in load_cases(cfg["case_files"], device=cfg["device"])}
ready = {}
for line in sys.stdin:
    case_id, backend = json.loads(line)
    try:
        if (case_id, backend) not in ready:
            case, b = cases[case_id], REGISTRY[backend]
            inputs = make_inputs(
                num_q_heads=case.num_q_heads, num_kv_heads=case.num_kv_heads, head_dim=case.head_dim,
                block_size=case.block_size, seq_lens=list(case.seq_lens), q_lens=list(case.q_lens),
                dtype=case.dtype, layout=case.layout, input_scale=case.input_scale, seed=case.seed,
                device=cfg["device"], **(case.variant_fields() if hasattr(case, "variant_fields") else {}),
            )
            out = inputs.new_out()
            ready[(case_id, backend)] = (b.prepare(case, inputs, out).run, b.graphable)
        run, graphable = ready[(case_id, backend)]
        timing = time_call(run, cfg["device"], graphable=graphable, target_s=cfg["target_s"], min_reps=5)
        print(json.dumps(list(timing.samples_us)), flush=True)
    except Exception as error:
        print(json.dumps({"error": f"{type(error).__name__}: {error}"}), flush=True)
"""


class Worker:
    """One build's timing process: ``time(case, backend)`` returns that build's samples (us)."""

    def __init__(self, checkout: Path, config: dict, env: dict[str, str] | None = None):
        env = {**os.environ, **(env or {})}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")]))
        env.setdefault("TRITON_INTERPRET", "1" if config["device"] == "cpu" else "0")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, json.dumps(config)],
            cwd=checkout, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def time(self, case: str, backend: str) -> list[float]:
        self.proc.stdin.write(json.dumps([case, backend]) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"confirm worker exited (code {self.proc.wait()}) timing {backend} on {case}")
        answer = json.loads(line)
        if isinstance(answer, dict):
            raise RuntimeError(f"confirm worker could not time {backend} on {case}: {answer['error']}")
        return answer

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _plugins(command: str) -> list[str]:
    words = shlex.split(command or "")
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--plugin"]


def _worktree(commit: str, path: Path) -> Path:
    subprocess.run(["git", "worktree", "add", "--detach", str(path), commit], check=True, capture_output=True)
    return path


def confirm_slower(
    comparison: Comparison,
    base_meta: dict,
    new_meta: dict,
    options: CompareOptions,
    *,
    rounds: int = 8,
    which: str = "unclear",
    target_s: float = 0.05,
    checkouts: tuple[Path, Path] | None = None,
    envs: tuple[dict, dict] = ({}, {}),
    log: Callable[[str], None] = print,
) -> Comparison:
    """Re-time rows, base and new alternating per row, and judge them again from those samples.

    ``which``: "slower" (rows judged slower), "unclear" (slower or cannot tell: the
    default) or "all" (every row timed in both runs: a drifted pair of runs can also hide
    a slowdown as "same"). Each re-timed call samples for about ``target_s``.
    """
    rows = comparison.rows
    wanted = {
        "slower": ["slower"],
        "unclear": ["slower", "cannot tell"],
        "all": ["slower", "faster", "same", "cannot tell"],
    }
    slower = rows[rows["verdict"].isin(wanted[which]) & rows["latency_us_new"].notna()]
    if slower.empty:
        return comparison
    commits = (base_meta.get("commit"), new_meta.get("commit"))
    case_files = new_meta.get("case_files") or base_meta.get("case_files")
    if not case_files or (checkouts is None and not all(commits)):
        log("confirm: skipped: a run records no commit or no case files, so its build cannot be re-run")
        return comparison
    config = {
        "case_files": case_files,
        "device": str(new_meta.get("device") or "cpu"),
        "plugins": _plugins(new_meta.get("command", "")),
        "threads": new_meta.get("timing_threads"),
        "target_s": target_s,
    }
    keys = list(zip(slower["case"], slower["backend"], strict=True))
    pooled: dict[tuple[str, str], tuple[list[float], list[float]]] = {key: ([], []) for key in keys}
    with tempfile.TemporaryDirectory(prefix="harness-confirm-") as tmp:
        trees = checkouts or tuple(_worktree(c, Path(tmp) / s) for c, s in zip(commits, ("base", "new"), strict=True))
        try:
            log(f"confirm: re-timing {len(keys)} row(s) ({which}), {rounds} rounds of fresh base and new processes")
            for k in range(rounds):
                workers = [Worker(tree, config, env) for tree, env in zip(trees, envs, strict=True)]
                try:
                    order = (0, 1) if k % 2 == 0 else (1, 0)
                    for key in keys:
                        for side in order:
                            pooled[key][side].append(float(np.median(workers[side].time(*key))))
                finally:
                    for worker in workers:
                        worker.close()
        finally:
            if checkouts is None:
                for tree in trees:
                    subprocess.run(["git", "worktree", "remove", "--force", str(tree)], capture_output=True)
    return rejudge(comparison, dict(zip(slower.index, keys, strict=True)), pooled, options)


def rejudge(comparison: Comparison, index: dict, pooled: dict, options: CompareOptions) -> Comparison:
    """Judge the re-timed rows again from their pooled samples; rebuild their 'why'."""
    rows = comparison.rows.copy()
    tests = {i: stats.compare_samples(*pooled[key], alpha=options.alpha, seed=i) for i, key in index.items()}
    p_adjusted = stats.adjust_p_values([t.p_value for t in tests.values()], options.correction)
    for (i, t), p in zip(tests.items(), p_adjusted, strict=True):
        effect = (
            options.min_effect if options.min_effect is not None else stats.default_effect(rows.at[i, "device_new"])
        )
        v = stats.decide(t, p, min_effect=effect, alpha=options.alpha)
        rows.loc[i, ["ratio", "ci_low", "ci_high", "p_value", "p_adjusted"]] = [
            t.ratio,
            t.ci_low,
            t.ci_high,
            t.p_value,
            p,
        ]
        rows.at[i, "verdict"], rows.at[i, "evidence"] = v.verdict, "confirmed, interleaved"
        rows.at[i, "verdict_reason"] = f"interleaved re-run, {t.n_base} rounds: {v.reason}"
        worse, better = _row_changes(rows.loc[i], options)
        rows.at[i, "why"], rows.at[i, "better"] = "; ".join(worse), "; ".join(better)
    return Comparison(rows=rows, problems=comparison.problems, incomplete=comparison.incomplete)
