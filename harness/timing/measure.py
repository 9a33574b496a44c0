"""Timing columns of one report row: what the kernel costs on the device and what a caller waits for.

``latency_us``   device time of the prepared call (graph replay where capturable, CUDA
                 events otherwise; perf_counter on the CPU), the median of its samples
``call_us``      the eager wall time of the call exactly as a user makes it (default
                 arguments, checks and all), device drained around it
``host_overhead_us`` call_us - latency_us on CUDA: what the call costs beyond its kernels
``host_us``      the host's own time of one eager call on CUDA: from the call to its return, the
                 device drained before it (median over the call_us samples; cold host caches, so
                 above a hot loop's per-call time, which scripts/host_overhead.py measures)
``graph_capturable`` / ``device_syncs``: can the default call be captured; how many syncs
``kernels_ran``  the device kernels of one prepared call of a peer, longest first (CUDA)
plus bandwidth and rate against the run's measured ceilings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.backends.registry import Backend, Prepared
from harness.cases.spec import Case
from harness.timing.ceilings import ceiling_columns
from harness.timing.metrics import flops, gbps, tflops
from harness.timing.phases import phase
from harness.timing.timer import Timing, kernels_launched, probe_call, time_call, time_wall

# A backend whose default call costs this much more than its kernel is flagged in the report.
CALL_OVERHEAD_FLAG = 1.5


@dataclass(frozen=True)
class TimingPlan:
    """How rows are timed: the device, the run's ceilings, the time budgets per row."""

    device: str
    ceilings: dict = field(default_factory=dict)  # harness.timing.ceilings.measure_ceilings
    latency_target_s: float = 0.25
    call_target_s: float = 0.15
    threads: int | None = None  # torch intra-op threads while timing (CPU); recorded per row


def _spread(prefix: str, timing: Timing) -> dict:
    return {
        f"{prefix}_us": timing.median_us,
        f"{prefix}_p10_us": timing.quantile(0.1),
        f"{prefix}_p90_us": timing.quantile(0.9),
        f"{prefix}_samples_us": [round(s, 3) for s in timing.samples_us],
    }


def timing_columns(case: Case, backend: Backend, prepared: Prepared, plan: TimingPlan, bytes_moved: int) -> dict:
    """Every timing column of one row (see the module docstring)."""
    device = plan.device
    with phase("timing: latency"):
        latency = time_call(prepared.run, device, graph=backend.graphable, target_s=plan.latency_target_s)
    row = {**_spread("latency", latency), "timing_reps": len(latency.samples_us)}
    row["timing_method"] = latency.method
    if prepared.call is None and torch.device(device).type == "cpu":
        call = latency  # on the CPU the same callable has the same wall time: no second measurement
    else:
        host: list[float] = []
        with phase("timing: call"):
            call = time_wall(prepared.call or prepared.run, device, target_s=plan.call_target_s, host_samples=host)
    row.update(_spread("call", call))
    if torch.device(device).type == "cuda":  # on a CPU all of it is host time: no split to report
        row["host_overhead_us"] = row["call_us"] - row["latency_us"]
        if host:
            row["host_us"] = Timing(tuple(host), "host_return").median_us
    with phase("timing: probe"):
        probe = probe_call(prepared.call or prepared.run, device)
    row["graph_capturable"] = probe.graph_capturable
    row["device_syncs"] = probe.device_syncs
    if backend.kind == "peer":  # which library kernel a peer got (the profiler costs a second or so a row)
        with phase("timing: profiler"):
            row["kernels_ran"] = kernels_launched(prepared.run, device)
    row["timing_threads"] = plan.threads if plan.threads is not None else torch.get_num_threads()
    row["gbps"] = gbps(bytes_moved, row["latency_us"])
    row["flops"] = flops(case)
    row["tflops"] = tflops(row["flops"], row["latency_us"])
    row.update(ceiling_columns({**row, "dtype": case.dtype, "max_q_len": max(case.q_lens)}, plan.ceilings))
    return row
