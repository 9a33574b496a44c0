"""Storing a run (results.parquet, results.csv, meta.json, report.html) and rendering it.

Writing is atomic: everything goes to a hidden sibling folder that is renamed into place
at the end, so an interrupted run leaves no half-written report, and an existing run
folder is never written into.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import torch
from jinja2 import Environment, PackageLoader, select_autoescape

RESULT_FILES = ("results.parquet", "results.csv", "meta.json", "report.html")


class RunDirExistsError(FileExistsError):
    """The run folder already exists; runs are never overwritten."""


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _dirty() -> bool | None:
    """True when tracked files differ from HEAD; None when this is no git checkout."""
    if not _git("rev-parse", "--git-dir"):
        return None
    return bool(_git("status", "--porcelain", "--untracked-files=no"))


def collect_meta(device: str, argv: list[str], ceilings: dict[str, float]) -> dict:
    """Everything needed to trust or reproduce a run later."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    dev = torch.device(device)
    return {
        # HARNESS_COMMIT names the commit where the tree travels without .git (a lent GPU box).
        "commit": _git("rev-parse", "HEAD") or os.environ.get("HARNESS_COMMIT") or None,
        "dirty": _dirty(),
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "device": device,
        "device_name": torch.cuda.get_device_name(dev)
        if dev.type == "cuda"
        else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "triton": triton_version,
        "python": platform.python_version(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET"),
        "command": " ".join(argv),
        "ceilings_gbps": ceilings,
    }


def default_run_dir(reports_root: Path, device: str) -> Path:
    """reports/<UTC time>-<device>-<short commit>, with a numeric suffix if taken."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    commit = _git("rev-parse", "--short", "HEAD") or "nogit"
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


def rebuild_html(run_dir: Path) -> Path:
    """(Re)write report.html from a run's stored rows, atomically."""
    frame, meta = load_run(run_dir)
    target = Path(run_dir) / "report.html"
    tmp = target.with_name(f".report.html.{os.getpid()}")
    tmp.write_text(render_html(frame, meta))
    os.replace(tmp, target)
    return target


_STATUS_ORDER = {"error": 0, "fail": 1, "pass": 2, "skip": 3}
_env = Environment(loader=PackageLoader("harness", "templates"), autoescape=select_autoescape(["html", "j2"]))


def _fmt(value, spec: str) -> str:
    return "" if value is None or (isinstance(value, float) and pd.isna(value)) else format(value, spec)


_env.filters["fmt"] = _fmt


def render_html(frame: pd.DataFrame, meta: dict) -> str:
    """The review page: run facts, status counts per backend, then every row, failures first."""
    ordered = frame.assign(_order=frame["status"].map(_STATUS_ORDER)).sort_values(["_order", "case", "backend"])
    counts = (
        frame.pivot_table(index="backend", columns="status", values="case", aggfunc="count", fill_value=0)
        .reindex(columns=["pass", "fail", "error", "skip"], fill_value=0)
        .reset_index()
        .to_dict("records")
        if not frame.empty
        else []
    )
    return _env.get_template("report.html.j2").render(
        meta=meta,
        counts=counts,
        rows=ordered.drop(columns="_order").to_dict("records"),
        python=sys.version.split()[0],
    )
