"""Compare two runs: which (case, backend) rows got worse, and by how much.

A row regresses when its status worsened (pass -> fail/error), its max abs error grew
more than ``error_factor`` times (and past a tenth of its atol, so noise near zero does
not count), or its median latency grew more than ``latency_threshold`` (relative) and
the new p10 is above the old p90 (the spreads do not overlap, so it is not noise).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

_RANK = {"pass": 0, "skip": 0, "fail": 1, "error": 2}


@dataclass(frozen=True)
class Comparison:
    rows: pd.DataFrame  # one row per (case, backend) present in both runs
    regressions: pd.DataFrame  # the subset that got worse, with a 'why' column

    @property
    def ok(self) -> bool:
        return self.regressions.empty


def compare_runs(
    base: pd.DataFrame, new: pd.DataFrame, *, latency_threshold: float = 0.10, error_factor: float = 2.0
) -> Comparison:
    keep = ["case", "backend", "status", "max_abs_err", "atol", "latency_us", "latency_p10_us", "latency_p90_us"]
    merged = base[keep].merge(new[keep], on=["case", "backend"], suffixes=("_base", "_new"))
    whys = []
    for _, r in merged.iterrows():
        why = []
        if _RANK.get(r["status_new"], 2) > _RANK.get(r["status_base"], 2):
            why.append(f"status {r['status_base']} -> {r['status_new']}")
        eb, en = r["max_abs_err_base"], r["max_abs_err_new"]
        if pd.notna(eb) and pd.notna(en) and en > error_factor * eb and en > r["atol_new"] / 10:
            why.append(f"max abs err {eb:.2e} -> {en:.2e}")
        lb, ln = r["latency_us_base"], r["latency_us_new"]
        if pd.notna(lb) and pd.notna(ln) and ln > lb * (1 + latency_threshold):
            spread_ok = pd.isna(r["latency_p90_us_base"]) or r["latency_p10_us_new"] > r["latency_p90_us_base"]
            if spread_ok:
                why.append(f"latency {lb:.1f} -> {ln:.1f} us (+{100 * (ln / lb - 1):.0f}%)")
        whys.append("; ".join(why))
    merged["why"] = whys
    return Comparison(rows=merged, regressions=merged[merged["why"] != ""].reset_index(drop=True))


def format_comparison(comparison: Comparison, base_name: str, new_name: str) -> str:
    rows = comparison.rows
    lines = [f"compared {len(rows)} (case, backend) rows: {base_name} -> {new_name}"]
    timed = rows.dropna(subset=["latency_us_base", "latency_us_new"])
    if not timed.empty:
        ratio = (timed["latency_us_new"] / timed["latency_us_base"]).groupby(timed["backend"]).median()
        lines.append("median latency ratio new/base by backend: " + ", ".join(f"{b} {v:.3f}" for b, v in ratio.items()))
    if comparison.ok:
        lines.append("no regressions")
    else:
        lines.append(f"{len(comparison.regressions)} regression(s):")
        lines.extend(f"  {r['backend']} on {r['case']}: {r['why']}" for _, r in comparison.regressions.iterrows())
    return "\n".join(lines)
