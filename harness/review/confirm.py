"""``compare --confirm``: re-time the doubtful rows, alternating the two builds step by step.

Both builds timed under one load tell a slowdown from a busier machine (docs/review.md): each round starts
a fresh :class:`Worker` per build in a worktree of its commit; rows are judged at sequential looks."""

import contextlib
import functools
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tqdm import tqdm

from harness.backends.builtin import REGISTRY
from harness.backends.registry import UnnamedPluginError, require_plugins
from harness.review import compare, stats
from harness.review.compare import CompareOptions, Comparison

WORKER = r"""
import ctypes, json, os, signal, sys

cfg = json.loads(sys.argv[1])
# Die with the compare that started this worker (Linux PR_SET_PDEATHSIG = 1), before importing torch.
if sys.platform.startswith("linux"):
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
if os.getppid() != cfg["parent_pid"]:
    os._exit(1)
import torch
try:
    from harness.backends.builtin import REGISTRY, load_plugin
    from harness.cases.loading import load_cases
    from harness.cases.inputs import make_inputs
    from harness.timing.timer import time_call
except ImportError:  # a build whose harness/ is not grouped in sub-packages
    from harness.backends import REGISTRY, load_plugin
    from harness.cases import load_cases
    from harness.inputs import make_inputs
    from harness.timing import time_call

if cfg.get("threads"):  # the run's recorded count (data): at most this machine's cores
    torch.set_num_threads(min(int(cfg["threads"]), os.cpu_count() or 1))
for plugin in cfg["plugins"]:
    load_plugin(plugin)
cases = {c.id: c for c in load_cases(cfg["case_files"], device=cfg["device"])}
print(json.dumps("ready"), flush=True)
ready = {}
for line in sys.stdin:
    case_id, backend, *step = json.loads(line)
    reps = step[0] if step else 0
    try:
        if (case_id, backend) not in ready:
            case, b = cases[case_id], REGISTRY[backend]
            shape = ("num_q_heads", "num_kv_heads", "head_dim", "block_size", "dtype", "layout", "input_scale", "seed")
            inputs = make_inputs(**{name: getattr(case, name) for name in shape}, seq_lens=list(case.seq_lens),
                                 q_lens=list(case.q_lens), device=cfg["device"],
                                 **(case.variant_fields() if hasattr(case, "variant_fields") else {}))
            ready[(case_id, backend)] = (b.prepare(case, inputs, inputs.new_out()).run, b.graphable)
        run, graphable = ready[(case_id, backend)]
        if reps:  # one step of an alternating round: a warm-up call, then exactly `reps` timed calls
            timing = time_call(run, cfg["device"], graph=graphable, target_s=0.0, min_reps=reps, max_reps=reps)
        else:
            timing = time_call(run, cfg["device"], graph=graphable, target_s=cfg["target_s"], min_reps=10)
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
        env.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # torch: large CPU tensors 2 MB-aligned on huge pages
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, json.dumps({**config, "parent_pid": os.getpid()})],
            cwd=checkout, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def wait_ready(self) -> None:
        if json.loads(self.proc.stdout.readline() or "null") != "ready":
            raise RuntimeError(f"confirm worker exited while starting (code {self.proc.wait()})")

    def time(self, case: str, backend: str, reps: int = 0) -> list[float]:
        """Samples of one row: ``reps`` timed calls after a warm-up, or (0) ``time_call``'s time-boxed count."""
        self.proc.stdin.write(json.dumps([case, backend, reps] if reps else [case, backend]) + "\n")
        self.proc.stdin.flush()
        if not (line := self.proc.stdout.readline()):
            raise RuntimeError(f"confirm worker exited (code {self.proc.wait()}) timing {backend} on {case}")
        answer = json.loads(line)
        if isinstance(answer, dict):
            raise RuntimeError(f"confirm worker could not time {backend} on {case}: {answer['error']}")
        return answer

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


class ConfirmInputError(ValueError):
    """A run folder's meta.json that --confirm cannot act on, or a plugin it needs and was not given (exit 2)."""


def _plugins(command: str) -> list[str]:
    """The --plugin values of a run's recorded command: what its rows need, never what is imported."""
    try:
        words = shlex.split(command or "")
    except ValueError:
        words = str(command).split()
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--plugin"]


_OBJECT_ID = re.compile(r"[0-9a-fA-F]{7,64}")


def checked_commit(commit, where: str, cwd: Path | None = None) -> str:
    """``commit`` as the full id of a commit reachable from HEAD or a local branch (of the repository at
    ``cwd``); a ConfirmInputError naming ``where`` otherwise: a handed run folder must not choose code to run."""
    if not isinstance(commit, str) or not _OBJECT_ID.fullmatch(commit):
        raise ConfirmInputError(f"{where}: field 'commit': {commit!r} is not a git object id (hex digits)")
    git = functools.partial(subprocess.run, capture_output=True, text=True, cwd=cwd)
    found = git(["git", "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"])
    if found.returncode != 0:
        raise ConfirmInputError(f"{where}: field 'commit': {commit} is not a commit of this repository")
    full = found.stdout.strip()
    branches = ["git", "for-each-ref", "--contains", full, "--format=%(refname)", "refs/heads"]
    if git(["git", "merge-base", "--is-ancestor", full, "HEAD"]).returncode != 0 and not git(branches).stdout.strip():
        raise ConfirmInputError(
            f"{where}: field 'commit': {commit} is not in your history (reachable from HEAD or a local branch): "
            f"re-timing it would run code you never checked out; `git branch NAME {commit}` vouches for it"
        )
    return full


def worktree(commit: str, path: Path, cwd: Path | None = None) -> Path:
    """``commit`` (a :func:`checked_commit` id) checked out at ``path``; CalledProcessError, git's stderr on it."""
    subprocess.run(["git", "worktree", "add", "--detach", "--", str(path), commit], check=True, capture_output=True,
                   cwd=cwd)  # fmt: skip
    return path


def worker_config(case_files, device: str, plugins, threads=None, target_s: float = 0.05) -> dict:
    """A :class:`Worker`'s config: plugin paths absolute (it runs in a checkout), one CPU thread unless ``threads``."""
    plugins = [str(Path(p).resolve()) if Path(p).exists() else p for p in plugins]
    threads = threads or (1 if device == "cpu" else None)
    return {"case_files": case_files, "device": device, "plugins": plugins, "threads": threads, "target_s": target_s}


@contextlib.contextmanager
def checked_out(commits: dict[str, str], cwd: Path | None = None):
    """Each commit (label -> :func:`checked_commit` id) in a worktree of a temporary folder; removed after."""
    trees: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="harness-") as tmp:
        try:
            for label, commit in commits.items():
                trees.append(worktree(commit, Path(tmp) / label, *([cwd] if cwd else [])))
            yield tuple(trees)
        finally:
            for tree in trees:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=cwd, capture_output=True)


ROUND_QUANTILE = 0.1  # a round's observation of a build: this quantile of its samples
STEP_S = 0.005  # one alternating step: about this much of one build's calls, one call at least
ROUND_S = 0.8  # timed calls per build per row and round, about
MAX_STEPS = 24  # alternating steps per build per row and round, at most
MIN_ROUNDS = 9  # the first look: with 7 looks (9, 13, ... 29, 32) fewer rounds cannot exclude anything at 1 - 0.05 / 7
LOOK_EVERY = 4
DEFAULT_ROUNDS = 32
DEFAULT_TIME_S = 900.0
FIRST_LOOK_SHARE = 2 / 3  # of the time box, at most, for the first look's rounds
SOURCES = ("the base run", "the new run")


def look_schedule(rounds: int) -> list[int]:
    """The round counts after which rows are judged: 9, 13, 17, ... up to ``rounds`` (its last look)."""
    if rounds < MIN_ROUNDS:
        raise ValueError(f"--confirm-rounds {rounds}: at least {MIN_ROUNDS} rounds are needed for a verdict")
    looks = list(range(MIN_ROUNDS, rounds + 1, LOOK_EVERY))
    return looks if looks[-1] == rounds else [*looks, rounds]


def confirm_slower(
    comparison: Comparison, base_meta: dict, new_meta: dict, options: CompareOptions, *, rounds: int = DEFAULT_ROUNDS,
    time_s: float = DEFAULT_TIME_S, which: str = "unclear", target_s: float = 0.05,
    checkouts: tuple[Path, Path] | None = None, envs: tuple[dict, dict] = ({}, {}), log: Callable[[str], None] = print,
    plugins: list[str] = (), sources: tuple[str, str] = SOURCES, progress: bool | None = False,
) -> Comparison:  # fmt: skip
    """Re-time the rows ``which`` chooses (:func:`rows_to_retime`), base and new alternating, and judge them from
    the paired rounds: ``rounds`` at most within ``time_s``. ``plugins``: this command line's --plugin values, the
    only ones the workers import. ``progress``: a tqdm bar on stderr; None: a log line a round."""
    chosen = rows_to_retime(comparison, which)
    if chosen.empty:
        return comparison
    commits = (base_meta.get("commit"), new_meta.get("commit"))
    case_files = new_meta.get("case_files") or base_meta.get("case_files")
    if not case_files or (checkouts is None and not all(commits)):
        log("confirm: skipped: a run records no commit or no case files, so its build cannot be re-run")
        return comparison
    if checkouts is None:
        commits = tuple(checked_commit(c, f"{s}/meta.json") for c, s in zip(commits, sources, strict=True))
    if not set(chosen["backend"]) <= {name for name, backend in REGISTRY.items() if backend.kind != "plugin"}:
        try:  # a plugin's rows need the plugins the new run's command names on this command line too
            require_plugins(_plugins(str(new_meta.get("command") or "")), list(plugins), f"{sources[1]}/meta.json")
        except UnnamedPluginError as error:
            raise ConfirmInputError(str(error)) from None
    config = worker_config(case_files, str(new_meta.get("device") or "cpu"), plugins, new_meta.get("timing_threads"),
                           target_s)  # fmt: skip
    index = dict(zip(chosen.index, zip(chosen["case"], chosen["backend"], strict=True), strict=True))
    effects = {i: compare._effect(comparison.rows.loc[i], options) for i in index}
    looks = look_schedule(rounds)
    with contextlib.ExitStack() as stack:
        trees = checkouts or stack.enter_context(checked_out(dict(zip(("base", "new"), commits, strict=True))))
        bar = tqdm(total=rounds, desc="confirm", unit="round", disable=not progress, file=sys.stderr)
        stack.callback(bar.close)
        say = (lambda line: tqdm.write(line, file=sys.stderr)) if progress else log  # lines above the bar

        def on_round(k: int, still_open: int) -> None:  # the bar, or (progress None) a line a round between looks
            if progress:
                bar.update(1)
                bar.set_postfix(open=still_open)
            elif progress is None and k not in looks:
                say(f"confirm: round {k} of at most {rounds} done, {still_open} row(s) open")

        say(f"confirm: re-timing {len(index)} row(s) ({which}) in paired rounds of fresh base and new processes; "
            f"looks after rounds {', '.join(map(str, looks))}; time box {time_s:.0f} s: done within about "
            f"{math.ceil(time_s / 60)} min (--confirm-time; --no-confirm skips this)")  # fmt: skip
        pooled = sequential_rounds(
            index, effects, lambda keys, pooled, new_first: _one_round(trees, envs, config, keys, pooled, new_first),
            alpha=options.alpha, rounds=rounds, time_s=time_s, log=say, on_round=on_round,
        )  # fmt: skip
    return rejudge(comparison, index, pooled, options, looks=len(looks))


def sequential_rounds(
    index: dict, effects: dict, time_round: Callable, *, alpha: float, rounds: int, time_s: float,
    log: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic,
    on_round: Callable[[int, int], object] = lambda k, still_open: None,
) -> dict:  # fmt: skip
    """Paired rounds until every row is decided, ``rounds`` are done, or ``time_s`` is spent; returns ``pooled``
    (key -> (base list, new list)). ``index``: row -> (case, backend) key; ``effects``: row -> its minimum effect;
    ``time_round(keys, pooled, new_first)`` appends each key's two observations and may return the seconds each
    took. After round 1 and at each look, :func:`within_box` keeps the open rows whose rounds fit the box."""
    looks = look_schedule(rounds)
    pooled = {key: ([], []) for key in index.values()}
    cost: dict = {key: [] for key in index.values()}  # key -> seconds of each of its rounds
    overhead: list[float] = []  # seconds of each round not spent on any key (worker start, close)
    open_rows = dict(index)  # row -> key, still being re-timed
    decided = 0
    start = clock()

    def drop_all_but(kept: dict) -> int:  # stop the open rows whose key is not kept; how many
        left = [i for i, key in open_rows.items() if key not in kept]
        for i in left:
            del open_rows[i]
        return len(left)

    for k in range(1, rounds + 1):
        keys = list(dict.fromkeys(open_rows.values()))
        began = clock()
        spent = time_round(keys, pooled, k % 2 == 0) or {}
        took = clock() - began
        for key in keys:
            cost[key].append(spent.get(key, 0.0) if spent else took / len(keys))
        overhead.append(max(took - sum(spent.values()), 0.0) if spent else 0.0)
        if k == 1 and k not in looks:  # plan the first look: cheapest rows first, within its share of the box
            first = {key: (cost[key][0], None) for key in keys}
            box = FIRST_LOOK_SHARE * time_s - (clock() - start)
            if left := drop_all_but(within_box(first, overhead[0], [MIN_ROUNDS - 1], box)):
                log(f"confirm: round 1: {left} row(s) left undecided, the costliest: their rounds to the first "
                    f"look would not fit {FIRST_LOOK_SHARE:.0%} of the box")  # fmt: skip
            if not open_rows:  # nothing left to time: no more rounds of idle workers
                on_round(k, 0)
                break
        if k not in looks:
            on_round(k, len(open_rows))
            continue
        need = {}  # key -> the rounds in all it seems to need
        for i, key in list(open_rows.items()):
            test = stats.paired_ratio(*pooled[key], alpha=alpha, looks=len(looks))
            if stats.decide_paired(test, min_effect=effects[i]).verdict != "cannot tell":
                del open_rows[i]
                decided += 1
            else:
                need[key] = rounds_to_decide(test, effects[i])
        elapsed = clock() - start
        left = 0
        if open_rows and k < looks[-1]:
            plans = {}
            for key in dict.fromkeys(open_rows.values()):
                until = next((look for look in looks if look > k and look >= need[key]), None)
                plans[key] = (float(np.mean(cost[key][-LOOK_EVERY:])), until - k if until else None)
            horizons = [look - k for look in looks if look > k]
            left = drop_all_but(within_box(plans, float(np.mean(overhead[-LOOK_EVERY:])), horizons, time_s - elapsed))
        said = f"confirm: look at round {k}: {decided} decided, {len(open_rows)} open, {elapsed:.0f} s"
        if left:
            said += f"; {left} left undecided, their rounds would not fit the {max(time_s - elapsed, 0):.0f} s left"
        log(said)
        on_round(k, len(open_rows))
        if not open_rows:
            break
    return pooled


_WANTED = {"slower": ["slower"], "unclear": ["slower", "cannot tell"], "all": list(stats.VERDICTS)}


def rows_to_retime(comparison: Comparison, which: str):
    """The rows ``which`` re-times ("slower", "unclear" or "all"; :func:`confirm_slower`), timed in both runs."""
    rows = comparison.rows
    return rows[rows["verdict"].isin(_WANTED[which]) & rows["latency_us_new"].notna()]


def cannot_retime(base_meta: dict, new_meta: dict, sources: tuple[str, str]) -> str:
    """Why the runs' rows cannot be re-timed here, or '' (:func:`confirm_slower` checks commits and plugins)."""
    for meta, source in zip((base_meta, new_meta), sources, strict=True):
        if not meta.get("commit"):
            return f"{source} records no commit"
        if meta.get("dirty"):
            return f"{source} was made from a tree with uncommitted changes: its commit is not the code that ran"
    if not (case_files := new_meta.get("case_files") or base_meta.get("case_files")):
        return "the runs record no case files"
    if missing := [f for f in case_files if not Path(f).exists()]:
        return f"case file {missing[0]} is not here"
    return ""


def retime_or_mark(
    comparison: Comparison, base_meta: dict, new_meta: dict, options: CompareOptions, *, strict: bool = False,
    which: str = "unclear", skip: str = "", log: Callable[[str], None] = print, **confirm,
) -> Comparison:  # fmt: skip
    """The doubtful rows (``which``) re-timed in paired rounds (:func:`confirm_slower`, ``confirm`` its
    keywords), or else marked "unconfirmed" with the reason; ``skip``: a reason not to re-time at all.
    ``strict`` (``--confirm`` given): a ConfirmInputError is raised instead of becoming the reason."""
    chosen = rows_to_retime(comparison, which)
    if chosen.empty:
        return comparison
    why = skip or cannot_retime(base_meta, new_meta, confirm.get("sources", SOURCES))
    if not why:
        try:
            return confirm_slower(comparison, base_meta, new_meta, options, which=which, log=log, **confirm)
        except ConfirmInputError as error:  # a commit not in this history, a plugin not named here
            if strict:
                raise
            why = str(error)
        except subprocess.CalledProcessError as error:  # git worktree add: the commit is not checked out here
            detail = (error.stderr or b"").decode(errors="replace").strip().splitlines()
            why = f"checking out a commit failed: {detail[-1] if detail else error}"
    if (chosen["verdict"] == "slower").any():
        log(f"confirm: not re-timed: {why}")
    return compare.mark_unconfirmed(comparison, why, options)


def rounds_to_decide(test: stats.LatencyTest, min_effect: float) -> float:
    """About how many rounds in all this row needs for its interval to decide it (a guess, never a verdict)."""
    if not (test.n_base and np.isfinite(test.ci_high) and test.ci_low > 0):
        return math.inf
    low, high = math.log(test.ci_low), math.log(test.ci_high)
    centre, half = (low + high) / 2, (high - low) / 2
    up, down = math.log1p(min_effect), math.log1p(-min_effect)
    margin = max(centre if centre > up else 0.0, -centre if centre < down else 0.0, min(up - centre, centre - down))
    return test.n_base * (half / margin) ** 2 if margin > 0 else math.inf


def within_box(plans: dict, overhead: float, horizons: list[int], left_s: float) -> dict:
    """The keys that go on (key -> rounds planned) within ``left_s``, the decidable first, cheapest first.
    ``plans``: key -> (seconds a round, rounds to the look that seems to decide it, or None); ``horizons``:
    rounds from now to each later look; ``overhead``: seconds a round takes besides its keys."""
    kept: dict = {}
    keys_s, longest = 0.0, 0

    def keep(key, cost: float, rounds: int) -> None:
        nonlocal keys_s, longest
        if keys_s + cost * rounds + overhead * max(longest, rounds) <= left_s:
            kept[key] = rounds
            keys_s, longest = keys_s + cost * rounds, max(longest, rounds)

    for _, key, cost, rounds in sorted((c * r, key, c, r) for key, (c, r) in plans.items() if r is not None):
        keep(key, cost, rounds)
    for cost, key in sorted((c, key) for key, (c, _) in plans.items() if key not in kept):
        keep(key, cost, horizons[0])
    return kept


def step_plan(call_us: float) -> tuple[int, int]:
    """(steps, reps) of a row's CPU round for calls of ``call_us``: about ``STEP_S`` a step, ``ROUND_S`` a build."""
    call_s = call_us * 1e-6 if np.isfinite(call_us) and call_us > 0 else STEP_S
    reps = max(1, round(STEP_S / call_s))
    return min(max(math.ceil(ROUND_S / (reps * call_s)), 1), MAX_STEPS), reps


def _pin(workers: list[Worker], cpu: int | None) -> None:
    """Pin both builds' workers to ``cpu`` (rows of one call a step), or to every allowed CPU (None)."""
    if not hasattr(os, "sched_setaffinity"):
        return
    allowed = os.sched_getaffinity(0)
    for worker in workers:
        os.sched_setaffinity(worker.proc.pid, allowed if cpu is None else {cpu})


def alternate(
    time_step: Callable[[int, int], list[float]], device: str, new_first: bool,
    on_plan: Callable[[int, int], None] = lambda steps, reps: None,
) -> tuple[float, float]:  # fmt: skip
    """One row's round, base and new alternating step by step; each build's ``ROUND_QUANTILE`` of its samples.
    ``time_step(side, reps)`` (side 0 base, 1 new) returns ``reps`` samples (us; 0: time-boxed). On the CPU
    one call per build sets the plan (:func:`step_plan`), then steps go A B B A A B ... (A = new when
    ``new_first``); on CUDA one block per build."""
    first = (1, 0) if new_first else (0, 1)
    samples: tuple[list[float], list[float]] = ([], [])
    for side in first:
        samples[side].extend(time_step(side, 1 if str(device).startswith("cpu") else 0))
    if str(device).startswith("cpu"):
        steps, reps = step_plan(min(samples[0][0], samples[1][0]))
        on_plan(steps, reps)
        for step in range(1, steps):
            for side in first if step % 2 == 0 else first[::-1]:
                samples[side].extend(time_step(side, reps))
    return tuple(float(np.quantile(s, ROUND_QUANTILE)) for s in samples)


def _one_round(trees, envs, config, keys, pooled, new_first: bool) -> dict:
    """One fresh worker per build; each row timed by :func:`alternate`, long rows on one CPU; seconds per key."""
    spent = {}
    workers = [Worker(tree, config, env) for tree, env in zip(trees, envs, strict=True)]  # both start at once
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    cpu = cpus[len(pooled[keys[0]][0]) % len(cpus)] if len(cpus) > 1 and keys else None  # in turn, round by round
    try:
        for worker in workers:
            worker.wait_ready()  # the start is the round's overhead, not the first row's cost
        for key in keys:
            began = time.monotonic()
            observed = alternate(
                lambda side, n: workers[side].time(*key, n),  # noqa: B023
                config["device"], new_first, lambda steps, reps: _pin(workers, cpu if reps == 1 else None),
            )  # fmt: skip
            _pin(workers, None)
            for side in (0, 1):
                pooled[key][side].append(observed[side])
            spent[key] = time.monotonic() - began
    finally:
        for worker in workers:
            worker.close()
    return spent


def rejudge(comparison: Comparison, index: dict, pooled: dict, options: CompareOptions, *, looks: int = 1) -> Comparison:  # fmt: skip
    """Judge the re-timed rows from their paired rounds, ``p_adjusted`` for the ``looks``; restate a drift note."""
    rows = comparison.rows.copy()
    for i, key in index.items():
        t = stats.paired_ratio(*pooled[key], alpha=options.alpha, looks=looks)
        v = stats.decide_paired(t, min_effect=compare._effect(rows.loc[i], options))
        rows.loc[i, ["ratio", "ci_low", "ci_high", "p_value", "p_adjusted"]] = [
            t.ratio, t.ci_low, t.ci_high, t.p_value, stats.looks_adjusted(t.p_value, looks),
        ]  # fmt: skip
        rows.at[i, "verdict"], rows.at[i, "evidence"] = v.verdict, "confirmed, interleaved"
        rows.at[i, "verdict_reason"] = f"{compare.RETIMED}, {t.n_base} paired rounds: {v.reason}"
        rows.loc[i, ["why", "better"]] = compare._row_changes(rows.loc[i], options)
    problems = compare.restate_drift(comparison.problems, compare.retimed_reading(rows))
    return Comparison(rows=rows, problems=problems, incomplete=comparison.incomplete)
