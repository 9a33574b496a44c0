"""Saved pytest-benchmark runs: find the baseline, compare with harness.review.stats, save a passing run.

    python benchmarks/saved.py compare NEW.json [--baseline NAME_OR_PATH] [--min-effect F]
    python benchmarks/saved.py save NEW.json

Only passing runs are saved (``.benchmarks/<machine id>/NNNN_<commit>.json``), so the newest is the
baseline; ``--confirm`` re-times every benchmark against the baseline's commit. Exit 1 when any is slower."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.review import stats  # noqa: E402

STORAGE = ROOT / ".benchmarks"


def machine_dir(storage: Path) -> Path:
    from pytest_benchmark.utils import get_machine_id

    return storage / get_machine_id()


def saved_runs(storage: Path) -> list[Path]:
    """This machine's saved runs, oldest first."""
    return sorted(machine_dir(storage).glob("[0-9][0-9][0-9][0-9]_*.json"))


def find_baseline(name: str | None, storage: Path) -> Path | None:
    """The named saved run (number, part of its name, or a path), or the newest one; None if there is none."""
    runs = saved_runs(storage)
    if name is None:
        return runs[-1] if runs else None
    if Path(name).is_file():
        return Path(name)
    matches = [p for p in runs if p.name.startswith(name) or name in p.stem]
    if not matches:
        known = ", ".join(p.stem for p in runs) or "none"
        raise SystemExit(f"bench: no saved run matches {name!r} (saved on this machine: {known})")
    return matches[-1]


def to_rows(path: Path):
    """A saved run as report rows and meta, so that ``harness.review.compare`` judges it."""
    import pandas as pd

    doc = json.loads(Path(path).read_text())
    rows, case_files, plugins, threads = [], set(), set(), None
    for b in doc["benchmarks"]:
        info, st = b.get("extra_info", {}), b["stats"]
        case_files.update([info["case_file"]] if info.get("case_file") else [])
        plugins.update(info.get("plugins") or [])
        threads = info.get("threads", threads)
        rows.append({
            "case": info.get("case") or b["fullname"], "backend": info.get("backend") or "",
            "device": info.get("device") or "cpu", "status": "pass", "latency_us": st["median"] * 1e6,
            "latency_p10_us": st["q1"] * 1e6, "latency_p90_us": st["q3"] * 1e6,
            "latency_samples_us": info.get("samples_us"), "name": b.get("name") or b["fullname"].split("::")[-1],
        })  # fmt: skip
    commit = doc.get("commit_info", {})
    meta = {
        "commit": commit.get("id"), "dirty": bool(commit.get("dirty")), "device": rows[0]["device"] if rows else None,
        "case_files": sorted(case_files),
        "command": " ".join(f"--plugin {p}" for p in sorted(plugins)), "timing_threads": threads,
    }  # fmt: skip
    return pd.DataFrame(rows), meta


def compare_files(base: Path, new: Path, min_effect: float | None = None, confirm: str | None = None,
                  confirm_time: float = 900.0) -> tuple[bool, str]:  # fmt: skip
    """(passed, summary): is any benchmark of ``new`` slower than in ``base``? ``confirm``: re-timed first."""
    from harness.review.compare import CompareOptions, compare_runs

    (old, old_meta), (cur, cur_meta) = to_rows(base), to_rows(new)
    options = CompareOptions(min_effect=min_effect)
    comparison = compare_runs(old.drop(columns="name"), cur.drop(columns="name"), None, None, options)
    both = int((comparison.rows["side"] == "both").sum())
    lines = [f"bench: {Path(new).name} against {Path(base).name}: {both} benchmarks in both"]
    if confirm:
        comparison, said = _confirm(comparison, old_meta, cur_meta, options, confirm, confirm_time)
        lines += [f"  {line}" for line in said]
    names = dict(zip(zip(cur["case"], cur["backend"], strict=True), cur["name"], strict=True))
    for _, r in comparison.rows.iterrows():
        if r["verdict"] in ("slower", "faster", "cannot tell"):
            mark = {"slower": "SLOWER", "faster": "faster", "cannot tell": "?"}[r["verdict"]]
            weak = " (weak evidence)" if str(r["evidence"]).startswith("p10/p90") else ""
            name = names.get((r["case"], r["backend"]), r["case"])
            lines.append(f"  {mark:6} {r['ratio']:6.3f}x  {name}: {r['verdict_reason']}{weak}")
    for side, what in (("base only", "not in the new run"), ("new only", "new, without a baseline")):
        if count := int((comparison.rows["side"] == side).sum()):
            lines.append(f"  {count} benchmark(s) {what}")
    counts = {v: int((comparison.rows["verdict"] == v).sum()) for v in stats.VERDICTS}
    lines.append("  verdicts: " + ", ".join(f"{k} {n}" for k, n in counts.items()))
    passed = counts["slower"] == 0
    lines.append("bench: PASS: nothing slower" if passed else f"bench: FAIL: {counts['slower']} benchmark(s) slower")
    return passed, "\n".join(lines)


def _confirm(comparison, base_meta: dict, new_meta: dict, options, which: str, time_s: float):
    """Re-time the doubtful benchmarks: the baseline's commit (worktree) against this checkout."""
    from harness.review.confirm import ConfirmInputError, checked_commit, checked_out, confirm_slower

    said: list[str] = []
    if not base_meta.get("commit") or not new_meta.get("case_files"):
        return comparison, ["confirm: skipped: the saved runs record no commit or case file"]
    if base_meta.get("dirty"):
        return comparison, ["confirm: skipped: the baseline was made from a tree with uncommitted changes"]
    try:  # the baseline's JSON is data: it may name only a commit of your own history
        commit = checked_commit(base_meta["commit"], "the baseline's commit_info", cwd=ROOT)
    except ConfirmInputError as error:
        return comparison, [f"confirm: skipped: {error}"]
    try:
        with checked_out({"base": commit}, cwd=ROOT) as (tree,):
            comparison = confirm_slower(comparison, base_meta, new_meta, options, which=which, time_s=time_s,
                                        checkouts=(tree, ROOT), log=said.append)  # fmt: skip
    except subprocess.CalledProcessError as error:
        why = (error.stderr or b"").decode(errors="replace").strip()[:200]
        return comparison, [f"confirm: skipped: cannot check out {commit[:12]}: {why}"]
    return comparison, said


def save(new: Path, storage: Path) -> Path:
    """Copy ``new`` into the storage as the next numbered run of this machine, named by commit."""
    folder = machine_dir(storage)
    folder.mkdir(parents=True, exist_ok=True)
    runs = saved_runs(storage)
    number = int(runs[-1].name[:4]) + 1 if runs else 1
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    target = folder / f"{number:04d}_{commit.strip() or 'nogit'}.json"
    shutil.copyfile(new, target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="compare or save a pytest-benchmark run (see the module docstring)")
    parser.add_argument("action", choices=["compare", "save"])
    parser.add_argument("new", type=Path, help="the new run's JSON (pytest --benchmark-json)")
    parser.add_argument("--baseline", help="a saved run's number, part of its name, or a path (default: the newest)")
    parser.add_argument("--min-effect", type=float, help="smallest slowdown that counts (default 0.10 CPU, 0.03 CUDA)")
    parser.add_argument("--storage", type=Path, default=STORAGE)
    parser.add_argument("--confirm", nargs="?", const="all", choices=["slower", "unclear", "all"],
                        help="re-time benchmarks (all; or only unclear or slower ones), baseline commit and this checkout alternating")  # fmt: skip
    parser.add_argument("--confirm-time", type=float, default=900.0, help="time box of --confirm, s (900)")
    args = parser.parse_args(argv)
    if args.action == "save":
        print(f"bench: saved as {save(args.new, args.storage)}")
        return 0
    base = find_baseline(args.baseline, args.storage)
    if base is None:
        print("bench: no saved run on this machine yet: nothing to compare with (this run becomes the baseline)")
        return 0
    passed, summary = compare_files(base, args.new, args.min_effect, args.confirm, args.confirm_time)
    print(summary)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
