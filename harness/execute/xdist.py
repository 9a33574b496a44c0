"""pytest -n N (pytest-xdist): one GPU per worker; with ``--harness-report DIR`` each worker writes its rows to
``<folder>/<gwI>.jsonl`` and the controller writes one run folder from them, in test order."""

import json
import os
import shutil
import socket
import tempfile
from pathlib import Path

import pytest
import torch

from harness.execute.workers import visible_gpus
from harness.results.journal import plain_row
from harness.results.report import write_page
from harness.timing.ceilings import GpuLedger, mixed_models_note

ROWS_DIR = "harness_rows_dir"  # key in a worker's workerinput
_FOLDER_KEY = pytest.StashKey[str]()


def pin_gpus(config: pytest.Config, specs) -> None:
    if not (_run_device(config).startswith("cuda") and (gpus := visible_gpus())):
        return
    for index, spec in enumerate(specs):
        spec.env.setdefault("CUDA_VISIBLE_DEVICES", gpus[index % len(gpus)])


def _run_device(config: pytest.Config) -> str:
    return config.getoption("harness_device", None) or ("cuda" if torch.cuda.is_available() else "cpu")


def hand_rows_folder(node) -> None:
    """Controller side: tell a worker where to leave its rows (only with --harness-report)."""
    config = node.config
    if config.getoption("harness_report", None) is None:
        return
    if _FOLDER_KEY not in config.stash:
        config.stash[_FOLDER_KEY] = tempfile.mkdtemp(prefix="harness-xdist-rows-")
    node.workerinput[ROWS_DIR] = config.stash[_FOLDER_KEY]


def save_worker_rows(config: pytest.Config, rows: list[dict]) -> Path:
    """Worker side: this worker's rows, labelled, to ``<folder>/<gwI>.jsonl`` atomically."""
    worker = config.workerinput.get("workerid", str(os.getpid()))
    labels = {"host": socket.gethostname(), "gpu_index": os.environ.get("CUDA_VISIBLE_DEVICES", ""), "worker": worker}
    if _run_device(config).startswith("cuda") and (name := torch.cuda.get_device_name(0)):  # it sees one GPU
        labels["gpu_name"] = name
    lines = [json.dumps(plain_row({**row, **labels}), allow_nan=True, default=str) + "\n" for row in rows]
    return write_page(Path(config.workerinput[ROWS_DIR]) / f"{worker}.jsonl", "".join(lines))


def collect_rows(config: pytest.Config) -> list[dict] | None:
    """Controller side: every worker's rows; None unless this is an xdist run with a report."""
    if _FOLDER_KEY not in config.stash:
        return None
    folder = Path(config.stash[_FOLDER_KEY])
    rows: list[dict] = []
    for path in sorted(folder.glob("*.jsonl")):
        rows.extend(json.loads(line) for line in path.read_text().splitlines() if line)
    shutil.rmtree(folder, ignore_errors=True)
    return rows


def run_gpus(rows: list[dict]) -> tuple[list[dict], str]:
    """meta.json's ``gpus`` of a pytest -n run (no ceilings: pytest measures none) and the mixed-models note."""
    ledger = GpuLedger()
    for row in rows:
        ledger.add(row["host"], row["gpu_index"], row["worker"], {"gpu_name": row.get("gpu_name"), "ceilings": {}})
    return ledger.to_meta(), mixed_models_note(ledger.to_meta())
