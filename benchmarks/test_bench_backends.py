"""pytest-benchmark suite, generated: one benchmark per (case, backend) that runs on the device.

Cases from ``--cases`` (default ``cases/smoke.toml``), timed by ``harness.timing.timer.time_call``;
``extra_info`` keeps the samples (``samples_us``, what ``nox -s bench`` compares: its docstring has the usage),
bytes, GB/s, the case."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.run.runner import case_columns, case_inputs
from harness.timing.metrics import gbps
from harness.timing.timer import time_call

ROOT = Path(__file__).resolve().parents[1]
MIN_SAMPLES = 10  # what the statistics of `nox -s bench` need per benchmark (at least 5)
CASE_FIELDS = ("dtype", "num_q_heads", "num_kv_heads", "head_dim", "block_size", "num_seqs", "max_seq_len",
               "num_tokens", "max_q_len", "total_kv_tokens", "layout", "bytes_moved")  # fmt: skip


def feed_samples(benchmark, samples_us: list[float]) -> None:
    """Record the harness's samples as the benchmark's rounds, through the fixture's stats as ``pedantic`` does."""
    benchmark._mode = "harness.timing.timer.time_call"
    stats = benchmark._make_stats(1)
    for sample in samples_us:
        stats.update(sample * 1e-6)


def test_bench(benchmark, harness_case, harness_backend, harness_session, request):
    case, backend, device = harness_case, harness_backend, harness_session.device
    if reason := backend.skip_reason(case, device):
        pytest.skip(reason)
    if backend.name == "triton" and torch.device(device).type == "cpu":
        pytest.skip("the Triton interpreter's speed says nothing about the kernel's")
    inputs = case_inputs(case, device)  # the runner's inputs, attention variants included
    out = inputs.new_out()
    prepared = backend.prepare(case, inputs, out)
    assert not prepared.to_packed(prepared.run()).isnan().any(), "a benchmarked call must produce a full output"
    timing = time_call(prepared.run, device, graph=backend.graphable, min_reps=MIN_SAMPLES)
    feed_samples(benchmark, list(timing.samples_us))
    columns = case_columns(case, device)
    benchmark.extra_info.update(
        case=case.id, backend=backend.name, device=device, timing_method=timing.method,
        samples_us=[round(s, 3) for s in timing.samples_us], median_us=timing.median_us,
        gbps=gbps(columns["bytes_moved"], timing.median_us), threads=torch.get_num_threads(),
        case_file=_relative(case.file), plugins=[_relative(p) for p in request.config.getoption("harness_plugins")],
        **{k: columns[k] for k in CASE_FIELDS},
    )  # fmt: skip


def _relative(path: str) -> str:
    """A case file inside the repository as a relative path, so another checkout finds its own copy."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)
