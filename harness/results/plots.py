"""Plots for the review and history pages, as self-contained SVG data URIs (no files, no network).

Every function takes report rows (a DataFrame) and returns ``data:image/svg+xml;base64,...``
for an ``<img src>``, or None when there is nothing to draw. Matplotlib is used through
``matplotlib.figure.Figure`` (no pyplot state, no display); text in the SVG (backend and
case names) is XML-escaped by matplotlib, and an ``<img>`` runs no script anyway.
"""

from __future__ import annotations

import base64
import functools
import io

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from harness.cases.vocab import GRADED
from harness.timing.scaling import phase_of

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"]


def _names_as_text(draw):
    """``draw`` with matplotlib's mathtext off: a '$' in a case's or backend's name is text, not TeX (no global
    setting changes for other code in the process)."""

    @functools.wraps(draw)
    def drawn(*args, **kwargs):
        with matplotlib.rc_context({"text.parse_math": False}):
            return draw(*args, **kwargs)

    return drawn


def to_data_uri(fig: Figure) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight")
    return "data:image/svg+xml;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def backend_colors(backends) -> dict[str, str]:
    return {b: COLORS[i % len(COLORS)] for i, b in enumerate(sorted(set(backends)))}


def _timed(frame: pd.DataFrame) -> pd.DataFrame:
    if "latency_us" not in frame or "total_kv_tokens" not in frame:
        return frame.iloc[0:0]
    return frame.dropna(subset=["latency_us", "total_kv_tokens"]).sort_values("total_kv_tokens")


@_names_as_text
def latency_and_bandwidth(frame: pd.DataFrame, ceilings: dict[str, float] | None = None) -> str | None:
    """Two panels against total KV tokens per case: latency (us) and GB/s, per backend; ceilings dashed."""
    timed = _timed(frame)
    if timed.empty:
        return None
    colors = backend_colors(timed["backend"])
    fig = Figure(figsize=(11, 4))
    lat, bw = fig.subplots(1, 2)
    for backend, rows in timed.groupby("backend"):
        style = {"color": colors[backend], "marker": "o", "ms": 3.5, "lw": 0, "label": backend}
        lat.plot(rows["total_kv_tokens"], rows["latency_us"], **style)
        if "gbps" in rows:
            bw.plot(rows["total_kv_tokens"], rows["gbps"], **style)
    for name, value in (ceilings or {}).items():
        if value and np.isfinite(value):
            bw.axhline(value, ls="--", lw=1, color="#555")
            bw.annotate(
                f"{name} {value:.3g} GB/s", (0.01, value), xycoords=("axes fraction", "data"), fontsize=8, va="bottom"
            )
    for ax, label in ((lat, "latency (µs, median)"), (bw, "GB/s (bytes moved / latency)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("total KV tokens of the case")
        ax.set_ylabel(label)
        ax.grid(True, which="major", alpha=0.3)
    lat.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return to_data_uri(fig)


@_names_as_text
def error_vs_tolerance(frame: pd.DataFrame) -> str | None:
    """tol_ratio (max error over the allowed error) per backend; the line at 1 is the tolerance."""
    if "tol_ratio" not in frame:
        return None
    graded = frame[frame["status"].isin(GRADED)].dropna(subset=["tol_ratio"])
    if graded.empty:
        return None
    backends = sorted(graded["backend"].unique())
    colors = backend_colors(backends)
    fig = Figure(figsize=(11, 3.2))
    ax = fig.subplots()
    rng = np.random.default_rng(0)
    for i, backend in enumerate(backends):
        values = graded.loc[graded["backend"] == backend, "tol_ratio"].clip(lower=1e-6)
        ax.scatter(i + rng.uniform(-0.18, 0.18, len(values)), values, s=12, color=colors[backend], alpha=0.8)
    ax.axhline(1.0, color="#b3261e", lw=1.2, ls="--")
    ax.annotate("tolerance", (len(backends) - 0.5, 1.0), fontsize=8, color="#b3261e", va="bottom", ha="right")
    ax.set_xticks(range(len(backends)), backends, rotation=20, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("error / tolerance (tol_ratio)")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return to_data_uri(fig)


@_names_as_text
def scaling_fit(frame: pd.DataFrame, fits: pd.DataFrame | None) -> str | None:
    """Latency against the work that drives it, per backend, with the fitted line fixed_us + per_unit_us * x.

    One panel per (phase, x) among the fits' work axes (decode: bytes_moved, prefill: flops;
    token and batch axes when a run has no other), each with only that phase's rows. Both
    axes are logarithmic, so one slow backend (the interpreted Triton kernel on a CPU, a
    thousand times the others) does not flatten the rest against the floor. A backend whose
    line was not kept (``fitted`` False) shows its points only, "no linear fit" in the legend.
    """
    if fits is None or fits.empty:
        return None
    timed = _timed(frame)
    if timed.empty:
        return None
    timed = timed.assign(_phase=phase_of(timed))
    phases = fits["phase"] if "phase" in fits else pd.Series("all", index=fits.index)
    fits = fits.assign(phase=phases)
    if "fitted" not in fits:
        fits = fits.assign(fitted=True)
    work = fits[fits["x"].isin(["bytes_moved", "flops"])]
    panels = list(dict.fromkeys(zip(work["phase"], work["x"], strict=True))) or list(
        dict.fromkeys(zip(fits["phase"], fits["x"], strict=True))
    )
    colors = backend_colors(timed["backend"])
    fig = Figure(figsize=(5.5 * len(panels), 3.8))
    axes = np.atleast_1d(fig.subplots(1, len(panels)))
    for ax, (phase, x) in zip(axes, panels, strict=True):
        for fit in fits[(fits["x"] == x) & (fits["phase"] == phase)].itertuples():
            rows = timed[(timed["backend"] == fit.backend) & (timed["_phase"].eq(phase) | (phase == "all"))]
            rows = rows.dropna(subset=[x]) if x in rows else rows.iloc[0:0]
            rows = rows[(rows[x] > 0) & (rows["latency_us"] > 0)]  # a log axis has no zero
            if rows.empty:
                continue
            color = colors.get(fit.backend, "#333")
            if not fit.fitted:
                ax.plot(rows[x], rows["latency_us"], "o", ms=3.5, color=color, label=f"{fit.backend} (no linear fit)")
                continue
            ax.plot(rows[x], rows["latency_us"], "o", ms=3.5, color=color)
            grid = np.geomspace(rows[x].min(), rows[x].max(), 50)
            ax.plot(grid, fit.fixed_us + fit.per_unit_us * grid, "-", lw=1, color=color,
                    label=f"{fit.backend} (r²={fit.r2:.2f})")  # fmt: skip
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{phase}: latency against {x}", fontsize=9)
        ax.set_xlabel(f"{x} (log)")
        ax.set_ylabel("latency (µs, log)")
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return to_data_uri(fig)


@_names_as_text
def trend(history: pd.DataFrame, value: str, ylabel: str, title: str, flag: str = "regressed") -> str | None:
    """One line per (case, backend) of ``value`` across runs (x: run order); rows where ``flag`` is set circled red."""
    data = history.dropna(subset=[value])
    if data.empty:
        return None
    runs = list(dict.fromkeys(data.sort_values("run_order")["run_label"]))
    colors = backend_colors(data["backend"])
    fig = Figure(figsize=(11, 3.8))
    ax = fig.subplots()
    for (_case, backend), rows in data.groupby(["case", "backend"]):
        rows = rows.sort_values("run_order")
        ax.plot(rows["run_order"], rows[value], "-o", ms=3, lw=1, alpha=0.7, color=colors[backend])
        bad = rows[rows[flag].astype(bool)] if flag in rows else rows.iloc[0:0]
        ax.plot(bad["run_order"], bad[value], "o", ms=9, mfc="none", mec="#b3261e", mew=1.5)
    for backend, color in colors.items():
        ax.plot([], [], "-", color=color, label=backend)
    ax.set_xticks(range(len(runs)), runs, rotation=20, ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncols=2)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return to_data_uri(fig)
