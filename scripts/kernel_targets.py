"""Score a GPU run against the kernel's speed targets, one line per case and target.

    python scripts/kernel_targets.py RUN_DIR [RUN_DIR ...] [--backend triton]

All from the run's results.parquet (passing rows), each target a ratio within one run:

    eager    decode: the default eager call against SDPA's, at most 1.10x
    decode   decode device time against the best peer's, at most 1.05x
    read     decode of 256 MB of KV or more, not MLA: at least 90% of the read ceiling (fp8: 85%)
    prefill  q_len >= 512: against the best peer's, at most 1.25x
    verify   q_len 2-8: against the same batch's decode, at most 1.30x
    cache    the engine path against the bare kernel, at most 1.10x
    fp8      decode over an fp8 cache against its twin in q's dtype, at most 0.60x
    mla      decode with K past 256 dims and 16+ q heads a KV head: at least 300 TFLOP/s

The 20 us host target is scripts/self/host_overhead.py's; here a row's cold host_us is only printed
against the peers'. A case's rows, and its twins, come from the first RUN_DIR that has it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.results.storage import load_run
from scripts.self.peer_table import peer_table

READ_TARGET_BYTES = 256 * 2**20
MLA_TARGET_FLOPS = 10**10  # an MLA decode at serving size (DeepSeek-V3's 32 x 1k-8k: 3.5e10), not a small test case
# A verify case's twin: the decode of the same batch; an fp8 case's: the same batch over a cache in q's dtype.
DECODE_TWIN = ["num_q_heads", "num_kv_heads", "head_dim", "num_seqs", "max_seq_len", "block_size", "dtype"]
CACHE_TWIN = [*DECODE_TWIN, "head_dim_v", "total_kv_tokens", "num_tokens", "flops"]


def _line(target: str, case: str, value: float, limit: float, unit: str, higher_is_better: bool = False) -> dict:
    met = value >= limit if higher_is_better else value <= limit
    return {"target": target, "case": case, "measured": value, "limit": limit, "unit": unit, "met": bool(met)}


def score(frame: pd.DataFrame, backend: str = "triton") -> pd.DataFrame:
    """One row per (target, case): measured, limit, met. ``frame``: one run's rows, or several with ``run``."""
    frame = frame if "run" in frame.columns else frame.assign(run=0)
    ok = frame[(frame["status"] == "pass") & frame["latency_us"].notna()]
    mine = ok[ok["backend"] == backend].set_index("case")
    peers = peer_table(frame, backend)  # empty for a run without peer rows (a variants run)
    against_peer = peers.set_index("case")["ratio"] if not peers.empty else pd.Series(dtype=float)
    sdpa_call = ok[ok["backend"] == "sdpa_contiguous"].set_index("case")["call_us"]
    cache = ok[ok["backend"] == "cache"].set_index("case")["latency_us"]
    decodes = mine["max_q_len"] == 1  # the candidates for a verify case's twin, then for an fp8 case's
    q_dtype_caches = mine["kv_dtype"].fillna("") == "" if "kv_dtype" in mine else None  # (no fp8 case without it)
    lines = []
    for case, row in mine.iterrows():
        decode = row["max_q_len"] == 1
        if decode and case in sdpa_call.index and pd.notna(row.get("call_us")):
            lines.append(_line("eager", case, row["call_us"] / sdpa_call[case], 1.10, "x SDPA call"))
        if decode and case in against_peer.index:
            lines.append(_line("decode", case, against_peer[case], 1.05, "x best peer"))
        fp8 = isinstance(row.get("kv_dtype"), str) and row["kv_dtype"].startswith("float8")
        mla = row["head_dim"] > 256 and row["num_q_heads"] >= 16 * row["num_kv_heads"]
        readable = decode and not mla and row["bytes_moved"] >= READ_TARGET_BYTES
        if readable and pd.notna(row.get("pct_of_ceiling")):
            limit = 85.0 if fp8 else 90.0
            lines.append(_line("read", case, row["pct_of_ceiling"], limit, "% read ceiling", higher_is_better=True))
        if decode and fp8 and (twin := _twin(mine, row, CACHE_TWIN, q_dtype_caches)) is not None:
            lines.append(_line("fp8", case, row["latency_us"] / mine.loc[twin, "latency_us"], 0.60, f"x {twin}"))
        if decode and mla and row["dtype"] in ("float16", "bfloat16") and row["flops"] >= MLA_TARGET_FLOPS:
            lines.append(_line("mla", case, row["tflops"], 300.0, "TFLOP/s", higher_is_better=True))
        if row["max_q_len"] >= 512 and case in against_peer.index:
            lines.append(_line("prefill", case, against_peer[case], 1.25, "x best peer"))
        if 2 <= row["max_q_len"] <= 8 and (twin := _twin(mine, row, DECODE_TWIN, decodes)) is not None:
            lines.append(_line("verify", case, row["latency_us"] / mine.loc[twin, "latency_us"], 1.30, f"x {twin}"))
        if case in cache.index:
            lines.append(_line("cache", case, cache[case] / row["latency_us"], 1.10, "x kernel"))
    return pd.DataFrame(lines)


def host_note(frame: pd.DataFrame, backend: str = "triton") -> str | None:
    """A line on ``backend``'s median host_us against its peers' on the same cases (None without the column)."""
    if "host_us" not in frame.columns:
        return None
    ok = frame[(frame["status"] == "pass") & frame["host_us"].notna()]
    mine = ok[ok["backend"] == backend]
    peers = ok[(ok["backend_kind"] == "peer") & ok["case"].isin(mine["case"])]
    if mine.empty or peers.empty:
        return None
    return (
        f"host_us (one call after the device drained, cold; not the 20 us hot-loop target): {backend} median "
        f"{mine['host_us'].median():.1f} us over {len(mine)} rows, its peers {peers['host_us'].median():.1f} us "
        f"over {len(peers)}"
    )


def _twin(mine: pd.DataFrame, row: pd.Series, same: list[str], among: pd.Series) -> str | None:
    """The first case of ``mine`` where ``among`` holds, equal to ``row`` on ``same`` and its run, or None."""
    twins = mine[among & (mine[[*same, "run"]] == row[[*same, "run"]]).all(axis=1)]
    return None if twins.empty else str(twins.index[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path, nargs="+")
    parser.add_argument("--backend", default="triton")
    args = parser.parse_args(argv)
    frames = []
    for index, run_dir in enumerate(args.run_dir):
        frame, meta = load_run(run_dir)
        frames.append(frame.assign(run=index))
        print(f"run {run_dir.name}: {meta.get('device_name')}, commit {meta.get('commit')}, backend {args.backend}")
    frame = pd.concat(frames, ignore_index=True)
    frame = frame[frame["run"] == frame.groupby("case")["run"].transform("min")]  # a case from its first run
    if (note := host_note(frame, args.backend)) is not None:
        print(note)
    table = score(frame, args.backend)
    if table.empty:
        print("(no row to score)")
        return 0
    for target, group in table.groupby("target", sort=False):
        met = int(group["met"].sum())
        worst = group["measured"].min() if target in ("read", "mla") else group["measured"].max()  # higher is better
        print(f"\n## {target}: met on {met} of {len(group)} cases (worst {worst:.3g} {group['unit'].iloc[0]})")
        for row in group.itertuples(index=False):
            mark = "ok  " if row.met else "MISS"
            print(f"  {mark} {row.case:40s} {row.measured:9.3g} {row.unit} (limit {row.limit:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
