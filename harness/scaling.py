"""How each backend's latency scales: a straight-line fit per backend over a run's timed rows.

latency_us ~= fixed_us + per_unit_us * x, fitted by least squares for x = total_kv_tokens
(the per-token cost of reading the cache) and for x = num_seqs (the per-sequence cost).
``fixed_us`` is the cost of a call that moves nothing: launch and host overhead. ``r2``
says how much of the spread the line explains; cases of other head counts or dtypes sit
off the line, so read a low r2 as "other things than x matter here", not as noise.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

SCALING_AXES = ("total_kv_tokens", "num_seqs")
MIN_POINTS = 3


def fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(slope, intercept, r2) of the least-squares line y = intercept + slope * x."""
    design = np.stack([x, np.ones_like(x)], axis=1)
    (slope, intercept), *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = y - (intercept + slope * x)
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((residual**2).sum()) / total if total > 0 else 1.0
    return float(slope), float(intercept), r2


def fit_scaling(frame: pd.DataFrame, column: str = "latency_us") -> pd.DataFrame:
    """One row per (backend, x) with at least MIN_POINTS distinct x among the timed rows.

    Columns: backend, x, per_unit_us, fixed_us, r2, n.
    """
    rows = []
    if column not in frame or frame.empty:
        return pd.DataFrame(columns=["backend", "x", "per_unit_us", "fixed_us", "r2", "n"])
    timed = frame.dropna(subset=[column])
    for backend, group in timed.groupby("backend", sort=True):
        for axis in SCALING_AXES:
            x = group[axis].to_numpy(dtype=np.float64)
            if len(np.unique(x)) < MIN_POINTS:
                continue
            slope, intercept, r2 = fit_line(x, group[column].to_numpy(dtype=np.float64))
            rows.append(
                {"backend": backend, "x": axis, "per_unit_us": slope, "fixed_us": intercept, "r2": r2, "n": len(x)}
            )
    return pd.DataFrame(rows, columns=["backend", "x", "per_unit_us", "fixed_us", "r2", "n"])


def format_scaling(fits: pd.DataFrame) -> str:
    """The fits as text lines: 'triton: 0.012 us per total_kv_tokens + 14.1 us fixed (r2 0.98, 12 rows)'."""
    return "\n".join(
        f"{r.backend}: {r.per_unit_us:.4g} us per {r.x} + {r.fixed_us:.4g} us fixed (r2 {r.r2:.2f}, {r.n} rows)"
        for r in fits.itertuples()
    )
