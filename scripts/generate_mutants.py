"""Mutants derived mechanically from the kernels' source, outside the hand-written catalogue.

    python scripts/generate_mutants.py --list                           # count them by file and operator
    python scripts/generate_mutants.py --sample 40 --out generated.toml  # a seeded sample, as a catalogue
    python scripts/generate_mutants.py --sample 40 --run                 # and run it (scripts/mutants.py)

One operator swap each (docs/mutants.md has the operators). ``--run`` runs only those on lines the quick tests
execute (pytest-cov); with no ``caught_by``, the runner's ``misrecorded`` is a catch here, ``survived`` a gap."""

from __future__ import annotations

import argparse
import ast
import itertools
import json
import os
import random
import runpy
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = ["triton_paged", "tiling", "launch_plan", "contract", "fp8", "cache", "dispatch", "cascade"]
FLIPS = {ast.Lt: "<=", ast.LtE: "<", ast.Gt: ">=", ast.GtE: ">"}


def _swaps(node: ast.AST, lines: list[str]):
    """(kind, start, end, new text) for each swap of ``node``; start / end are (line, col) of the text replaced."""
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in FLIPS:
        left, right = node.left, node.comparators[0]
        if left.end_lineno == right.lineno:  # the operator between them, on one line
            gap = lines[left.end_lineno - 1][left.end_col_offset : right.col_offset]
            op = gap.strip()
            at = left.end_col_offset + gap.index(op)
            yield "flip", (left.end_lineno, at), (left.end_lineno, at + len(op)), FLIPS[type(node.ops[0])]
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub):
        if isinstance(node.right, ast.Constant) and node.right.value == 1 and node.left.end_lineno == node.lineno:
            yield "off-by-one", (node.left.end_lineno, node.left.end_col_offset), (node.lineno, node.end_col_offset), ""
    elif (isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitAnd)) or (  # `a & b`: a mask's conjunction
        isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And) and len(node.values) == 2  # `a and b`
    ):
        left, right = (node.left, node.right) if isinstance(node, ast.BinOp) else node.values
        if left.end_lineno == right.lineno:
            line = lines[right.lineno - 1]
            gap = line[left.end_col_offset : right.col_offset]  # the operator, spaces, any opening parens
            opened = gap.count("(") - gap.count(")")
            end = right.end_col_offset
            for _ in range(opened):  # the closing parens that match the gap's
                end = line.index(")", end) + 1
            yield "drop-right", (left.end_lineno, left.end_col_offset), (right.end_lineno, end), ""
            operator_end = left.end_col_offset + len(gap.rstrip("( ")) + 1
            yield "drop-left", (left.lineno, left.col_offset), (right.lineno, operator_end), ""


def generate(files: list[str]) -> list[dict]:
    """Every mutant of ``files`` (module names under kernels/), in source order."""
    mutants, seen = [], Counter()
    for name in files:
        rel = f"kernels/{name}.py"
        source = (ROOT / rel).read_text()
        lines = source.splitlines(keepends=True)
        for node in ast.walk(ast.parse(source)):
            for kind, (l0, c0), (l1, c1), new in _swaps(node, lines):
                first, block = l0, "".join(lines[l0 - 1 : l1])
                mutated = block[:c0] + new + block[sum(map(len, lines[l0 - 1 : l1 - 1])) + c1 :]
                while source.count(block) > 1 and first > 1:  # widen until the text is unique
                    first -= 1
                    block, mutated = lines[first - 1] + block, lines[first - 1] + mutated
                if source.count(block) != 1 or mutated == block:
                    continue
                try:
                    ast.parse(source.replace(block, mutated))
                except SyntaxError:
                    continue
                swapped = lines[l0 - 1][c0:c1] if l0 == l1 else "..."
                mutant_id = f"gen-{name}-{l0}-{c0}-{kind}"
                seen[mutant_id] += 1  # `a & b & c`: both conjunctions' left sides start at a
                mutants.append({
                    "id": mutant_id + (f"-{seen[mutant_id]}" if seen[mutant_id] > 1 else ""),
                    "file": rel,
                    "find": block,
                    "replace": mutated,
                    "why": f"generated: {kind} at line {l0} ({swapped.strip()!r} -> {new!r})",
                })  # fmt: skip
    return mutants


def reached_lines(tests: list[str]) -> dict[str, tuple[set[int], set[int]]]:
    """kernels/' statements ``tests`` execute and those they miss, by first line, by path (pytest-cov)."""
    with tempfile.TemporaryDirectory(prefix="reached-") as tmp:
        data = Path(tmp) / "coverage.json"
        pytest = [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "--cov=kernels"]
        done = subprocess.run([*pytest, f"--cov-report=json:{data}", *tests], cwd=ROOT, capture_output=True,
                              text=True, env={**os.environ, "TRITON_INTERPRET": "1", "COVERAGE_FILE": str(data.with_suffix(""))})  # fmt: skip
        if done.returncode != 0 or not data.exists():
            raise SystemExit(f"generate_mutants: the coverage pass of the quick tests failed:\n{done.stdout[-3000:]}")
        files = json.loads(data.read_text())["files"]
    return {Path(name).as_posix(): (set(f["executed_lines"]), set(f["missing_lines"])) for name, f in files.items()}


def is_reached(mutant: dict, reached: dict[str, tuple[set[int], set[int]]]) -> bool:
    """Whether the statement holding the swap ran (the swap's line walks up to its statement's first line)."""
    executed, missing = reached.get(mutant["file"], (set(), set()))
    line = int(mutant["id"].split("-")[2])
    while line > 0 and line not in executed and line not in missing:
        line -= 1
    return line in executed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", nargs="+", default=FILES, help="modules under kernels/ (default: %(default)s)")
    parser.add_argument("--sample", type=int, help="this many, drawn with --seed (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the catalogue here")
    parser.add_argument("--list", action="store_true", help="print the counts by file and operator")
    parser.add_argument("--run", action="store_true", help="run them with scripts/mutants.py and report the survivors")
    args, rest = parser.parse_known_args(argv)

    mutants = generate(args.files)
    if args.list:
        for (file, kind), count in sorted(Counter((m["file"], m["why"].split()[1]) for m in mutants).items()):
            print(f"{file:<26} {kind:<11} {count}")
    print(f"{len(mutants)} generated mutants")
    if args.sample is not None:
        mutants = random.Random(args.seed).sample(mutants, min(args.sample, len(mutants)))
        print(f"sample of {len(mutants)} (seed {args.seed})")
    out = args.out or Path(tempfile.mkdtemp(prefix="generated-mutants-")) / "generated.toml"
    unreached = []
    if args.run:
        if "--tests" in rest:  # the tests scripts/mutants.py will run: its --tests, else its QUICK_TESTS
            tests = list(itertools.takewhile(lambda a: not a.startswith("--"), rest[rest.index("--tests") + 1 :]))
        else:
            tests = runpy.run_path(str(ROOT / "scripts" / "mutants.py"))["QUICK_TESTS"]
        print(f"coverage pass: {' '.join(tests)}", flush=True)
        reached = reached_lines(tests)
        unreached = [m for m in mutants if not is_reached(m, reached)]
        mutants = [m for m in mutants if is_reached(m, reached)]
    out.write_text(
        "".join("[[mutant]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in m.items()) + "\n" for m in mutants)
    )
    print(f"catalogue: {out}")
    if not args.run:
        return 0
    print(f"{len(unreached)} on lines the quick tests never execute (not reached): not run")
    for m in unreached:
        print(f"  not reached: {m['id']}")
    result = out.with_suffix(".json")
    runner = [sys.executable, str(ROOT / "scripts" / "mutants.py"), "--catalogue", str(out), "--json", str(result)]
    subprocess.run([*runner, *rest], cwd=ROOT, check=False)
    if not result.exists():
        return 1  # the runner said why (the baseline failed, say)
    outcomes = json.loads(result.read_text())["outcomes"]
    survived = [o for o in outcomes if o["verdict"] == "survived"]
    caught = [o for o in outcomes if o["verdict"] in ("caught", "misrecorded")]
    other = len(outcomes) - len(caught) - len(survived)
    print(f"\n{len(caught)} caught, {len(survived)} survived, {other} other, {len(unreached)} not reached")
    print(f"survival rate {(len(survived) + len(unreached)) / max(len(outcomes) + len(unreached), 1):.0%} "
          f"(survivors and not reached, of all {len(outcomes) + len(unreached)})")  # fmt: skip
    for o in survived:
        print(f"  survived: {o['id']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
