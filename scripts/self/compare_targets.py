"""Measure what ``harness compare`` answers by default (re-timing doubtful rows in paired rounds) on this machine.

``--part planted``: a commit making ``reference_slowable`` 25% slower must be flagged WORSE on all 3
cases, nothing else, within 10 minutes; ``--part reruns``: three smoke runs of HEAD, 0 rows WORSE.
Both beside ``--spinners`` busy processes, the builds as temporary git worktrees.

    python scripts/self/compare_targets.py --part planted              # about 10 minutes
    python scripts/self/compare_targets.py --part reruns --confirm-time 600"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.review.confirm import checked_out  # noqa: E402

PLUGIN = "scripts.self.slowdown_plugin"  # a module: each checkout imports its own (a path would be one file for both)
SLOWED = "reference_slowable"
PLANTED_CASES = """case = [
    {name = "decode_gqa", num_kv_heads = 2, seq_lens = [300, 200, 500, 400]},
    {name = "prefill_mha", num_q_heads = 4, num_kv_heads = 4, seq_lens = [96, 64], q_lens = [32, 16]},
    {name = "decode_mqa_long", num_kv_heads = 1, head_dim = 128, block_size = 32, seq_lens = [1024, 700]},
]

[defaults]
tags = ["small"]
num_q_heads = 8
head_dim = 64
block_size = 16
"""
ROW = re.compile(r"^(WORSE|UNCONFIRMED|better|\?)\s+(\S+)\s+(\S+)")


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def harness(args: list[str], cwd: Path, log: Path) -> tuple[int, str, float]:
    """``python -m harness ARGS`` with ``cwd`` first on the path; (exit code, stdout, seconds); stderr into ``log``."""
    env = {**os.environ, "PYTHONPATH": str(cwd), "TRITON_INTERPRET": "1"}
    env.pop("HARNESS_SLOWDOWN", None)  # the planted slowdown is the commit's, never the environment's
    start = time.monotonic()
    with log.open("a") as err:
        done = subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                              stderr=err, text=True)  # fmt: skip
    return done.returncode, done.stdout, time.monotonic() - start


def flagged(stdout: str) -> dict[str, list[tuple[str, str]]]:
    """compare's table: what (WORSE, UNCONFIRMED, better, ?) -> [(backend, case)]."""
    out: dict[str, list[tuple[str, str]]] = {}
    for line in stdout.splitlines():
        if m := ROW.match(line):
            out.setdefault(m[1], []).append((m[2], m[3]))
    return out


def run_in(tree: Path, cases: list[str], out: Path, log: Path, backends: list[str]) -> float:
    argv = ["run", *cases, "--plugin", PLUGIN, "--out", str(out), "--no-progress", "--threads", "1"]
    code, _, seconds = harness(argv + [w for backend in backends for w in ("--backend", backend)], tree, log)
    if not (out / "results.parquet").is_file():
        sys.exit(f"harness run in {tree} failed (exit {code}); see {log}")
    return seconds


def compare(base: Path, new: Path, log: Path, confirm_time: float) -> dict:
    code, stdout, seconds = harness(["compare", str(base), str(new), "--plugin", PLUGIN, "--confirm-time",
                                     str(confirm_time)], ROOT, log)  # fmt: skip
    (log.parent / f"compare-{base.name}-{new.name}.txt").write_text(stdout)
    rows = flagged(stdout)
    tally = re.search(r"^latency verdicts: (.*)$", stdout, re.M)
    return {"exit": code, "seconds": round(seconds), "worse": rows.get("WORSE", []),
            "unconfirmed": rows.get("UNCONFIRMED", []), "verdicts": tally[1] if tally else ""}  # fmt: skip


def planted(work: Path, args: argparse.Namespace) -> dict:
    """HEAD against HEAD + a commit planting 25% in reference_slowable, on 3 cases x 3 backends."""
    branch = f"compare-targets-planted-{os.getpid()}"  # compare re-times only commits a local branch or HEAD reaches
    head = git("rev-parse", "HEAD")
    try:
        with checked_out({"base": head, "new": head}, cwd=ROOT) as (base_tree, new_tree):
            git("switch", "-qc", branch, cwd=new_tree)
            plugin = new_tree / "scripts" / "self" / "slowdown_plugin.py"
            plugin.write_text(re.sub(r"^PLANTED = 0\.0", "PLANTED = 0.25", plugin.read_text(), count=1, flags=re.M))
            git("-c", "user.name=compare_targets", "-c", "user.email=none@localhost", "commit", "-qam",
                "plant 25% in reference_slowable", cwd=new_tree)  # fmt: skip
            cases = work / "three.toml"
            cases.write_text(PLANTED_CASES)
            backends = ["reference", "tlsim", SLOWED]
            seconds = {name: run_in(tree, [str(cases)], work / name, work / "log.txt", backends)
                       for name, tree in (("base", base_tree), ("new", new_tree))}  # fmt: skip
            result = compare(work / "base", work / "new", work / "log.txt", args.confirm_time)
            hits = sorted(case for backend, case in result["worse"] if backend == SLOWED)
            others = [f"{b} on {c}" for b, c in result["worse"] if b != SLOWED]
            return {"run_seconds": {k: round(v) for k, v in seconds.items()}, **result,
                    "slowed_flagged": f"{len(hits)} of 3", "others_flagged": others,
                    "target_met": len(hits) == 3 and not others and result["seconds"] <= 600}  # fmt: skip
    finally:
        subprocess.run(["git", "branch", "-D", branch], cwd=ROOT, capture_output=True)


def reruns(work: Path, args: argparse.Namespace) -> dict:
    """Three smoke runs of HEAD, compared pairwise: every WORSE row is a false alarm."""
    with checked_out({"tree": git("rev-parse", "HEAD")}, cwd=ROOT) as (tree,):
        seconds = {n: round(run_in(tree, ["smoke"], work / n, work / "log.txt", [])) for n in "ABC"}
        pairs = {f"{a}-{b}": compare(work / a, work / b, work / "log.txt", args.confirm_time)
                 for a, b in (("A", "B"), ("A", "C"), ("B", "C"))}  # fmt: skip
        false = sum(len(p["worse"]) for p in pairs.values())
        return {"run_seconds": seconds, **pairs, "false_slower": false, "target_met": false == 0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=["planted", "reruns", "both"], default="both")
    parser.add_argument("--spinners", type=int, default=1, help="busy-looping processes beside the runs (1)")
    parser.add_argument("--confirm-time", type=float, default=900.0, help="compare's --confirm-time (900)")
    parser.add_argument("--keep", type=Path, help="keep the runs and logs here (default: a temporary folder)")
    args = parser.parse_args()
    if git("status", "--porcelain", "--untracked-files=no"):
        print("note: this worktree has uncommitted changes; the builds compared are HEAD's", file=sys.stderr)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.spinners)]
    try:
        with tempfile.TemporaryDirectory(prefix="compare-targets-") as tmp:
            work = args.keep or Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            result = {"load_before": os.getloadavg()[0], "spinners": args.spinners}
            for part, measure in (("planted", planted), ("reruns", reruns)):
                if args.part in (part, "both"):
                    (work / part).mkdir()
                    result[part] = measure(work / part, args)
                    print(f"{part}: {json.dumps(result[part])}", flush=True)
            result["load_after"] = os.getloadavg()[0]
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
