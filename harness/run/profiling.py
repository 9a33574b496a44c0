"""``--profile CASE[:BACKEND]`` (globs; no backend: every one): a trace of a row's calls, saved beside the run."""

from __future__ import annotations

import fnmatch
import re
import sys
from pathlib import Path

import torch

from harness.backends.registry import Backend, Unsupported
from harness.cases.spec import Case
from harness.run.runner import build_context

CALLS_PER_TRACE = 3


def parse_spec(spec: str) -> tuple[str, str]:
    """'CASE[:BACKEND]' -> (case glob, backend glob)."""
    case, _, backend = spec.partition(":")
    if not case:
        raise ValueError(f"--profile {spec!r}: give CASE or CASE:BACKEND (globs allowed)")
    return case, backend or "*"


def selected(cases: list[Case], backends: list[Backend], specs: list[str]) -> list[tuple[Case, Backend]]:
    """Every (case, backend) pair some spec matches; ValueError naming a spec that matches nothing."""
    pairs: list[tuple[Case, Backend]] = []
    for spec in specs:
        case_glob, backend_glob = parse_spec(spec)
        found = [
            (c, b)
            for c in cases
            for b in backends
            if fnmatch.fnmatch(c.id, case_glob) and fnmatch.fnmatch(b.name, backend_glob)
        ]
        if not found:
            raise ValueError(f"--profile {spec!r}: matches no (case, backend) of this run")
        pairs.extend(p for p in found if p not in pairs)
    return pairs


def trace_name(case: Case, backend: Backend) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", f"{case.id}__{backend.name}") + ".trace.json"


def profile_pairs(pairs: list[tuple[Case, Backend]], device: str, oracle_device: str, folder: Path) -> list[Path]:
    """Write one Chrome trace per pair into ``folder``; returns the paths written (skips say why on stderr)."""
    from torch.profiler import ProfilerActivity, profile

    folder.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.device(device).type == "cuda" else [])
    written = []
    for case, backend in pairs:
        if reason := backend.skip_reason(case, device):
            print(f"profile: {case.id}:{backend.name} skipped: {reason}", file=sys.stderr)
            continue
        ctx = build_context(case, device, oracle_device)
        try:
            prepared = backend.prepare(case, ctx.inputs, ctx.inputs.new_out())
        except Unsupported as refusal:
            print(f"profile: {case.id}:{backend.name} skipped: {refusal}", file=sys.stderr)
            continue
        for fn in filter(None, (prepared.run, prepared.call)):
            fn()  # warm-up: compilation and caches stay out of the trace
        with profile(activities=activities, record_shapes=True) as prof:
            for label, fn in (("run", prepared.run), ("call", prepared.call)):
                if fn is None:
                    continue
                for i in range(CALLS_PER_TRACE):
                    with torch.profiler.record_function(f"{backend.name}.{label}[{i}]"):
                        fn()
                if torch.device(device).type == "cuda":
                    torch.cuda.synchronize()
        path = folder / trace_name(case, backend)
        prof.export_chrome_trace(str(path))
        written.append(path)
    return written
