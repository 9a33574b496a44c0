"""Hand-built rows (seeded log-normal samples), run and partial folders, journals for the review and resume tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

BACKENDS = ("reference", "tlsim", "gather_sdpa")


def row(
    case: str, backend: str, median_us: float, rng: np.random.Generator, *, n: int = 20, spread: float = 0.05, **extra
) -> dict:
    samples = median_us * np.exp(rng.normal(0.0, spread, n))
    out = {
        "case": case, "backend": backend, "device": "cpu", "dtype": "float32", "num_q_heads": 8,
        "num_kv_heads": 2, "head_dim": 64, "block_size": 16, "num_seqs": 4, "max_seq_len": 512,
        "status": "pass", "reason": "", "max_abs_err": 2e-7, "max_rel_err": 1e-6, "rel_l2_err": 1e-7,
        "nan_count": 0, "atol": 1e-5, "rtol": 1e-4, "latency_us": float(np.median(samples)),
        "bytes_moved": 1_000_000, "total_kv_tokens": 1000, "tol_ratio": 0.02,
        "latency_p10_us": float(np.quantile(samples, 0.1)), "latency_p90_us": float(np.quantile(samples, 0.9)),
        "timing_reps": n, "timing_method": "cpu_perf_counter", "latency_samples_us": [float(x) for x in samples],
        "call_us": float(np.median(samples)) * 1.05,
    }  # fmt: skip
    out["gbps"] = out["bytes_moved"] / (out["latency_us"] * 1e3)
    out.update(extra)
    return out


def frame(num_cases: int = 10, seed: int = 0, slow: dict[str, float] | None = None, **kw) -> pd.DataFrame:
    """num_cases cases x BACKENDS; ``slow`` multiplies one backend's latency (a planted slowdown)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(num_cases):
        for j, backend in enumerate(BACKENDS):
            median = (100.0 + 37 * i) * (1 + j) * (slow or {}).get(backend, 1.0)
            rows.append(row(f"case{i:02d}", backend, median, rng, total_kv_tokens=1000 * (i + 1), **kw))
    return pd.DataFrame(rows)


def with_row(frame_: pd.DataFrame, case: str, backend: str, **values) -> pd.DataFrame:
    """A copy of ``frame_`` with ``values`` set on the row of ``case`` and ``backend``."""
    frame_ = frame_.copy()
    for column, value in values.items():
        frame_.loc[(frame_["case"] == case) & (frame_["backend"] == backend), column] = value
    return frame_


def meta(**extra) -> dict:
    return {"commit": "a" * 40, "dirty": False, "time": "2026-11-30T00:00:00+00:00", "device": "cpu",
            "device_name": "x86_64", "torch": "2.13.0", "triton": "3.9.0", "python": "3.11",
            "command": "python -m harness run cases/smoke.toml", "ceilings_gbps": {"cpu_copy": 12.5}, **extra}  # fmt: skip


def write(frame_: pd.DataFrame, meta_: dict, path: Path, *, page: bool = False) -> Path:
    """A run folder of ``frame_`` and ``meta_``; report.html only with ``page`` (its plots cost a second)."""
    from harness.results.report import render_html
    from harness.results.storage import write_run

    return write_run(frame_, meta_, Path(path), page=render_html if page else None)


def journal(out: Path, cases: Path, rows=(), **options) -> Path:
    """A stopped run's journal for ``out`` (``cases`` through tlsim, untimed, ``options`` over those); its path."""
    from harness.results.journal import Journal, journal_path

    stored = {"cases": [str(cases)], "backends": ["tlsim"], "device": "cpu", "plugins": [], "tags": None,
              "oracle_device": None, "timing": False, "isolate": "plugins", "timeout": 300.0, "workers": None,
              "ray": None, "shard": None, **options}  # fmt: skip
    written = Journal.create(out, stored)
    for row_ in rows:
        written._write(row_)
    written.close(stopped=True)
    return journal_path(out)


def partial(folder: Path, name: str, file: str = ".harness-partial") -> Path:
    """``folder/.{name}.partial-{pid}`` of a process that has exited, holding ``file`` (by default write_run's marker)."""
    import subprocess

    gone = subprocess.Popen(["true"])
    gone.wait()
    made = folder / f".{name}.partial-{gone.pid}"
    made.mkdir()
    (made / file).write_text(f"{gone.pid}\n")
    return made


def copy_run(run: Path, meta_patch: dict | None = None, frame_fn=None, to: Path | None = None) -> Path:
    """A copy of ``run`` at ``to``, meta.json updated by ``meta_patch``, rows through ``frame_fn``."""
    import shutil
    import tempfile

    copy = to or Path(tempfile.mkdtemp(prefix="run-copy-")) / "run"
    shutil.copytree(run, copy)
    if meta_patch is not None:
        meta_ = json.loads((copy / "meta.json").read_text())
        meta_.update(meta_patch)
        (copy / "meta.json").write_text(json.dumps(meta_))
    if frame_fn is not None:
        frame_fn(pd.read_parquet(copy / "results.parquet")).to_parquet(copy / "results.parquet")
    return copy
