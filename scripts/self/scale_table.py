"""The same cases run with different ``--workers``, side by side: wall time, speed-up, overheads.

    python scripts/self/scale_table.py RUN_DIR WALL_S [RUN_DIR WALL_S ...]

``WALL_S`` is the whole command's wall time (scripts/self/gpu_scale.sh); the rest comes from each run's
meta.json ``scale`` record. The speed-up is over the first run: give ``--workers 1`` first."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.self.peer_table import to_markdown

COLUMNS = ("workers", "wall s", "cases s", "speed-up", "start s", "ceilings s", "wait ms/case", "busy s",
           "journal ms/row", "merge ms/row", "status")  # fmt: skip


def _scale(run_dir: Path) -> dict | None:
    """The run's meta.json ``scale`` record ({} without one), or None when there is no meta.json (a failed run)."""
    meta_file = Path(run_dir) / "meta.json"
    return json.loads(meta_file.read_text()).get("scale") or {} if meta_file.is_file() else None


def table_rows(runs: list[tuple[Path, float]]) -> list[dict]:
    """One dict per run (keys: COLUMNS), from its meta.json and the command's wall seconds."""
    rows, first = [], None
    for run_dir, wall in runs:
        scale = _scale(run_dir)
        if scale is None:
            rows.append({"workers": Path(run_dir).name, "wall s": f"{wall:.1f}", "status": "no run folder (failed?)"})
            continue
        cases_s = scale.get("wall_s", float("nan"))
        first = first or (wall, cases_s)
        count, row_count = max(1, scale.get("cases", 0)), max(1, scale.get("rows", 0))
        status = pd.read_parquet(Path(run_dir) / "results.parquet", columns=["status"])["status"].value_counts()
        rows.append({
            "workers": "ray" if scale.get("mode") == "ray" else str(scale.get("workers", 1)), "wall s": f"{wall:.1f}",
            "cases s": f"{cases_s:.1f}", "speed-up": f"{first[0] / wall:.2f} ({first[1] / cases_s:.2f})",
            "start s": f"{max(scale.get('worker_start_s') or [0]):.1f}",
            "ceilings s": f"{max(scale.get('ceilings_measure_s') or [0]):.1f}",
            "wait ms/case": f"{1e3 * scale.get('dispatch_wait_s', 0) / count:.1f}",
            "busy s": f"{scale.get('case_busy_s', 0):.1f}",
            "journal ms/row": f"{1e3 * scale.get('journal_s', 0) / row_count:.2f}",
            "merge ms/row": f"{1e3 * scale.get('merge_s', 0) / row_count:.3f}",
            "status": " ".join(f"{s} {n}" for s, n in sorted(status.items())),
        })  # fmt: skip
    return rows


def format_phases(runs: list[tuple[Path, float]]) -> str:
    """A Markdown table of each run's busy seconds by phase (meta.json ``scale.phase_s``); '' without."""
    scales = [_scale(run_dir) or {} for run_dir, _ in runs]
    spent = [scale.get("phase_s") or {} for scale in scales]
    if not (names := sorted(set().union(*spent))):
        return ""
    rows = [[name, *(f"{phases.get(name, 0.0):.1f}" for phases in spent)] for name in names]
    busy = [scale.get("case_busy_s") for scale in scales]
    other = ("" if b is None else f"{b - sum(p.values()):.1f}" for b, p in zip(busy, spent, strict=True))
    rows.append(["other", *other])
    return to_markdown(pd.DataFrame(rows, columns=["phase, s", *(Path(run_dir).name for run_dir, _ in runs)]))


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if not argv or len(argv) % 2:
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    runs = [(Path(argv[i]), float(argv[i + 1])) for i in range(0, len(argv), 2)]
    print(to_markdown(pd.DataFrame(table_rows(runs), columns=COLUMNS)))
    if phases := format_phases(runs):
        print(f"\nwhere the cases' busy time went (summed over workers):\n\n{phases}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
