"""How each backend's latency scales: latency_us ~= fixed_us + per_unit_us * x by least squares over a run's
timed rows, kept (``fitted``) only where r2 >= MIN_R2 and neither term is negative."""

import numpy as np
import pandas as pd

# Per phase: the work that should drive the cost (bytes for decode, flops for prefill), then
# the KV tokens and the batch. Across cases of other head counts only the first fits well.
SCALING_AXES = {"decode": ("bytes_moved", "total_kv_tokens", "num_seqs"),
                "prefill": ("flops", "total_kv_tokens", "num_seqs"),
                "all": ("total_kv_tokens", "num_seqs")}  # fmt: skip
MIN_POINTS = 3
MIN_R2 = 0.9


def fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(slope, intercept, r2) of the least-squares line y = intercept + slope * x."""
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (intercept + slope * x)
    total = float(((y - y.mean()) ** 2).sum())
    return float(slope), float(intercept), (1.0 - float((residual**2).sum()) / total if total > 0 else 1.0)


def phase_of(frame: pd.DataFrame) -> pd.Series | str:
    """Each row's phase: "decode" where every q_len <= 1, else "prefill" ("all" without max_q_len)."""
    return frame["max_q_len"].le(1).map({True: "decode", False: "prefill"}) if "max_q_len" in frame else "all"


def fit_verdict(slope: float, intercept: float, r2: float) -> str:
    """Why a fitted line does not describe its rows ("" when it does): r2 below MIN_R2, or a negative term."""
    checks = ((not r2 >= MIN_R2, f"r² {r2:.2f} < {MIN_R2}"), (slope < 0, "negative per-unit cost"),
              (intercept < 0, "negative fixed cost"))  # fmt: skip
    return ", ".join(problem for failed, problem in checks if failed)


def fit_scaling(frame: pd.DataFrame, column: str = "latency_us") -> pd.DataFrame:
    """One row per (backend, phase, x) with at least MIN_POINTS distinct x among the timed rows: backend,
    phase, x, per_unit_us, fixed_us, r2, n, fitted, reason (NaN terms where not fitted)."""
    columns = ["backend", "phase", "x", "per_unit_us", "fixed_us", "r2", "n", "fitted", "reason"]
    rows = []
    if column not in frame or frame.empty:
        return pd.DataFrame(columns=columns)
    timed = frame.dropna(subset=[column])
    for (backend, part), group in timed.assign(phase=phase_of(timed)).groupby(["backend", "phase"], sort=True):
        for axis in SCALING_AXES[part]:
            if axis not in group:
                continue
            x = group[axis].to_numpy(dtype=np.float64)
            if len(np.unique(x)) < MIN_POINTS:
                continue
            slope, intercept, r2 = fit_line(x, group[column].to_numpy(dtype=np.float64))
            reason = fit_verdict(slope, intercept, r2)
            terms = (np.nan, np.nan) if reason else (slope, intercept)
            rows.append(dict(zip(columns, [backend, part, axis, *terms, r2, len(x), not reason, reason], strict=True)))
    return pd.DataFrame(rows, columns=columns)
