"""``--profile CASE[:BACKEND]`` (globs; no backend: every one): a trace of a row's calls, saved beside the run."""

import fnmatch
import re
import sys
from pathlib import Path

import torch

from harness.backends.registry import Backend, Unsupported
from harness.cases.spec import Case
from harness.run.runner import build_context

CALLS_PER_TRACE = 3


def selected(cases: list[Case], backends: list[Backend], specs: list[str]) -> list[tuple[Case, Backend]]:
    """Every (case, backend) pair some 'CASE[:BACKEND]' spec matches; ValueError naming a spec that matches nothing."""
    pairs: list[tuple[Case, Backend]] = []
    for spec in specs:
        case_glob, _, backend_glob = spec.partition(":")
        if not case_glob:
            raise ValueError(f"--profile {spec!r}: give CASE or CASE:BACKEND (globs allowed)")
        found = [(c, b) for c in cases if fnmatch.fnmatch(c.id, case_glob)
                 for b in backends if fnmatch.fnmatch(b.name, backend_glob or "*")]  # fmt: skip
        if not found:
            raise ValueError(f"--profile {spec!r}: matches no (case, backend) of this run")
        pairs.extend(p for p in found if p not in pairs)
    return pairs


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
        calls = [(label, fn) for label, fn in (("run", prepared.run), ("call", prepared.call)) if fn is not None]
        for _, fn in calls:
            fn()  # warm-up: compilation and caches stay out of the trace
        with profile(activities=activities, record_shapes=True) as prof:
            for label, fn in calls:
                for i in range(CALLS_PER_TRACE):
                    with torch.profiler.record_function(f"{backend.name}.{label}[{i}]"):
                        fn()
                if torch.device(device).type == "cuda":
                    torch.cuda.synchronize()
        path = folder / (re.sub(r"[^A-Za-z0-9_.=-]+", "_", f"{case.id}__{backend.name}") + ".trace.json")
        prof.export_chrome_trace(str(path))
        written.append(path)
    return written
