"""``harness continuous BASE [HEAD]``: run both commits, each in a git worktree on this tree's case files
and options, then compare them, as ``asv continuous`` does."""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from harness.cli import compare
from harness.cli.options import DEFAULT_CASES, BadInput, add_pattern, add_run_options, as_bad_input, resolved_cases
from harness.results.environment import git
from harness.review.confirm import ConfirmInputError, checked_commit, checked_out


def add_parser(verbs) -> None:
    continuous = verbs.add_parser("continuous", help="run BASE and HEAD (default: HEAD) in worktrees and compare "
                                  "them, re-timing in paired rounds", description="Checks out each commit into a "
                                  "git worktree, runs the cases there with that commit's harness and kernels, then "
                                  "compares the two runs as `compare` does (latency rows the runs cannot separate "
                                  "are re-timed in paired rounds). The run folders are kept under --out.",
                                  epilog="Exit codes as compare's: 0 nothing got worse; 1 something got worse; 2 "
                                  "bad input (a commit that is not one of your history, a run that refused its "
                                  "options); 4 incomplete; 5 unconfirmed.")  # fmt: skip
    continuous.add_argument("base", metavar="BASE", help="the commit to compare against: a branch, tag or id")
    continuous.add_argument("head", metavar="HEAD", nargs="?", default="HEAD", help="the commit judged (HEAD)")
    continuous.add_argument("--cases", action="append", default=[], metavar="CASES",
                            help="case file or folder, or a packaged suite's name (repeatable; default: smoke)")  # fmt: skip
    continuous.add_argument("--out", type=Path, metavar="DIR",
                            help="where the two run folders go (default: reports/continuous-<UTC time>)")  # fmt: skip
    add_run_options(continuous)
    add_pattern(continuous)
    compare.add_arguments(continuous, plugin=False)
    continuous.set_defaults(handler=main)


def commit_of(ref: str, what: str) -> str:
    """``ref`` as the full id of a commit of your history; BadInput naming ``what`` otherwise."""
    # a ref starting with '-' never reaches git, which would read it as an option
    if ref and not ref.startswith("-") and (found := git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")):
        with as_bad_input(ConfirmInputError):
            return checked_commit(found, what)
    raise BadInput(f"{what} {ref!r}: not a commit of this repository")


def run_arguments(args: argparse.Namespace, cases: list[str]) -> list[str]:
    """The ``harness run`` options both commits run with: paths made absolute (the runs run elsewhere)."""
    words = [*cases, "--no-progress"]
    for flag, values in (("--backend", args.harness_backends), ("--tag", args.harness_tags)):
        for value in values or []:
            words += [flag, value]
    for plugin in args.harness_plugins:
        words += ["--plugin", str(Path(plugin).resolve()) if Path(plugin).exists() else plugin]
    for flag, value in (("--device", args.harness_device), ("--oracle-device", args.harness_oracle_device),
                        ("--threads", args.harness_threads), ("-k", args.pattern)):  # fmt: skip
        if value is not None:
            words += [flag, value]
    return words


def run_commit(commit: str, label: str, out: Path, words: list[str]) -> Path:
    """Run ``commit`` in a worktree into ``out``; its output goes to stderr, indented. The run folder."""
    with checked_out({label: commit}) as (tree,):
        env = {k: v for k, v in os.environ.items() if k != "HARNESS_COMMIT"}  # git in the worktree names it
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))
        command = [sys.executable, "-m", "harness", "run", *words, "--out", str(out)]
        print(f"continuous: {label} {commit[:12]}: harness run {' '.join(words)}", file=sys.stderr, flush=True)
        proc = subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)  # fmt: skip
        last = "no output"  # its last line that is not blank, said if it fails
        for line in proc.stdout:
            last = line.strip() or last
            print(f"  {line}", end="", file=sys.stderr, flush=True)
        code = proc.wait()
    if code not in (0, 1) or not (out / "meta.json").is_file():  # failed rows are what compare reports
        raise BadInput(f"the run of {label} {commit[:12]} ended with exit {code} and no run folder: {last}")
    return out


def main(args: argparse.Namespace) -> int:
    compare.check(args)
    base, head = commit_of(args.base, "BASE"), commit_of(args.head, "HEAD")
    if base == head:
        raise BadInput(f"BASE {args.base} and HEAD {args.head} are the same commit {base[:12]}")
    cases = [str(Path(c).resolve()) for c in resolved_cases(args.cases)] or DEFAULT_CASES
    out = args.out or Path("reports") / time.strftime("continuous-%Y%m%dT%H%M%SZ", time.gmtime())
    for side in ("base", "head"):
        if (out / side).exists():
            raise BadInput(f"--out {out}: {out / side} already exists; a run folder is never overwritten")
    out.mkdir(parents=True, exist_ok=True)
    words = run_arguments(args, cases)
    base_run = run_commit(base, "base", (out / "base").resolve(), words)
    head_run = run_commit(head, "head", (out / "head").resolve(), words)
    print(f"continuous: comparing {base_run} with {head_run}", file=sys.stderr, flush=True)
    return compare.compare(args, base_run, head_run)
