"""Print a run's speed table in Markdown: each backend against the best peer of each case.

    python scripts/self/peer_table.py RUN_DIR [--backend triton] [--backend cache]

Per case: the backend's latency_us and call_us, the fastest peer's latency and name, their ratio
(above 1: the peer is faster), and for prefill TFLOP/s and % of peak; all from results.parquet."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.results.storage import load_run


def peer_table(frame: pd.DataFrame, backend: str) -> pd.DataFrame:
    """One row per case the backend passed: its times, the best peer's, and the ratio."""
    graded = frame[frame["status"] == "pass"].dropna(subset=["latency_us"])
    peers = graded[graded["backend_kind"] == "peer"]
    best = peers.loc[peers.groupby("case")["latency_us"].idxmin(), ["case", "backend", "latency_us"]]
    mine = graded[graded["backend"] == backend].merge(best, on="case", suffixes=("", "_peer"))
    if mine.empty:  # no case with a peer: nor any column to read
        return pd.DataFrame()
    return pd.DataFrame({
        "case": mine["case"], f"{backend} us": mine["latency_us"], f"{backend} call us": mine["call_us"],
        "best peer": mine["backend_peer"], "peer us": mine["latency_us_peer"],
        "ratio": mine["latency_us"] / mine["latency_us_peer"], "% read ceiling": mine["pct_of_ceiling"],
        "TFLOP/s": mine["tflops"].where(mine["max_q_len"] > 1), "% peak": mine["pct_of_peak"],
    })  # fmt: skip


def to_markdown(table: pd.DataFrame) -> str:
    """A Markdown table, floats to three significant digits, NaN blank (no tabulate needed)."""
    cells = table.map(lambda v: ("" if pd.isna(v) else f"{v:.3g}") if isinstance(v, float) else str(v))
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells.itertuples(index=False)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--backend", action="append", help="backends to state (default: triton)")
    args = parser.parse_args(argv)
    frame, meta = load_run(args.run_dir)
    print(f"run {args.run_dir.name}: {meta.get('device_name')}, torch {meta.get('torch')}, triton {meta.get('triton')}")
    for backend in args.backend or ["triton"]:
        table = peer_table(frame, backend)
        print(f"\n{backend} against the best peer ({len(table)} cases)\n")
        print(to_markdown(table) if not table.empty else "(no case with a peer)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
