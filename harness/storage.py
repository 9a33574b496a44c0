"""Storing a run: results.parquet, results.csv, meta.json and report.html in one folder.

Writing is atomic: everything goes to a hidden sibling folder that is renamed into place
at the end, so an interrupted run leaves no half-written report, and an existing run
folder is never written into.
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from .environment import git

RESULT_FILES = ("results.parquet", "results.csv", "meta.json", "report.html")


class RunDirExistsError(FileExistsError):
    """The run folder already exists; runs are never overwritten."""


def default_run_dir(reports_root: Path, device: str) -> Path:
    """reports/<UTC time>-<device>-<short commit>, with a numeric suffix if taken."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    commit = git("rev-parse", "--short", "HEAD") or "nogit"
    base = reports_root / f"{stamp}-{device}-{commit}"
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def write_run(frame: pd.DataFrame, meta: dict, run_dir: Path) -> Path:
    """Write the four result files into ``run_dir`` atomically; return ``run_dir``."""
    run_dir = Path(run_dir)
    if run_dir.exists():
        raise RunDirExistsError(f"{run_dir} already exists; a run is never overwritten (choose another --out)")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = run_dir.with_name(f".{run_dir.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        frame.to_parquet(staging / "results.parquet", index=False)
        frame.to_csv(staging / "results.csv", index=False)
        (staging / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        from .report import render_html  # rendering imports jinja2 and matplotlib: only when writing

        (staging / "report.html").write_text(render_html(frame, meta))
        os.rename(staging, run_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return run_dir


def load_run(run_dir: Path) -> tuple[pd.DataFrame, dict]:
    """A stored run's rows and meta; ValueError naming the missing file."""
    run_dir = Path(run_dir)
    for name in ("results.parquet", "meta.json"):
        if not (run_dir / name).is_file():
            raise ValueError(f"{run_dir}: not a run folder (no {name})")
    return pd.read_parquet(run_dir / "results.parquet"), json.loads((run_dir / "meta.json").read_text())
