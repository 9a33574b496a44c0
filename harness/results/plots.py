"""Plots for the review and history pages: report rows in, a self-contained SVG data URI out (None when there
is nothing to draw). Every name from a run goes through :func:`literal`, so matplotlib draws it as text."""

import base64
import io

import numpy as np
import pandas as pd

from harness.cases.vocab import GRADED
from harness.timing.scaling import phase_of

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"]


def literal(name) -> str:
    """``name`` as matplotlib draws it literally: each '$' escaped, so no pair of them opens TeX
    (matplotlib then shows ``\\$`` as '$'; a name with no '$' is unchanged)."""
    return str(name).replace("$", r"\$")


def figure(width: float, height: float):
    """A matplotlib Figure, imported here: a process that writes no plot skips matplotlib's import (about a second)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))


def to_data_uri(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight")
    return "data:image/svg+xml;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def backend_colors(backends) -> dict[str, str]:
    return {b: COLORS[i % len(COLORS)] for i, b in enumerate(sorted(set(backends)))}


def _timed(frame: pd.DataFrame) -> pd.DataFrame:
    if "latency_us" not in frame or "total_kv_tokens" not in frame:
        return frame.iloc[0:0]
    return frame.dropna(subset=["latency_us", "total_kv_tokens"]).sort_values("total_kv_tokens")


def latency_and_bandwidth(frame: pd.DataFrame, ceilings: dict[str, float] | None = None) -> str | None:
    """Two panels against total KV tokens per case: latency (us) and GB/s, per backend; ceilings dashed."""
    timed = _timed(frame)
    if timed.empty:
        return None
    colors = backend_colors(timed["backend"])
    fig = figure(11, 4)
    lat, bw = fig.subplots(1, 2)
    for backend, rows in timed.groupby("backend"):
        style = {"color": colors[backend], "marker": "o", "ms": 3.5, "lw": 0, "label": literal(backend)}
        lat.plot(rows["total_kv_tokens"], rows["latency_us"], **style)
        if "gbps" in rows:
            bw.plot(rows["total_kv_tokens"], rows["gbps"], **style)
    lines = sorted((float(v), literal(n)) for n, v in (ceilings or {}).items() if v and np.isfinite(v) and v > 0)
    for value, _ in lines:
        bw.axhline(value, ls="--", lw=1, color="#555")
    for ax, label in ((lat, "latency (µs, median)"), (bw, "GB/s (bytes moved / latency)")):
        ax.set(xscale="log", yscale="log", xlabel="total KV tokens of the case", ylabel=label)
        ax.grid(True, which="major", alpha=0.3)
    lat.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    _label_ceilings(bw, lines)  # after the layout: the labels are stacked in the axes' final height
    return to_data_uri(fig)


CEILING_FONT = 8  # points


def _label_ceilings(ax, lines: list[tuple[float, str]]) -> None:
    """Each ceiling's dashed line labelled in the right margin, ``lines`` = (GB/s, name) ascending; a label
    too close to the one below moves up, tied to its line by a thin stroke (the y axis is logarithmic)."""
    if not lines:
        return
    low, high = np.log10(ax.get_ylim())
    height_pt = ax.get_position().height * ax.get_figure().get_figheight() * 72
    gap = 1.5 * CEILING_FONT / height_pt  # a line of text, in fractions of the axes' height
    y = -np.inf
    for value, name in lines:
        y = max((np.log10(value) - low) / (high - low), y + gap)
        ax.annotate(f"{name} {value:.3g} GB/s", xy=(1, value), xycoords=("axes fraction", "data"), xytext=(1.03, y),
                    textcoords="axes fraction", fontsize=CEILING_FONT, va="center", color="#333",
                    arrowprops={"arrowstyle": "-", "color": "#999", "lw": 0.6, "shrinkA": 0, "shrinkB": 0})  # fmt: skip


def error_vs_tolerance(frame: pd.DataFrame) -> str | None:
    """tol_ratio (max error over the allowed error) per backend; the line at 1 is the tolerance."""
    if "tol_ratio" not in frame or (graded := frame[frame["status"].isin(GRADED)].dropna(subset=["tol_ratio"])).empty:
        return None
    backends = sorted(graded["backend"].unique())
    colors = backend_colors(backends)
    fig = figure(11, 3.2)
    ax = fig.subplots()
    rng = np.random.default_rng(0)
    for i, backend in enumerate(backends):
        values = graded.loc[graded["backend"] == backend, "tol_ratio"].clip(lower=1e-6)
        ax.scatter(i + rng.uniform(-0.18, 0.18, len(values)), values, s=12, color=colors[backend], alpha=0.8)
    ax.axhline(1.0, color="#b3261e", lw=1.2, ls="--")
    ax.annotate("tolerance", (len(backends) - 0.5, 1.0), fontsize=8, color="#b3261e", va="bottom", ha="right")
    ax.set_xticks(range(len(backends)), [literal(b) for b in backends], rotation=20, ha="right", fontsize=8)
    ax.set(yscale="log", ylabel="error / tolerance (tol_ratio)")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return to_data_uri(fig)


def scaling_fit(frame: pd.DataFrame, fits: pd.DataFrame | None) -> str | None:
    """Latency per backend with its fitted line fixed_us + per_unit_us * x, one log-log panel per (phase, x) of
    ``fits`` (:func:`harness.timing.scaling.fit_scaling`); a backend whose line was not kept shows its points only."""
    if fits is None or fits.empty or (timed := _timed(frame)).empty:
        return None
    timed = timed.assign(_phase=phase_of(timed))
    work = fits[fits["x"].isin(["bytes_moved", "flops"])]
    work = fits if work.empty else work
    panels = list(dict.fromkeys(zip(work["phase"], work["x"], strict=True)))
    colors = backend_colors(timed["backend"])
    fig = figure(5.5 * len(panels), 3.8)
    axes = np.atleast_1d(fig.subplots(1, len(panels)))
    for ax, (phase, x) in zip(axes, panels, strict=True):
        for fit in fits[(fits["x"] == x) & (fits["phase"] == phase)].itertuples():
            rows = timed[(timed["backend"] == fit.backend) & (timed["_phase"].eq(phase) | (phase == "all"))]
            rows = rows.dropna(subset=[x]) if x in rows else rows.iloc[0:0]
            rows = rows[(rows[x] > 0) & (rows["latency_us"] > 0)]  # a log axis has no zero
            if rows.empty:
                continue
            color = colors.get(fit.backend, "#333")
            unfitted = None if fit.fitted else f"{literal(fit.backend)} (no linear fit)"
            ax.plot(rows[x], rows["latency_us"], "o", ms=3.5, color=color, label=unfitted)
            if fit.fitted:
                grid = np.geomspace(rows[x].min(), rows[x].max(), 50)
                ax.plot(grid, fit.fixed_us + fit.per_unit_us * grid, "-", lw=1, color=color,
                        label=f"{literal(fit.backend)} (r²={fit.r2:.2f})")  # fmt: skip
        ax.set(xscale="log", yscale="log", xlabel=literal(f"{x} (log)"), ylabel="latency (µs, log)")
        ax.set_title(literal(f"{phase}: latency against {x}"), fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return to_data_uri(fig)


def trend(history: pd.DataFrame, value: str, ylabel: str, title: str, flag: str = "regressed") -> str | None:
    """One line per (case, backend) of ``value`` across runs (x: run order); rows where ``flag`` is set circled red."""
    data = history.dropna(subset=[value])
    if data.empty:
        return None
    runs = list(dict.fromkeys(data.sort_values("run_order")["run_label"]))
    colors = backend_colors(data["backend"])
    fig = figure(11, 3.8)
    ax = fig.subplots()
    for (_case, backend), rows in data.groupby(["case", "backend"]):
        rows = rows.sort_values("run_order")
        ax.plot(rows["run_order"], rows[value], "-o", ms=3, lw=1, alpha=0.7, color=colors[backend])
        bad = rows[rows[flag].astype(bool)] if flag in rows else rows.iloc[0:0]
        ax.plot(bad["run_order"], bad[value], "o", ms=9, mfc="none", mec="#b3261e", mew=1.5)
    for backend, color in colors.items():
        ax.plot([], [], "-", color=color, label=literal(backend))
    ax.set_xticks(range(len(runs)), [literal(r) for r in runs], rotation=20, ha="right", fontsize=7)
    ax.set(yscale="log", ylabel=ylabel)
    ax.set_title(literal(title), fontsize=10)
    ax.legend(fontsize=7, ncols=2)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return to_data_uri(fig)
