"""Measure compare's false alarms and its power on this machine, for real.

Three runs of one commit, each through ``python -m harness run`` in a subprocess, with
the plugin ``scripts/slowdown_plugin.py`` (``reference_slowable``: the reference kernel,
slowed by a sleep of ``--slowdown`` times its own call time when asked):

    A: no slowdown      B: no slowdown      C: reference_slowable slowed by 25%

then ``compare A B`` (every "slower" verdict there is a false alarm) and ``compare A C``
(``reference_slowable`` should be "slower" on every case it runs; any other backend
judged slower is a false alarm). Prints the counts and writes ``noise_check.json``.

    python scripts/noise_check.py                        # cases/cpu.toml, out under /tmp/noise_check
    python scripts/noise_check.py --cases cases/smoke.toml --out /tmp/nc

Until the runner records ``latency_samples_us`` itself, the runs go through a small shim
(``--shim``, on automatically when the column is missing) that keeps every sample of
``harness.timing.time_call`` and asks it for at least ``--min-reps`` of them, and sets
torch's intra-op threads (``--threads``, default 1: on a shared 2-core machine two
OpenMP threads fighting other processes make a 1 ms call take 130 ms).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this worktree's harness, not an installed one
PLUGIN = str(ROOT / "scripts" / "slowdown_plugin.py")
SLOWED = "reference_slowable"


def shimmed_main(min_reps: int, threads: int) -> int:
    """``python -m harness`` with every timing sample kept as ``latency_samples_us``."""
    import torch

    from harness import cli, runner, timing

    if threads:
        torch.set_num_threads(threads)

    if "latency_samples_us" not in runner.COLUMNS:
        last = {}

        def time_call(fn, device, **kw):
            kw["min_reps"] = max(kw.get("min_reps", 3), min_reps)
            last["t"] = timing.time_call(fn, device, **kw)
            return last["t"]

        original = runner.run_backend

        def run_backend(ctx, backend, config):
            last.clear()
            row = original(ctx, backend, config)
            if "t" in last and "latency_us" in row:
                row["latency_samples_us"] = list(last["t"].samples_us)
            return row

        runner.time_call, runner.run_backend = time_call, run_backend
        runner.COLUMNS.append("latency_samples_us")
    return cli.main(sys.argv[4:])


def harness_run(cases: list[str], out: Path, slowdown: float, min_reps: int, threads: int) -> float:
    env = {**os.environ, "HARNESS_SLOWDOWN": str(slowdown), "PYTHONPATH": str(ROOT)}
    env.setdefault("TRITON_INTERPRET", "1")  # the shim imports Triton before the CLI could choose (CPU runs)
    argv = [
        sys.executable,
        __file__,
        "--_shim",
        str(min_reps),
        str(threads),
        "run",
        *cases,
        "--plugin",
        PLUGIN,
        "--out",
        str(out),
        "--no-progress",
    ]
    start = time.time()
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    if not (out / "results.parquet").is_file():
        sys.exit(f"run {out} failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    return time.time() - start


def _counts(rows, slowed: str | None) -> dict:
    judged = rows[rows["verdict"] != ""]
    others = judged[judged["backend"] != slowed] if slowed else judged
    out = {
        "rows_judged": len(judged),
        "verdicts": judged["verdict"].value_counts().to_dict(),
        "false_slower": int((others["verdict"] == "slower").sum()),
        "false_slower_rows": [
            f"{r.backend} on {r.case}: {r.verdict_reason}" for r in others[others["verdict"] == "slower"].itertuples()
        ],
    }
    if slowed:
        target = judged[judged["backend"] == slowed]
        out.update(
            planted_rows=len(target),
            planted_flagged=int((target["verdict"] == "slower").sum()),
            planted_ratio_median=round(float(target["ratio"].median()), 3),
            planted_missed=[
                f"{r.case}: {r.verdict} ({r.verdict_reason})"
                for r in target[target["verdict"] != "slower"].itertuples()
            ],
        )
    return out


def tally(base: Path, new: Path, slowed: str | None, slowdown: float, threads: int, which: str = "all") -> dict:
    """Plain compare of two runs, then the same with --confirm (both workers in this checkout)."""
    from harness.compare import CompareOptions, compare_runs
    from harness.confirm import confirm_slower
    from harness.storage import load_run

    (b, bm), (n, nm) = load_run(base), load_run(new)
    nm.setdefault("timing_threads", threads or None)
    options = CompareOptions()
    comparison = compare_runs(b, n, bm, nm, options)
    plain = _counts(comparison.rows, slowed)
    envs = ({"HARNESS_SLOWDOWN": "0"}, {"HARNESS_SLOWDOWN": str(slowdown if slowed else 0)})
    if which == "none":
        return {"compare": plain}
    start = time.time()
    confirmed = confirm_slower(comparison, bm, nm, options, checkouts=(ROOT, ROOT), envs=envs, which=which)
    seconds = round(time.time() - start)
    return {
        "compare": plain,
        f"compare --confirm {which}": {**_counts(confirmed.rows, slowed), "confirm_seconds": seconds},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", nargs="+", default=["cases/cpu.toml"])
    parser.add_argument("--out", type=Path, default=Path("/tmp/noise_check"))
    parser.add_argument("--slowdown", type=float, default=0.25)
    parser.add_argument("--min-reps", type=int, default=10, help="timing samples per row at least (10)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads while running (1; 0 = torch's default)"
    )
    parser.add_argument(
        "--confirm",
        default="all",
        choices=["none", "slower", "unclear", "all"],
        help="which rows --confirm re-times (all)",
    )
    parser.add_argument("--reuse", nargs=3, type=Path, metavar=("A", "B", "C"), help="compare three existing runs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%H%M%S")
    if args.reuse:
        runs = dict(zip("ABC", args.reuse, strict=True))
        return report(args, runs, {})
    runs = {name: args.out / f"{stamp}-{name}" for name in ("A", "B", "C")}
    seconds = {}
    for name, slowdown in (("A", 0.0), ("B", 0.0), ("C", args.slowdown)):
        seconds[name] = harness_run(args.cases, runs[name], slowdown, args.min_reps, args.threads)
        print(f"run {name} ({runs[name]}): {seconds[name]:.0f} s, load {os.getloadavg()[0]:.2f}", flush=True)
    return report(args, runs, seconds)


def report(args: argparse.Namespace, runs: dict[str, Path], seconds: dict[str, float]) -> int:
    """Compare A-B and A-C, print the tallies and write them as JSON beside the runs."""
    result = {
        "cases": args.cases,
        "runs": {k: str(v) for k, v in runs.items()},
        "seconds": seconds,
        "A_vs_B (same commit)": tally(runs["A"], runs["B"], None, 0.0, args.threads, args.confirm),
        f"A_vs_C ({SLOWED} +{args.slowdown:.0%})": tally(
            runs["A"], runs["C"], SLOWED, args.slowdown, args.threads, args.confirm
        ),
    }
    (args.out / f"{Path(runs['A']).name[:-2]}-noise_check.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--_shim":
        sys.exit(shimmed_main(int(sys.argv[2]), int(sys.argv[3])))
    sys.exit(main())
