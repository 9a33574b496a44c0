"""``harness bisect GOOD BAD --case X --backend Y``: the first commit where that row got slower.

A binary search over the commits after GOOD up to BAD (``git rev-list --ancestry-path``). Each
step checks out the commit in the middle into a git worktree and times the row there against
GOOD in paired rounds of fresh processes, exactly as ``compare`` confirms a row
(:mod:`harness.review.confirm`): slower than GOOD by the minimum effect is bad, the same or
faster is good. A step its rounds cannot decide ends the search with the range that is left.
BAD itself is timed only when the search ends at it, so a BAD that is not slower is said.
Latency only: a row that fails its tolerance is found with ``run`` on the commits.
"""

import argparse
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from harness.backends.builtin import REGISTRY
from harness.cli.continuous import commit_of
from harness.cli.options import DEFAULT_CASES, EXIT_FAIL, EXIT_OK, BadInput, chosen_device, load, resolved_cases
from harness.cli.run import load_plugins
from harness.results.environment import git
from harness.review import confirm, stats
from harness.review.confirm import DEFAULT_ROUNDS, MIN_ROUNDS

EXIT_UNDECIDED = 4


def add_parser(verbs) -> None:
    bisect = verbs.add_parser("bisect", help="find the first commit between GOOD and BAD where one row got slower, "
                              "judged in paired rounds", description=__doc__.split("\n\n", 1)[1],
                              epilog="Exit 0: the first slower commit is named; 1: BAD is not slower than GOOD; 2: "
                              "bad input (a commit not of your history, GOOD not an ancestor of BAD, a case or "
                              "backend that is not one); 4: a step could not be decided in its rounds (the commits "
                              "left are named).")  # fmt: skip
    bisect.add_argument("good", metavar="GOOD", help="a commit where the row is as it should be")
    bisect.add_argument("bad", metavar="BAD", help="a later commit where it is slower")
    bisect.add_argument("--case", required=True, help="the case id, as in the report (`harness list` shows them)")
    bisect.add_argument("--backend", required=True, help="the backend whose row got slower")
    bisect.add_argument("--cases", action="append", default=[], metavar="CASES",
                        help="the case file, folder or packaged suite holding --case (repeatable; default: smoke)")  # fmt: skip
    bisect.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when a GPU is present")
    bisect.add_argument("--plugin", action="append", dest="harness_plugins", default=[], metavar="MODULE_OR_PATH",
                        help="import this plugin in the timing workers (repeatable): this tree's file for every "
                        "commit, importing what it uses from each commit's checkout")  # fmt: skip
    bisect.add_argument("--min-effect", type=float, dest="min_effect",
                        help="slower by at least this fraction counts (default 0.10 on a CPU, 0.03 on CUDA)")  # fmt: skip
    bisect.add_argument("--alpha", type=float, default=0.05, help="significance level of each step (0.05)")
    bisect.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                        help=f"most paired rounds a step gets, judged after {MIN_ROUNDS}, {MIN_ROUNDS + 4}, ... (32)")  # fmt: skip
    bisect.add_argument("--step-time", type=float, default=300.0, metavar="SECONDS",
                        help="time box of one step's rounds (300)")  # fmt: skip
    bisect.set_defaults(handler=main)


def search(commits: list[str], judge: Callable[[str], str]) -> tuple[str, int, int]:
    """Binary search of ``commits`` (after GOOD, oldest first; BAD last, judged only when the search ends on it)
    for the first that ``judge`` calls "bad" (else "good" or "undecided"). Returns (outcome, lo, hi): "found"
    (``commits[hi]``), "not bad" (BAD judged good) or "undecided" (it is in ``commits[lo + 1 : hi + 1]``)."""
    lo, hi, tried = -1, len(commits) - 1, False  # commits[lo] good (-1: GOOD), commits[hi] bad
    while True:
        if hi - lo == 1 and tried:
            return "found", lo, hi
        mid = hi if hi - lo == 1 else (lo + hi) // 2
        answer = judge(commits[mid])
        if answer == "undecided":
            return "undecided", lo, hi
        if answer == "bad":
            hi, tried = mid, True
        elif mid == hi:
            return "not bad", lo, hi
        else:
            lo = mid


def subject(commit: str) -> str:
    return git("log", "-1", "--format=%h %s", commit)


def main(args: argparse.Namespace) -> int:
    if args.rounds < MIN_ROUNDS:
        raise BadInput(f"--rounds {args.rounds}: at least {MIN_ROUNDS} rounds are needed for a verdict")
    good, bad = commit_of(args.good, "GOOD"), commit_of(args.bad, "BAD")
    if good == bad:
        raise BadInput(f"GOOD {args.good} and BAD {args.bad} are the same commit {good[:12]}")
    if subprocess.run(["git", "merge-base", "--is-ancestor", good, bad]).returncode != 0:
        raise BadInput(f"GOOD {good[:12]} is not an ancestor of BAD {bad[:12]}: nothing lies between them in order")
    commits = git("rev-list", "--reverse", "--topo-order", "--ancestry-path", f"{good}..{bad}").split()  # oldest first
    device = chosen_device(args.device)
    if (worker := load_plugins(args.harness_plugins, "plugins")[1]) is not None:  # to know the plugins' backends
        worker.stop()
    if args.backend not in REGISTRY:
        raise BadInput(f"--backend {args.backend}: unknown backend; registered: {', '.join(REGISTRY)}")
    paths = [str(Path(c).resolve()) for c in resolved_cases(args.cases)] or DEFAULT_CASES
    if not any(case.id == args.case for case in load(paths, device, None)):
        raise BadInput(f"--case {args.case}: no such case in {' '.join(paths)} (`harness list` shows the ids)")
    effect = args.min_effect if args.min_effect is not None else stats.default_effect(device)
    config = confirm.worker_config(paths, device, args.harness_plugins)
    key = (args.case, args.backend)
    looks = confirm.look_schedule(args.rounds)
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    say(f"bisect: {len(commits)} commit(s) after {subject(good)}; {args.backend} on {args.case}, slower by "
        f"{effect:.0%} counts; each step up to {args.rounds} paired rounds against GOOD")  # fmt: skip

    def judge(commit: str) -> str:
        with confirm.checked_out({"good": good, "step": commit}) as trees:
            pooled = confirm.sequential_rounds(
                {0: key}, {0: effect},
                lambda keys, pooled, new_first: confirm._one_round(trees, ({}, {}), config, keys, pooled, new_first),
                alpha=args.alpha, rounds=args.rounds, time_s=args.step_time, log=say,
            )  # fmt: skip
        test = stats.paired_ratio(*pooled[key], alpha=args.alpha, looks=len(looks))
        verdict = stats.decide_paired(test, min_effect=effect)
        answer = {"slower": "bad", "same": "good", "faster": "good"}.get(verdict.verdict, "undecided")
        say(f"bisect: {subject(commit)}: {verdict.verdict} ({verdict.reason}): {answer}")
        return answer

    outcome, lo, hi = search(commits, judge)
    if outcome == "found":
        print(f"first slower commit: {subject(commits[hi])}")
        return EXIT_OK
    if outcome == "not bad":
        print(f"BAD {subject(bad)} is not slower than GOOD in paired rounds: there is no slowdown to find")
        return EXIT_FAIL
    left = commits[lo + 1 : hi + 1]
    print(f"undecided: the first slower commit is one of {len(left)}: {', '.join(c[:12] for c in left)}")
    return EXIT_UNDECIDED
