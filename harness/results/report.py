"""The review page of a run (report.html) and the comparison page (compare --html): one self-contained HTML
file each, no network; every string from a case file, a plugin or an error is escaped by jinja2's autoescape."""

import math
import os
import tempfile
from pathlib import Path

import pandas as pd
from jinja2 import Environment, PackageLoader, select_autoescape

from harness.cases.vocab import FAILING, WORST_FIRST
from harness.results import plots
from harness.results.columns import MEANINGS
from harness.results.storage import load_run
from harness.timing.scaling import fit_scaling

HOST_OVERHEAD_FLAG = 1.5  # call_us / latency_us above this is flagged as host overhead
_STATUS_ORDER = {status: i for i, status in enumerate(WORST_FIRST)}
MAIN_COLUMNS = ["status", "case", "backend", "dtype", "tol_ratio", "max_abs_err", "latency_us", "latency_p10_us",
                "latency_p90_us", "call_us", "gbps", "pct_of_ceiling", "reason"]  # fmt: skip

ENV = Environment(loader=PackageLoader("harness.results", "templates"), autoescape=select_autoescape(["html", "j2"]))


# (row marks {(case, backend): why}, the regressed rows as records, run-level problems) against a baseline
Regressions = tuple[dict[tuple[str, str], str], list[dict], list[str]]


def _missing(value) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def fmt(value, spec: str = ".3g") -> str:
    return "" if _missing(value) else format(value, spec)


def sig(value, digits: int = 3) -> str:
    """A number with ``digits`` significant digits: 0.0123 stays 0.0123 (GB/s on a CPU is never "0.0")."""
    if _missing(value):
        return ""
    value = float(value)
    if value == 0 or not math.isfinite(value):
        return format(value, "g")
    if 1e-3 <= abs(value) < 1e6:
        decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
        return f"{value:.{decimals}f}"
    return f"{value:.{digits - 1}e}"


ENV.filters.update(fmt=fmt, sig=sig)


def write_page(path: Path, page: str) -> Path:
    """Write ``page`` (a page, or xdist workers' rows) to ``path`` atomically, through a new file renamed into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # a new file: no planted link is followed
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        os.fchmod(out.fileno(), 0o644)  # as the run's other files (mkstemp's is 0600)
        out.write(page)
    os.replace(tmp, path)
    return path


def rebuild_html(run_dir: Path, regressions: Regressions | None = None, baseline_name: str = "") -> Path:
    """(Re)write report.html from a run's stored rows, atomically; ``regressions`` marked (harness.review.compare.regressions_of)."""
    frame, meta = load_run(run_dir)
    page = render_html(frame, meta, regressions=regressions, baseline_name=baseline_name)
    return write_page(Path(run_dir) / "report.html", page)


def peaks_of(meta: dict) -> dict[str, dict]:
    """{dtype: {"tflops", "source"}} from meta's ``ceilings`` (per-dtype dicts; a bare number in older runs)."""
    ceilings = meta.get("ceilings") or {}
    peaks, sources = ceilings.get("peak_tflops"), ceilings.get("peak_source") or {}
    if isinstance(peaks, dict):
        return {d: {"tflops": v, "source": sources.get(d, "") if isinstance(sources, dict) else sources}
                for d, v in peaks.items()}  # fmt: skip
    if peaks is not None:
        return {"all dtypes": {"tflops": peaks, "source": sources if isinstance(sources, str) else ""}}
    return {}


def ceilings_of(meta: dict) -> dict[str, float]:
    """GB/s ceilings from meta: the new ``ceilings`` (read, copy) and the old ``ceilings_gbps``."""
    new = meta.get("ceilings") or {}
    out = {n: float(new[f"{n}_gbps"]) for n in ("read", "copy") if isinstance(new.get(f"{n}_gbps"), int | float)}
    if not out:  # a run folder written before ``ceilings``: every limit of the old key
        old = meta.get("ceilings_gbps") or {}
        out = {key: float(value) for key, value in old.items() if isinstance(value, int | float)}
    return out


def _details(row: dict) -> list[tuple[str, str]]:
    """Every set column not in the main table (nor a list of samples), for the row's details-on-demand."""
    shown = [(key, value) for key, value in row.items()
             if key not in MAIN_COLUMNS and not key.startswith("_") and not key.endswith("_samples_us")
             and not isinstance(value, list | tuple) and not hasattr(value, "tolist")]  # fmt: skip
    return [(key, sig(value) if isinstance(value, float) else str(value)) for key, value in shown
            if not _missing(value) and value != ""]  # fmt: skip


def _prepare_rows(frame: pd.DataFrame, regressed: dict[tuple[str, str], str]) -> list[dict]:
    frame = frame.reindex(columns=list(dict.fromkeys([*MAIN_COLUMNS, *frame.columns])))
    ordered = frame.sort_values(["status", "case", "backend"], key=lambda column: (
        column.map(_STATUS_ORDER).fillna(0) if column.name == "status" else column))  # fmt: skip
    rows = []
    for row in ordered.to_dict("records"):
        call, lat = row.get("call_us"), row.get("latency_us")
        overhead = call / lat if not _missing(call) and not _missing(lat) and lat > 0 else None
        row["_overhead"] = overhead if overhead and overhead > HOST_OVERHEAD_FLAG else None
        row["_details"] = _details(row)
        row["_regressed"] = regressed.get((row["case"], row["backend"]), "")
        row["_failing"] = None if _missing(row.get("fail_count")) else int(row["fail_count"])
        rows.append(row)
    return rows


def time_summary(meta: dict) -> str:
    """Where the run's time went, one line for the page's header, from meta.json's ``scale``; '' if not recorded."""
    scale = meta.get("scale") or {}
    if "wall_s" not in scale:
        return ""
    mode = scale.get("mode", "")
    how = {"workers": f"{scale.get('workers')} worker{'s' if scale.get('workers') != 1 else ''}",
           "ray": f"Ray, {scale.get('tasks', '?')} tasks"}.get(mode, "one process")  # fmt: skip
    text = f"{how}, {scale['wall_s']:.1f} s from the first case to the last row"
    if meta.get("resumed"):
        text += f" (the resumed part only: {meta['resumed'].get('journal_rows', '?')} rows came from the journal)"
    if starts := scale.get("worker_start_s"):
        text += f", workers started in {max(starts):.1f} s"
    if phases := sorted((scale.get("phase_s") or {}).items(), key=lambda item: -item[1]):
        busy = scale.get("case_busy_s")
        text += f"; {busy:.1f} s of case work: " if busy is not None else "; case work: "
        text += ", ".join(f"{name} {seconds:.1f}" for name, seconds in phases)
    return text


def render_html(frame: pd.DataFrame, meta: dict, *, regressions: Regressions | None = None,
                baseline_name: str = "") -> str:  # fmt: skip
    marked, regressions, problems = regressions or ({}, [], [])
    rows = _prepare_rows(frame, marked)
    graded = [r for r in rows if r["status"] != "skip"]
    skipped = [r for r in rows if r["status"] == "skip"]
    counts = {s: sum(r["status"] == s for r in rows) for s in _STATUS_ORDER}
    # the pivot: cases as rows, backends that ran anywhere as columns (a backend that never ran: the skips list)
    backends = sorted({r["backend"] for r in graded})
    pivot: dict[str, dict] = {}
    for r in sorted(rows, key=lambda r: r["case"]):
        pivot.setdefault(r["case"], {"case": r["case"], "cells": {}})["cells"][r["backend"]] = r
    ceilings = ceilings_of(meta)
    try:
        fits = fit_scaling(frame)
    except Exception:  # the page must render even if a fit cannot be made from these rows
        fits = pd.DataFrame()
    figures = [("Latency and bandwidth against KV length", plots.latency_and_bandwidth(frame, ceilings)),
               ("Error against tolerance, per backend", plots.error_vs_tolerance(frame)),
               ("Scaling fit", plots.scaling_fit(frame, fits))]  # fmt: skip
    return ENV.get_template("report.html.j2").render(
        tips=MEANINGS, meta=meta, rows=graded, skipped=skipped, bad=[r for r in rows if r["status"] in FAILING],
        counts=counts, total=len(rows), backends=backends, pivot=list(pivot.values()), ceilings=ceilings,
        peaks=peaks_of(meta), figures=[(title, uri) for title, uri in figures if uri],
        fits=fits.to_dict("records"), regressions=regressions, baseline_problems=problems,
        baseline_name=baseline_name, overhead_flag=HOST_OVERHEAD_FLAG, time_summary=time_summary(meta),
    )  # fmt: skip
