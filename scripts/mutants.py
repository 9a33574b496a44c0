"""Plant each kernel slip of scripts/mutants.toml in a copy of the tree and check the quick tests catch it.

    python scripts/mutants.py                      # every mutant, two at a time; exit 1 unless all are caught
    python scripts/mutants.py --only triton-alibi-sign tlsim-alibi-sign
    python scripts/mutants.py --check              # only that every mutant applies (a second)
    python scripts/mutants.py --record --only ID   # write ID's caught_by: the quick test that fails first (-x)
    python scripts/mutants.py --json out.json      # the table as JSON too

Verdicts: caught, misrecorded, survived, timeout, not-applied, error; exit 0 only when all are caught
(docs/mutants.md, "What a run does")."""

from __future__ import annotations

import argparse
import compileall
import gc
import importlib
import json
import multiprocessing
import os
import queue
import re
import shutil
import sys
import tempfile
import time
import tomllib
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = ROOT / "scripts" / "mutants.toml"
QUICK_TESTS = [
    "tests/kernels/test_kernel_edges.py",
    "tests/kernels/test_kernel_contract_edges.py",
    "tests/kernels/test_kernel_tma.py",
    "tests/kernels/test_call_validation.py::test_unchecked_bad_block_id_turns_its_rows_to_nan_and_leaves_the_rest",
    "tests/kernels/test_call_validation.py::test_a_bad_block_in_one_kv_split_turns_that_sequence_to_nan",
    "tests/kernels/test_tlsim_predicts_triton.py::test_tlsim_predicts_the_device_split",
    "tests/kernels/test_kernel_tuning.py::test_the_device_split_dispatches_its_sequences_longest_piece_first",
    "tests/kernels/test_gluon_prefill.py",
]
COPIED = ["kernels", "harness", "tests", "scripts", "pyproject.toml"]  # scripts: tests that import a tool (tune_tiles)
PROJECT = {"kernels", "harness", "tests", "benchmarks", "scripts", "conftest"}
# Plain asserts: a failing assert fails the test all the same, and the child skips rewriting them.
PYTEST_ARGS = ["-q", "-p", "no:cacheprovider", "--assert=plain", "-W", "ignore::RuntimeWarning"]
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
    caught_by: str = ""  # the pytest node id of a quick test that fails on this mutant (the fastest found)


@dataclass
class Outcome:
    id: str
    verdict: str
    seconds: float
    detail: str = ""


def load_catalogue(path: Path = CATALOGUE) -> list[Mutant]:
    mutants = [Mutant(**entry) for entry in tomllib.loads(path.read_text())["mutant"]]
    if duplicates := sorted(i for i, n in Counter(m.id for m in mutants).items() if n > 1):
        raise SystemExit(f"mutants.py: duplicate ids in {path}: {duplicates}")
    return mutants


def applies(mutant: Mutant, root: Path) -> str | None:
    """None when ``find`` occurs exactly once in the mutant's file under ``root``; else why not."""
    path = root / mutant.file
    if not path.exists():
        return f"{mutant.file} does not exist"
    count = path.read_text().count(mutant.find)
    return None if count == 1 else f"the text occurs {count} times in {mutant.file}"


def selection(mutant: Mutant) -> list[str]:
    """pytest -k keeping the tests of the backends the mutant's file can change, and the device split's."""
    if mutant.file not in FILE_BACKENDS:
        return []
    others = [b for b in BACKENDS if b not in FILE_BACKENDS[mutant.file]]
    return ["-k", f"({' and '.join(f'not {b}' for b in others)}) or device_split"]


class _Recorder:
    """pytest plugin (in the child): a JSON line per test phase as it ends, which outlives a kill."""

    def __init__(self, path: str):
        self.path = path

    def pytest_runtest_logreport(self, report) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"test": report.nodeid, "outcome": report.outcome}) + "\n")


def _pytest_child(tree: str, args: list[str], log: str, report: str, modules: str | None) -> None:
    """In a forked child: pytest ``args`` in ``tree`` into ``log``; ``modules``: where to list the outside imports."""
    sys.dont_write_bytecode = True  # a mutated module must never be served from a stale .pyc
    for name in [n for n in sys.modules if n.split(".")[0] in PROJECT]:
        del sys.modules[name]  # a parent that had imported them (a pytest worker) must not serve the unmutated ones
    os.chdir(tree)
    sys.path.insert(0, tree)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    import pytest

    status = int(pytest.main(args, plugins=[_Recorder(report)]))
    if modules:
        outside = [name for name, module in list(sys.modules.items()) if _outside_tree(name, module, tree)]
        Path(modules).write_text("\n".join(outside))
    sys.stdout.flush()
    os._exit(status)


def _outside_tree(name: str, module, tree: str) -> bool:
    source = str(getattr(module, "__file__", None) or "")
    return not name.startswith("__") and name.split(".")[0] not in PROJECT and not source.startswith(tree)


def run_pytest(tree: Path, args: list[str], timeout: float, modules: Path | None = None) -> tuple[str, str, float]:
    """pytest ``args`` in ``tree``, in a child forked from this process: its verdict ("failed" | "passed" |
    "timeout" | "error"), the first failing test or why, and its seconds."""
    log, report = tree / ".mutant-pytest.log", tree / ".mutant-tests.jsonl"
    report.unlink(missing_ok=True)
    context = multiprocessing.get_context("fork")
    child_args = (str(tree), [*PYTEST_ARGS, *args], str(log), str(report), str(modules) if modules else None)
    start = time.perf_counter()
    child = context.Process(target=_pytest_child, args=child_args)
    child.start()
    child.join(timeout)
    if timed_out := child.is_alive():
        child.kill()
        child.join()
    wall, status = time.perf_counter() - start, child.exitcode
    phases = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    failed = next((phase["test"] for phase in phases if phase["outcome"] == "failed"), None)
    tail = (log.read_text(errors="replace").strip().splitlines() or [""])[-1] if log.exists() else ""
    if timed_out:
        return "timeout", f"no verdict within {wall:.0f} s", wall
    if status == 0:
        return "passed", "", wall
    if status == 1:  # a test failed
        return "failed", failed or tail, wall
    if status < 0:  # the child died of a signal inside a test: the mutant broke the kernel
        return "failed", f"crashed (signal {-status}) in {failed or 'a test'}", wall
    return "error", tail or f"exit {status}", wall


def preload(names: list[str] = ()) -> None:
    """Import third-party modules (the usual, then ``names``) before forking; never the project's own."""
    os.environ["TRITON_INTERPRET"] = "1"  # before Triton's first import: it decides there
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    os.environ.pop("PYTEST_ADDOPTS", None)  # the children's pytest takes only the arguments given here
    for name in ("numpy", "pandas", "pydantic", "pytest", "torch", "triton", "triton.language", *names):
        if name.split(".")[0] in PROJECT or name in sys.modules:
            continue
        try:
            with warnings.catch_warnings(action="ignore"):
                importlib.import_module(name)
        except Exception:  # a module only its importer can load: the children import it then
            continue
    gc.collect()
    gc.freeze()  # the children's collections skip everything loaded so far (and leave its pages shared)


def copy_tree(dest: Path) -> Path:
    dest.mkdir(parents=True)
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, dest / name)
    for name in ("harness", "tests"):  # never mutated: compiled once; kernels/ compiles from source in each child
        compileall.compile_dir(dest / name, quiet=1)
    return dest


def run_mutant(mutant: Mutant, tree: Path, tests: list[str], timeout: float, record: bool = False) -> Outcome:
    """Apply ``mutant`` in ``tree``, run its caught_by test, then (only if that passes) the rest with -x;
    ``record``: only the rest, naming the test that fails in ``detail``."""
    if reason := applies(mutant, tree):
        return Outcome(mutant.id, "not-applied", 0.0, reason)
    seconds, caught_by = 0.0, "" if record else mutant.caught_by
    path = tree / mutant.file
    original = path.read_text()
    path.write_text(original.replace(mutant.find, mutant.replace, 1))
    try:  # the file restored after
        if caught_by:
            verdict, detail, wall = run_pytest(tree, [caught_by], timeout)
            seconds += wall
            if verdict == "failed":
                return Outcome(mutant.id, "caught", seconds, detail)
            if verdict != "passed":
                return Outcome(mutant.id, verdict, seconds, detail)
        deselect = ["--deselect", caught_by] if caught_by else []
        verdict, detail, wall = run_pytest(tree, ["-x", *tests, *selection(mutant), *deselect], timeout)
        seconds += wall
    finally:
        path.write_text(original)
    if verdict == "failed" and not record:
        why = f"{caught_by} passed" if caught_by else "no caught_by"
        return Outcome(mutant.id, "misrecorded", seconds, f"{detail} ({why}: run --record)")
    return Outcome(mutant.id, {"passed": "survived", "failed": "caught"}.get(verdict, verdict), seconds, detail)


def write_caught_by(recorded: dict[str, str], path: Path = CATALOGUE) -> None:
    """Set (or replace) the ``caught_by`` line of each recorded mutant's entry in the catalogue's text."""
    blocks = re.split(r"(?m)^(?=\[\[mutant\]\])", path.read_text())
    for i, block in enumerate(blocks):
        found = re.search(r'(?m)^id = "([^"]+)"$', block)
        if not found or found.group(1) not in recorded:
            continue
        line = f'caught_by = "{recorded[found.group(1)]}"\n'
        block = re.sub(r"(?m)^caught_by = .*\n", "", block)
        why = re.search(r"(?m)^why = .*\n", block).group(0)
        blocks[i] = block.replace(why, why + line, 1)
    path.write_text("".join(blocks))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="ID", help="run these mutants only")
    parser.add_argument("--tests", nargs="+", default=QUICK_TESTS, help="the quick tests (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per pytest run (default %(default)s)")
    parser.add_argument("--check", action="store_true", help="only check that every mutant applies to this tree")
    parser.add_argument("--record", action="store_true",
                        help="run the quick tests with -x against each mutant and write the one that fails as its caught_by")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=2, help="mutants run at once, each in its own copy (default 2)")
    parser.add_argument("--json", type=Path, help="also write the outcomes here")
    parser.add_argument("--catalogue", type=Path, default=CATALOGUE, help="the mutants (default: %(default)s)")
    args = parser.parse_args(argv)

    mutants = load_catalogue(args.catalogue)
    if args.only:
        if unknown := sorted(set(args.only) - {m.id for m in mutants}):
            parser.error(f"unknown mutant ids: {unknown}")
        mutants = [m for m in mutants if m.id in args.only]
    if args.check:
        problems = [(m.id, reason) for m in mutants if (reason := applies(m, ROOT))]
        for mutant_id, reason in problems:
            print(f"not-applied: {mutant_id}: {reason}")
        print(f"{len(mutants) - len(problems)}/{len(mutants)} mutants apply")
        return 1 if problems else 0

    started = time.perf_counter()
    preload()
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        trees: queue.Queue[Path] = queue.Queue()
        for job in range(max(args.jobs, 1)):
            trees.put(copy_tree(Path(tmp) / f"tree{job}"))
        tree, imported = trees.queue[0], Path(tmp) / "imported.txt"
        # The tests the mutants run: their caught_by tests, or all quick tests while one has none (or --record).
        recorded = sorted({m.caught_by for m in mutants})
        baseline_tests = args.tests if args.record or "" in recorded else recorded
        verdict, detail, wall = run_pytest(tree, baseline_tests, args.timeout * 3, modules=imported)
        print(f"baseline (unmutated): {verdict} in {wall:.1f} s {detail}", flush=True)
        if verdict != "passed":
            print("mutants.py: the quick tests fail on the unmutated tree; fix that first")
            return 1
        preload(imported.read_text().splitlines())
        timeout = args.timeout * 3 if args.record else args.timeout

        def one(mutant: Mutant) -> Outcome:
            tree = trees.get()
            try:
                outcome = run_mutant(mutant, tree, args.tests, timeout, args.record)
            finally:
                trees.put(tree)
            print(f"  {outcome.id}: {outcome.verdict} ({outcome.seconds:.1f} s) {outcome.detail}", flush=True)
            return outcome

        with ThreadPoolExecutor(max(args.jobs, 1)) as pool:
            outcomes = list(pool.map(one, mutants))
    total = time.perf_counter() - started
    width = max(len(o.id) for o in outcomes)
    print(f"\n{'mutant':<{width}}  {'verdict':<11}  {'seconds':>7}  caught by / detail")
    for o in outcomes:
        print(f"{o.id:<{width}}  {o.verdict:<11}  {o.seconds:7.1f}  {o.detail}")
    caught = [o for o in outcomes if o.verdict == "caught"]
    slowest = max((o.seconds for o in caught), default=0.0)
    print(f"\n{len(caught)}/{len(outcomes)} caught; slowest catch {slowest:.1f} s; total {total:.0f} s")
    if args.record:
        write_caught_by({o.id: o.detail for o in caught}, args.catalogue)
        print(f"caught_by written for {len(caught)} mutants in {args.catalogue}")
    if args.json:
        args.json.write_text(json.dumps({"outcomes": [asdict(o) for o in outcomes], "total_seconds": total}, indent=1))
    return 0 if len(caught) == len(outcomes) else 1


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    os._exit(status)  # skips the interpreter's teardown, where Triton's bindings print hundreds of "leaked" lines
