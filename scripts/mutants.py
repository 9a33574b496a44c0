"""Plant each kernel slip of scripts/mutants.toml in a copy of the tree and check the quick tests catch it.

    python scripts/mutants.py                      # every mutant; exit 1 on any survivor
    python scripts/mutants.py --only triton-alibi-sign tlsim-alibi-sign
    python scripts/mutants.py --check              # only that every mutant applies (a second)
    python scripts/mutants.py --json out.json      # the table as JSON too

The tree's kernels, harness, tests and pyproject.toml are copied to a temporary folder once.
The quick tests (tests/test_kernel_edges.py, TRITON_INTERPRET=1) first run on the unmutated
copy and must pass there. Then, per mutant: its ``find`` text is replaced by ``replace`` in
the copy (the text must occur exactly once: else the mutant is "not-applied", a failure, so
the catalogue follows the code), pytest -x runs in a subprocess with a time limit, and the
file is restored. A mutant of kernels/reference.py, tlsim.py or triton_paged.py (and
launch_plan.py, which only the Triton entry imports) can change only that backend's
results, so only the tests of that backend and the backend-free ones run against it; a
mutant of kernels/contract.py, tiling.py or fp8.py runs them all.

Verdicts: caught (the tests failed, or the process crashed), survived (they passed),
timeout, not-applied, error (pytest could not run: the mutant broke collection). Exit
status 0 only when every mutant is caught and the baseline passed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = ROOT / "scripts" / "mutants.toml"
QUICK_TESTS = ["tests/test_kernel_edges.py"]
COPIED = ["kernels", "harness", "tests", "pyproject.toml"]
# The backends whose results a file can change; the others' tests are deselected for its mutants.
BACKENDS = ("reference", "tlsim", "triton")
FILE_BACKENDS = {
    "kernels/reference.py": ("reference",),
    "kernels/tlsim.py": ("tlsim",),
    "kernels/triton_paged.py": ("triton",),
    "kernels/launch_plan.py": ("triton",),
}


@dataclass
class Mutant:
    id: str
    file: str
    find: str
    replace: str
    why: str


@dataclass
class Outcome:
    id: str
    verdict: str
    seconds: float
    detail: str = ""


def load_catalogue(path: Path = CATALOGUE) -> list[Mutant]:
    mutants = [Mutant(**entry) for entry in tomllib.loads(path.read_text())["mutant"]]
    ids = [m.id for m in mutants]
    if duplicates := sorted({i for i in ids if ids.count(i) > 1}):
        raise SystemExit(f"mutants.py: duplicate ids in {path}: {duplicates}")
    return mutants


def applies(mutant: Mutant, root: Path) -> str | None:
    """None when ``find`` occurs exactly once in the mutant's file under ``root``; else why not."""
    path = root / mutant.file
    if not path.exists():
        return f"{mutant.file} does not exist"
    count = path.read_text().count(mutant.find)
    return None if count == 1 else f"the text occurs {count} times in {mutant.file}"


def selection(mutant: Mutant | None) -> list[str]:
    """pytest -k arguments that keep the tests of the backends the mutant's file can change."""
    if mutant is None or mutant.file not in FILE_BACKENDS:
        return []
    others = [b for b in BACKENDS if b not in FILE_BACKENDS[mutant.file]]
    return ["-k", " and ".join(f"not {b}" for b in others)]


def _pytest_child(tree: str, args: list[str], log: str) -> None:
    """In a forked child: pytest ``args`` in ``tree``, output to ``log``; exits with pytest's status."""
    sys.dont_write_bytecode = True  # a mutated module must never be served from a stale .pyc
    os.chdir(tree)
    sys.path.insert(0, tree)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    import pytest

    os._exit(int(pytest.main(args)))


def _run_forked(tree: Path, args: list[str], timeout: float) -> tuple[int | None, str]:
    """(exit status or None on timeout, output) of pytest in a child forked from this process, which has
    imported torch and Triton already: a child skips those imports (seconds each on a busy box)."""
    context = multiprocessing.get_context("fork")
    log = tree / ".mutant-pytest.log"
    child = context.Process(target=_pytest_child, args=(str(tree), args, str(log)))
    child.start()
    child.join(timeout)
    if child.is_alive():
        child.kill()
        child.join()
        return None, ""
    return child.exitcode, log.read_text() if log.exists() else ""


def preload() -> None:
    """Import the third-party modules the tests use, so forked children start with them loaded (never
    kernels, harness or tests: those must be imported from the mutated tree, in the child)."""
    os.environ["TRITON_INTERPRET"] = "1"  # before Triton's first import: it decides there
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    import numpy  # noqa: F401
    import pandas  # noqa: F401
    import pydantic  # noqa: F401
    import pytest  # noqa: F401
    import torch  # noqa: F401
    import triton
    import triton.language  # noqa: F401


def run_tests(
    tree: Path, tests: list[str], timeout: float, mutant: Mutant | None = None, fork: bool = True
) -> tuple[str, float, str]:
    """(verdict, seconds, first failing test or the output's tail) of pytest -x in ``tree``."""
    args = ["-x", "-q", "-p", "no:cacheprovider", "-W", "ignore::RuntimeWarning", *tests, *selection(mutant)]
    start = time.perf_counter()
    if fork:
        returncode, output = _run_forked(tree, args, timeout)
    else:
        env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(tree)}
        env.pop("PYTEST_ADDOPTS", None)
        try:
            done = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=tree, env=env, capture_output=True,
                                  text=True, timeout=timeout)  # fmt: skip
            returncode, output = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired:
            returncode, output = None, ""
    seconds = time.perf_counter() - start
    if returncode is None:
        return "timeout", seconds, f"no verdict within {timeout:.0f} s"
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)
    if returncode == 0:
        return "passed", seconds, ""
    if returncode == 1 or returncode < 0:  # tests failed, or the process died (a crash is caught too)
        return "failed", seconds, failed[0] if failed else f"exit {returncode}"
    return "error", seconds, output.strip().splitlines()[-1] if output.strip() else f"exit {returncode}"


def copy_tree(dest: Path) -> Path:
    dest.mkdir(parents=True)
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, dest / name)
    return dest


def run_mutant(mutant: Mutant, tree: Path, tests: list[str], timeout: float, fork: bool = True) -> Outcome:
    if reason := applies(mutant, tree):
        return Outcome(mutant.id, "not-applied", 0.0, reason)
    path = tree / mutant.file
    original = path.read_text()
    path.write_text(original.replace(mutant.find, mutant.replace, 1))
    try:
        verdict, seconds, detail = run_tests(tree, tests, timeout, mutant, fork)
    finally:
        path.write_text(original)
    verdict = {"failed": "caught", "passed": "survived"}.get(verdict, verdict)
    return Outcome(mutant.id, verdict, seconds, detail)


def print_table(outcomes: list[Outcome]) -> None:
    width = max(len(o.id) for o in outcomes)
    print(f"{'mutant':<{width}}  {'verdict':<11}  {'seconds':>7}  caught by / detail")
    for o in outcomes:
        print(f"{o.id:<{width}}  {o.verdict:<11}  {o.seconds:7.1f}  {o.detail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="ID", help="run these mutants only")
    parser.add_argument("--tests", nargs="+", default=QUICK_TESTS, help="the quick tests (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per mutant (default %(default)s)")
    parser.add_argument("--check", action="store_true", help="only check that every mutant applies to this tree")
    parser.add_argument("--skip-baseline", action="store_true", help="do not run the tests on the unmutated tree")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once, each in its own copy (default 1)")
    parser.add_argument("--no-fork", action="store_true",
                        help="start each pytest as a fresh interpreter instead of forking a preloaded one")  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write the outcomes here")
    args = parser.parse_args(argv)

    mutants = load_catalogue()
    if args.only:
        unknown = sorted(set(args.only) - {m.id for m in mutants})
        if unknown:
            parser.error(f"unknown mutant ids: {unknown}")
        mutants = [m for m in mutants if m.id in args.only]
    if args.check:
        problems = [(m.id, reason) for m in mutants if (reason := applies(m, ROOT))]
        for mutant_id, reason in problems:
            print(f"not-applied: {mutant_id}: {reason}")
        print(f"{len(mutants) - len(problems)}/{len(mutants)} mutants apply")
        return 1 if problems else 0

    started = time.perf_counter()
    fork = not args.no_fork
    if fork:
        preload()
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        trees: queue.Queue[Path] = queue.Queue()
        for job in range(max(args.jobs, 1)):
            trees.put(copy_tree(Path(tmp) / f"tree{job}"))
        tree = trees.queue[0]
        if not args.skip_baseline:
            verdict, seconds, detail = run_tests(tree, args.tests, args.timeout * 3, None, fork)
            print(f"baseline (unmutated): {verdict} in {seconds:.1f} s {detail}", flush=True)
            if verdict != "passed":
                print("mutants.py: the quick tests fail on the unmutated tree; fix that first")
                return 1

        def one(mutant: Mutant) -> Outcome:
            tree = trees.get()
            try:
                outcome = run_mutant(mutant, tree, args.tests, args.timeout, fork)
            finally:
                trees.put(tree)
            print(f"  {outcome.id}: {outcome.verdict} ({outcome.seconds:.1f} s) {outcome.detail}", flush=True)
            return outcome

        with ThreadPoolExecutor(max(args.jobs, 1)) as pool:
            outcomes = list(pool.map(one, mutants))
    total = time.perf_counter() - started
    print()
    print_table(outcomes)
    caught = [o for o in outcomes if o.verdict == "caught"]
    slowest = max((o.seconds for o in caught), default=0.0)
    print(f"\n{len(caught)}/{len(outcomes)} caught; slowest catch {slowest:.1f} s; total {total:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"outcomes": [asdict(o) for o in outcomes], "total_seconds": total}, indent=1))
    return 0 if len(caught) == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
