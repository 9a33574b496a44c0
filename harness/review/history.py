"""``harness history``: latency and error of every (case, backend) across runs, commit by commit. Runs are
grouped by machine, ordered by time, labelled by short commit (``+`` dirty, ``#2`` a second run of one
commit), each compared with the run before it."""

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from harness.cases.vocab import GRADED
from harness.results.report import ENV, plots, write_page
from harness.results.storage import load_run
from harness.review.compare import CompareOptions, compare_runs, drift_warning

VALUES = ["status", "latency_us", "max_abs_err", "tol_ratio"]


@dataclass(frozen=True)
class History:
    runs: pd.DataFrame  # one row per run: path, machine, commit, time, run_label, run_order, and against the run
    # before on its machine: drift (the note's what-it-saw part), previous (its folder), same_commit
    rows: pd.DataFrame  # one row per (run, case, backend): VALUES, regressed, why


def find_runs(paths: list[Path]) -> list[Path]:
    """Run folders among ``paths`` and their direct subfolders (hidden, half-written ones skipped); else ValueError."""
    found = []
    for path in map(Path, paths):
        if (path / "meta.json").exists() or (path / "results.parquet").exists():
            found.append(path)
        elif path.is_dir():
            inside = [p for p in sorted(path.iterdir()) if not p.name.startswith(".")]
            inside = [p for p in inside if (p / "meta.json").is_file() and (p / "results.parquet").is_file()]
            if not inside:
                raise ValueError(f"{path}: not a run folder (no meta.json and results.parquet), nor a folder of runs")
            found += inside
        else:
            raise ValueError(f"{path}: neither a run folder nor a folder of runs")
    return list(dict.fromkeys(found))


def load_history(paths: list[Path], *, min_effect: float | None = None, backends: list[str] | None = None) -> History:
    loaded = []
    for path in find_runs(paths):
        frame, meta = load_run(path)
        if backends:
            frame = frame[frame["backend"].isin(backends)]
        machine = f"{meta.get('device', '?')} {meta.get('device_name') or ''}".strip()
        loaded.append((path, frame, meta, machine))
    if not loaded:
        raise ValueError(f"no run folders under {', '.join(map(str, paths))}")
    loaded.sort(key=lambda item: (item[3], str(item[2].get("time") or ""), str(item[0])))
    runs, parts, seen = [], [], {}
    previous: dict[str, tuple[pd.DataFrame, dict, str]] = {}  # machine -> its last run: rows, meta, folder
    for order, (path, frame, meta, machine) in enumerate(loaded):
        commit = (meta.get("commit") or "nogit")[:7] + ("+" if meta.get("dirty") else "")
        seen[(machine, commit)] = seen.get((machine, commit), 0) + 1
        label = commit + (f"#{seen[(machine, commit)]}" if seen[(machine, commit)] > 1 else "")
        runs.append({"path": str(path), "machine": machine, "commit": meta.get("commit"), "time": meta.get("time"),
                     "run_label": label, "run_order": order, "rows": len(frame), "drift": "", "previous": "",
                     "same_commit": False})  # fmt: skip
        part = frame.reindex(columns=["case", "backend", *VALUES])
        part = part.assign(machine=machine, run_label=label, run_order=order, why="")
        if machine in previous:
            base, base_meta, base_path = previous[machine]
            comparison = compare_runs(base, frame, base_meta, meta, CompareOptions(min_effect=min_effect))
            drift = [note.split("; ")[0] for note in drift_warning(comparison.rows)]  # what it saw, not its reading
            same = bool(base_meta.get("commit")) and base_meta.get("commit") == meta.get("commit")
            same = same and not (base_meta.get("dirty") or meta.get("dirty"))  # a dirty tree is not its commit's code
            runs[-1].update(drift="; ".join(drift), previous=base_path, same_commit=same)
            why = {(r["case"], r["backend"]): r["why"] for _, r in comparison.regressions.iterrows()}
            part["why"] = [why.get(k, "") for k in zip(part["case"], part["backend"], strict=True)]
        part["regressed"] = part["why"] != ""
        part["latency_regressed"] = part["why"].str.contains("latency ", regex=False)
        part["error_regressed"] = part["why"].str.contains("status|err|margin|NaN", regex=True)
        previous[machine] = (frame, meta, str(path))
        parts.append(part)
    rows = pd.concat(parts, ignore_index=True)
    runs = pd.DataFrame(runs)
    runs["regressed"] = runs["run_order"].map(rows.groupby("run_order")["regressed"].sum()).fillna(0).astype(int)
    return History(runs=runs, rows=rows)


def _cell(row: pd.Series) -> str:
    if row["status"] not in GRADED or pd.isna(row["latency_us"]):
        text = str(row["status"])
    else:
        text = f"{row['latency_us']:.0f}" if row["latency_us"] >= 1000 else f"{row['latency_us']:.4g}"
        if row["status"] == "fail":
            text += " FAIL"
    return text + (" ▲" if row["regressed"] else "")


def trend_table(history: History, last: int = 8) -> dict[str, pd.DataFrame]:
    """Per machine: (case, backend) rows x the last ``last`` runs, each cell latency (▲ regressed)."""
    out = {}
    for machine, rows in history.rows.groupby("machine", sort=True):
        rows = rows[rows["run_order"].isin(sorted(rows["run_order"].unique())[-last:])]
        labels = rows.drop_duplicates("run_order").set_index("run_order")["run_label"]
        table = rows.assign(cell=rows.apply(_cell, axis=1)).pivot_table(
            index=["case", "backend"], columns="run_order", values="cell", aggfunc="first"
        )
        table.columns = [labels[c] for c in table.columns]
        out[machine] = table.fillna("—")
    return out


def format_history(history: History) -> str:
    """The terminal view: runs per machine, the regressions, then the latency trend table."""
    lines = []
    for machine, runs in history.runs.groupby("machine", sort=True):
        listed = ", ".join(f"{r.run_label} ({r.time})" for r in runs.itertuples())
        lines.append(f"{machine}: {len(runs)} run(s): {listed}")
    bad = history.rows[history.rows["regressed"]]
    lines.append(f"{len(bad)} regression(s) between consecutive runs" + (":" if len(bad) else ""))
    lines += [f"  ▲ {r.run_label}: {r.backend} on {r.case}: {r.why}" for r in bad.itertuples()]
    runs = history.runs
    flagged = (runs["drift"].ne("") | runs["same_commit"]) & runs["run_order"].isin(bad["run_order"])
    for run in runs[flagged].itertuples():  # the two runs alone are no verdict on the code there
        seen = f"{run.drift}; " if run.drift else ""
        if run.same_commit:
            reading = "the same commit as the run before: its latency ▲ are not a change of the code"
        else:  # only paired rounds of both builds under one load tell the load from the code (harness compare)
            reading = (f"the two runs alone cannot tell the machine's load from the code: "
                       f"`harness compare {run.previous} {run.path}` re-times its latency ▲ in paired rounds")  # fmt: skip
        lines.append(f"  ! {run.run_label}: {seen}{reading}")
    with pd.option_context("display.max_rows", None, "display.width", 250, "display.max_colwidth", 40):
        for machine, table in trend_table(history).items():
            lines.append(f"\nlatency (µs) per run on {machine} (▲ regressed against the run before):")
            lines.append(table.to_string())
    return "\n".join(lines)


def write_history_html(history: History, path: Path) -> Path:
    """The history page: runs, regressions, latency and error trend plots, the trend tables."""
    figures = []
    for machine, rows in history.rows.groupby("machine", sort=True):
        latency = plots.trend(rows, "latency_us", "latency (µs, median)", machine, flag="latency_regressed")
        error = plots.trend(rows, "tol_ratio", "tol_ratio", machine, flag="error_regressed")
        figures += [(f"Latency per run on {machine}", latency), (f"Error / tolerance per run on {machine}", error)]
    html = ENV.get_template("history.html.j2").render(
        runs=history.runs.to_dict("records"),
        regressions=history.rows[history.rows["regressed"]].to_dict("records"),
        tables={m: t.reset_index().to_dict("split") for m, t in trend_table(history, last=12).items()},
        figures=[(t, uri) for t, uri in figures if uri],
    )
    return write_page(path, html)
