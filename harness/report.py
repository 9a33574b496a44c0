"""The review page of a run: report.html, rendered from its rows and meta."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pandas as pd
from jinja2 import Environment, PackageLoader, select_autoescape

from .storage import load_run


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
