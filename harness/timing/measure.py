"""Timing columns of one report row (docs/contract.md): what the kernel costs on the device and what a
caller waits for, within ``ROW_BUDGET_S`` a row, keeping at least one sample of each measurement."""

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from harness.backends.registry import Backend, Prepared
from harness.cases.spec import Case
from harness.timing.ceilings import ceiling_columns
from harness.timing.metrics import bytes_moved, flops, gbps, tflops
from harness.timing.phases import phase
from harness.timing.timer import SampleHooks, Timing, kernels_launched, probe_call, time_call, time_wall

ROW_BUDGET_S = 3.0  # seconds of timing per row (a kernel's row uses about 1 s of it)
MODEL_BUDGET_S = 0.0  # a Python model (Backend.model) on a GPU: launch-bound Python, graded but not timed

LIMIT_FLOOR_S = 60.0
LIMIT_FACTOR = 10.0
CALLS_PER_ROW = 40  # graded call, warm-ups, graph capture, latency and call samples, probe
CPU_GBPS, CPU_TFLOPS = 0.05, 0.0005  # the interpreter / a Python model on a CPU, pessimistic
GPU_GBPS, GPU_TFLOPS = 500.0, 20.0  # a GPU whose ceilings were not measured (process-pool workers' own)


def row_time_limit(case: Case, device: str, ceilings: dict | None = None) -> float:
    """Default time limit (s) of a row of ``case``, graded call and timing, from its bytes and flops at ``ceilings``."""
    ceilings = ceilings or {}
    if torch.device(device).type == "cuda":
        read_gbps = ceilings.get("read_gbps") or GPU_GBPS
        peak = (ceilings.get("peak_tflops") or {}).get(case.dtype) or GPU_TFLOPS
    else:
        read_gbps, peak = CPU_GBPS, CPU_TFLOPS
    call_s = max(bytes_moved(case) / (read_gbps * 1e9), flops(case) / (peak * 1e12))
    return max(LIMIT_FLOOR_S, LIMIT_FACTOR * CALLS_PER_ROW * call_s + ROW_BUDGET_S)


@dataclass(frozen=True)
class TimingSettings:
    device: str
    ceilings: dict = field(default_factory=dict)  # harness.timing.ceilings.measure_ceilings
    latency_target_s: float = 0.25
    call_target_s: float = 0.15
    threads: int | None = None  # torch intra-op threads while timing (CPU); recorded per row
    budget_s: float | None = ROW_BUDGET_S  # of the row's whole timing; None: no budget

    def for_backend(self, backend: Backend) -> "TimingSettings":
        if backend.model and torch.device(self.device).type == "cuda" and self.budget_s is not None:
            return dataclasses.replace(self, budget_s=min(self.budget_s, MODEL_BUDGET_S))
        return self


def _spread(prefix: str, timing: Timing) -> dict:
    return {f"{prefix}_us": timing.median_us, f"{prefix}_p10_us": timing.quantile(0.1),
            f"{prefix}_p90_us": timing.quantile(0.9), f"{prefix}_samples_us": [round(s, 3) for s in timing.samples_us]}  # fmt: skip


def timing_columns(case: Case, backend: Backend, prepared: Prepared, settings: TimingSettings,
                   hooks: Callable[[str], SampleHooks] | None = None) -> dict:  # fmt: skip
    """Every timing column of one row; ``hooks(what)``: the sample hooks of its "latency" and "call" measurements."""
    device = settings.device
    hooks = hooks or (lambda what: None)
    deadline = None if settings.budget_s is None else time.monotonic() + settings.budget_s
    with phase("timing: latency"):
        latency = time_call(prepared.run, device, graph=backend.graphable, target_s=settings.latency_target_s,
                            deadline=deadline, hooks=hooks("latency"))  # fmt: skip
    row = {**_spread("latency", latency), "timing_reps": len(latency.samples_us), "timing_method": latency.method}
    if prepared.call is None and torch.device(device).type == "cpu":
        call = latency  # on the CPU the same callable has the same wall time: no second measurement
    else:
        host: list[float] = []
        with phase("timing: call"):
            call = time_wall(prepared.call or prepared.run, device, target_s=settings.call_target_s, host_samples=host,
                             deadline=deadline, hooks=hooks("call"))  # fmt: skip
    row.update(_spread("call", call))
    if torch.device(device).type == "cuda":  # on a CPU all of it is host time: no split to report
        row["host_overhead_us"] = row["call_us"] - row["latency_us"]
        if host:
            row["host_us"] = Timing(tuple(host), "host_return").median_us
    spent = deadline is not None and time.monotonic() >= deadline
    if not spent:  # past the budget the probe (two or three more calls) and the profiler are left out
        with phase("timing: probe"):
            probe = probe_call(prepared.call or prepared.run, device)
        row["graph_capturable"], row["device_syncs"] = probe.graph_capturable, probe.device_syncs
        if backend.kind == "peer":  # which library kernel a peer got (the profiler costs ~1 s a row)
            with phase("timing: profiler"):
                row["kernels_ran"] = kernels_launched(prepared.run, device)
    if latency.cut_short or call.cut_short or spent:
        row["timing_note"] = (f"timed within a {settings.budget_s:g} s budget: {len(latency.samples_us)} samples"
                              + ("" if call is latency else f", {len(call.samples_us)} call samples")
                              + ("; no graph/sync probe" if spent else ""))  # fmt: skip
    if prepared.plan_us is not None:
        row["plan_us"] = prepared.plan_us
    row["timing_threads"] = settings.threads if settings.threads is not None else torch.get_num_threads()
    row["gbps"] = gbps(bytes_moved(case), row["latency_us"])
    row["flops"] = flops(case)
    row["tflops"] = tflops(row["flops"], row["latency_us"])
    row.update(ceiling_columns({**row, "dtype": case.dtype, "max_q_len": max(case.q_lens)}, settings.ceilings))
    return row
