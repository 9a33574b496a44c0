"""Measure compare's false alarms and its power on this machine, for real.

Runs A and B unchanged, C with ``--slowed`` slowed by ``--slowdown`` (scripts/self/slowdown_plugin.py);
then ``compare A B`` (every "slower" a false alarm) and ``compare A C``, plain and with ``--confirm``.

    python scripts/self/noise_check.py                        # cases/cpu.toml, out under /tmp/noise_check
    python scripts/self/noise_check.py --cases cases/smoke.toml --out /tmp/nc
    python scripts/self/noise_check.py --gpu --out $OUT/noise         # on the CUDA machine
    python scripts/self/noise_check.py --gpu --device cpu --cases tiny.toml   # dry run on a CPU

``--gpu``: cases/gpu.toml on CUDA, triton_slowable slowed 5%, plain compare."""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this worktree's harness, not an installed one
PLUGIN = str(ROOT / "scripts" / "self" / "slowdown_plugin.py")
GPU_BACKENDS = ["triton", "triton_slowable"]
MIN_REPS_ENV = "NOISE_CHECK_MIN_REPS"  # a run's floor of timing samples per measurement (--min-reps)

# Applied on import: a run's isolated plugin worker is spawned by multiprocessing, which imports the run's
# main module (this file) again in the worker, so its rows get the run's floor too.
if min_reps := int(os.environ.get(MIN_REPS_ENV) or 0):
    from harness.timing import measure

    measure.time_call = functools.partial(measure.time_call, min_reps=min_reps)
    measure.time_wall = functools.partial(measure.time_wall, min_reps=min_reps)


def shimmed_main(threads: int) -> int:
    """``python -m harness`` with ``threads`` torch intra-op threads (0: torch's default)."""
    import torch

    from harness.cli import main as cli

    if threads:
        torch.set_num_threads(threads)
    return cli.main(sys.argv[3:])


def harness_run(args: argparse.Namespace, out: Path, slowdown: float) -> float:
    """One ``harness run`` of the cases into ``out``, ``args.slowed`` slowed by ``slowdown``; its seconds."""
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # keep the caller's (wheels)
    env = {**os.environ, "HARNESS_SLOWDOWN": str(slowdown), "HARNESS_SLOWED": args.slowed, "PYTHONPATH": pythonpath}
    if args.min_reps:
        env[MIN_REPS_ENV] = str(args.min_reps)
    if args.device == "cpu":
        env.setdefault("TRITON_INTERPRET", "1")  # the shim imports Triton before the CLI could choose
        env.setdefault("HARNESS_TRITON_SLOWABLE_CPU", "1" if args.gpu else "0")
    argv = [sys.executable, __file__, "--_shim", str(args.threads), "run", *args.cases, "--plugin", PLUGIN]
    argv += ["--device", args.device] if args.device else []
    argv += ["--oracle-device", "cuda"] if args.device == "cuda" else []
    argv += [word for backend in args.backend or [] for word in ("--backend", backend)]
    argv += ["--out", str(out), "--no-progress"]
    start = time.time()
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    if not (out / "results.parquet").is_file():
        sys.exit(f"run {out} failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    return time.time() - start


def _counts(rows, slowed: str | None) -> dict:
    judged = rows[rows["verdict"] != ""]
    others = judged[judged["backend"] != slowed] if slowed else judged
    rounds = judged["verdict_reason"].str.extract(r"(\d+) paired rounds")[0].dropna().astype(int)
    false = others[others["verdict"] == "slower"]
    out = {
        "rows_judged": len(judged),
        **({"paired_rounds": rounds.value_counts().sort_index().to_dict()} if len(rounds) else {}),
        "verdicts": judged["verdict"].value_counts().to_dict(), "false_slower": len(false),
        "false_slower_rows": [f"{r.backend} on {r.case}: {r.verdict_reason}" for r in false.itertuples()],
    }  # fmt: skip
    if slowed:
        target = judged[judged["backend"] == slowed]
        flagged, missed = target[target["verdict"] == "slower"], target[target["verdict"] != "slower"]
        out.update(
            planted_rows=len(target), planted_flagged=len(flagged),
            planted_ratio_median=round(float(target["ratio"].median()), 3),
            planted_missed=[f"{r.case}: {r.verdict} ({r.verdict_reason})" for r in missed.itertuples()],
            planted_flagged_rows=[f"{r.case}: {r.verdict_reason}" for r in flagged.itertuples()],
        )  # fmt: skip
    return out


def tally(base: Path, new: Path, slowed: str | None, slowdown: float, args: argparse.Namespace) -> dict:
    """Plain compare of two runs, then (unless ``args.confirm`` is "none") the same with --confirm in this checkout."""
    from harness.results.storage import load_run
    from harness.review.compare import CompareOptions, compare_runs
    from harness.review.confirm import confirm_slower

    (b, bm), (n, nm) = load_run(base), load_run(new)
    nm.setdefault("timing_threads", args.threads or None)
    options = CompareOptions()
    comparison = compare_runs(b, n, bm, nm, options)
    plain = _counts(comparison.rows, slowed)
    if args.confirm == "none":
        return {"compare": plain}
    envs = (
        {"HARNESS_SLOWDOWN": "0"},
        {"HARNESS_SLOWDOWN": str(slowdown if slowed else 0), "HARNESS_SLOWED": slowed or ""},
    )
    start = time.time()
    # the workers import only the plugins named here, never those a meta.json names
    confirmed = confirm_slower(comparison, bm, nm, options, checkouts=(ROOT, ROOT), envs=envs, which=args.confirm,
                               rounds=args.confirm_rounds, time_s=args.confirm_time, plugins=[PLUGIN])  # fmt: skip
    seconds = round(time.time() - start)
    confirmed_counts = {**_counts(confirmed.rows, slowed), "confirm_seconds": seconds}
    return {"compare": plain, f"compare --confirm {args.confirm}": confirmed_counts}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpu", action="store_true", help="the H200 preset (module docstring)")
    parser.add_argument("--cases", nargs="+", help="case files (cases/cpu.toml; --gpu: cases/gpu.toml)")
    parser.add_argument("--device", help="cpu or cuda (the harness's default; --gpu: cuda)")
    parser.add_argument("--backend", action="append",
                        help="only these backends (repeatable; --gpu: triton, triton_slowable)")  # fmt: skip
    parser.add_argument("--slowed", help="the backend slowed in run C (reference_slowable; --gpu: triton_slowable)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/noise_check"))
    parser.add_argument("--slowdown", type=float, help="the planted slowdown (0.25; --gpu: 0.05)")
    parser.add_argument("--min-reps", type=int,
                        help="timing samples per measurement at least (the harness's floors: 10; CUDA latency 20)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1; 0: torch's default)")
    parser.add_argument("--confirm", choices=["none", "slower", "unclear", "all"],
                        help="which rows --confirm re-times (all; --gpu: none)")  # fmt: skip
    parser.add_argument("--confirm-rounds", type=int, default=32, help="most paired rounds per row (32)")
    parser.add_argument("--confirm-time", type=float, default=900.0, help="confirm's time box per comparison, s (900)")
    parser.add_argument("--reuse", nargs=3, type=Path, metavar=("A", "B", "C"), help="compare three existing runs")
    args = parser.parse_args()
    preset = {"cases": ["cases/gpu.toml"], "device": "cuda", "backend": GPU_BACKENDS, "slowed": "triton_slowable",
              "slowdown": 0.05, "confirm": "none"} if args.gpu else {}  # fmt: skip
    defaults = {"cases": ["cases/cpu.toml"], "slowed": "reference_slowable", "slowdown": 0.25, "confirm": "all"}
    for key, value in {**defaults, **preset}.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%H%M%S")
    if args.reuse:
        return report(args, dict(zip("ABC", args.reuse, strict=True)), {})
    runs = {name: args.out / f"{stamp}-{name}" for name in ("A", "B", "C")}
    seconds = {}
    for name, slowdown in (("A", 0.0), ("B", 0.0), ("C", args.slowdown)):
        seconds[name] = harness_run(args, runs[name], slowdown)
        print(f"run {name} ({runs[name]}): {seconds[name]:.0f} s, load {os.getloadavg()[0]:.2f}", flush=True)
    return report(args, runs, seconds)


def report(args: argparse.Namespace, runs: dict[str, Path], seconds: dict[str, float]) -> int:
    """Compare A-B and A-C, print the tallies and write them as JSON beside the runs."""
    result = {"cases": args.cases, "runs": {k: str(v) for k, v in runs.items()}, "seconds": seconds}
    pairs = {
        "A_vs_B (same commit)": ("B", None, 0.0),
        f"A_vs_C ({args.slowed} +{args.slowdown:.0%})": ("C", args.slowed, args.slowdown),
    }
    for name, (new, slowed, slowdown) in pairs.items():
        result[name] = tally(runs["A"], runs[new], slowed, slowdown, args)
    (args.out / f"{Path(runs['A']).name[:-2]}-noise_check.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    for name, tallies in result.items():
        for how, counts in tallies.items() if name.startswith("A_vs_") else ():
            planted = ""
            if "planted_rows" in counts:
                planted = f", {args.slowed} slower on {counts['planted_flagged']} of {counts['planted_rows']}"
            print(f"{name}, {how}: {counts['rows_judged']} rows, verdicts {counts['verdicts']}, "
                  f"false slower {counts['false_slower']}{planted}")  # fmt: skip
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--_shim":
        sys.exit(shimmed_main(int(sys.argv[2])))
    sys.exit(main())
