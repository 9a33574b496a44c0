"""The one timing entry point: :func:`time_call`, the device time of a prepared call (``latency_us``), and
:func:`time_wall`, what a caller waits for (``call_us``). Both return raw samples (us): at least
``min_reps``, then more until ``target_s``, ``max_reps`` or ``deadline``; ``hooks`` run around each sample
outside the timed region, then around a ``final`` one. The clocks are bound at import, before any plugin."""

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter as _clock
from types import SimpleNamespace
from typing import Protocol

import torch

# The CUDA event's own methods (the C++ base class; a stand-in without methods in a CPU build of torch).
_EVENT_BASE = torch.cuda.Event.__mro__[1]
_record = getattr(_EVENT_BASE, "record", torch.cuda.Event.record)
_elapsed_ms = getattr(_EVENT_BASE, "elapsed_time", torch.cuda.Event.elapsed_time)
_current_stream = torch.cuda.current_stream

L2_FLUSH_BYTES = 256 * 2**20
DEFAULT_MIN_REPS = {"cpu": 10, "cuda": 20}
WALL_MIN_REPS = 10  # call_us: each sample drains the device, so fewer suffice
DEFAULT_MAX_REPS = {"cpu": 200, "cuda": 400}


@dataclass(frozen=True)
class Timing:
    """Raw samples of one measurement, in microseconds, and the method that took them."""

    samples_us: tuple[float, ...]
    method: str
    cut_short: bool = False  # fewer samples than wanted: the deadline passed

    def quantile(self, q: float) -> float:
        return float(torch.tensor(self.samples_us, dtype=torch.float64).quantile(q))

    @property
    def median_us(self) -> float:
        return self.quantile(0.5)


class SampleHooks(Protocol):
    """Called around every timed sample, outside the timed region (see the module docstring)."""

    def before(self, final: bool) -> None: ...

    def after(self, result: object, final: bool) -> None: ...


_NO_HOOKS = SimpleNamespace(before=lambda final: None, after=lambda result, final: None)


def _is_cuda(device: str | torch.device) -> bool:
    return torch.device(device).type == "cuda"


def _collect(sample: Callable, target_s: float, min_reps: int, max_reps: int, deadline: float | None, final: bool,
             method: str) -> Timing:  # fmt: skip
    """min_reps samples, then more to fill about target_s up to max_reps (``cut_short``: the deadline stopped
    them), then with ``final`` one ``sample(1, final=True)``. With a deadline they come in batches that fit the
    time left, at least one."""
    samples, cut = sample(1 if deadline is not None else min_reps), False
    while True:
        per_call_s = max(sorted(samples)[len(samples) // 2] * 1e-6, 1e-7)
        wanted = max(min_reps, min(max_reps, int(target_s / per_call_s)))
        if len(samples) >= wanted:
            break
        if deadline is None:
            samples += sample(wanted - len(samples))
            break
        if (fit := int((deadline - time.monotonic()) / per_call_s)) < 1:
            cut = True
            break
        samples += sample(min(wanted - len(samples), max(1, fit // 2)))
    return Timing(tuple(samples + (sample(1, final=True) if final else [])), method, cut)


def _warm_up(fn: Callable[[], object], calls: int, deadline: float | None) -> None:
    for i in range(calls):
        if i and deadline is not None and time.monotonic() >= deadline:
            return
        fn()


def _reps(device: str, min_reps: int | None, max_reps: int | None) -> tuple[int, int]:
    kind = "cuda" if _is_cuda(device) else "cpu"
    low = DEFAULT_MIN_REPS[kind] if min_reps is None else min_reps
    return low, max(low, DEFAULT_MAX_REPS[kind] if max_reps is None else max_reps)


def time_call(fn: Callable[[], object], device: str, *, graph: bool = True, target_s: float = 0.25,
              min_reps: int | None = None, max_reps: int | None = None, deadline: float | None = None,
              hooks: SampleHooks | None = None) -> Timing:  # fmt: skip
    """Device time of ``fn()`` on ``device``: ``perf_counter`` on the CPU (``cpu_perf_counter``); on CUDA graph
    replays (``cuda_graph_replay``; ``graph=False`` forbids them) or events (``cuda_events``), L2 flushed before
    every sample. ``hooks``: called around every sample, plus one more with ``final=True``."""
    min_reps, max_reps = _reps(device, min_reps, max_reps)
    given, hooks = hooks is not None, hooks or _NO_HOOKS
    if not _is_cuda(device):
        fn()
        return _collect(_host_clock(fn, hooks), target_s, min_reps, max_reps, deadline, given, "cpu_perf_counter")
    _warm_up(fn, 3, deadline)
    torch.cuda.synchronize()
    captured = _capture(fn) if graph and (deadline is None or time.monotonic() < deadline) else None
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device)

    def sample(n: int, final: bool = False) -> list[float]:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for start, end in events:
            hooks.before(final)
            flush.zero_()
            stream = _current_stream()
            _record(start, stream)
            result = fn() if captured is None else captured[0].replay()
            _record(end, stream)
            hooks.after(result if captured is None else captured[1], final)
        torch.cuda.synchronize()  # device-wide: work left on another stream is done before the times are read
        return [_elapsed_ms(start, end) * 1e3 for start, end in events]

    method = "cuda_graph_replay" if captured is not None else "cuda_events"
    return _collect(sample, target_s, min_reps, max_reps, deadline, given, method)


def time_wall(fn: Callable[[], object], device: str, *, target_s: float = 0.15, min_reps: int | None = None,
              max_reps: int | None = None, host_samples: list[float] | None = None, deadline: float | None = None,
              hooks: SampleHooks | None = None) -> Timing:  # fmt: skip
    """Wall time a caller waits for one eager ``fn()``, host overhead and device syncs included.
    ``host_samples`` receives (CUDA only) each sample's host time before the drain (``host_us``)."""
    min_reps, max_reps = _reps(device, WALL_MIN_REPS if min_reps is None else min_reps, max_reps)
    given, hooks = hooks is not None, hooks or _NO_HOOKS
    if not _is_cuda(device):  # no device to drain: the host clock around the call, as time_call takes it
        fn()
        return _collect(_host_clock(fn, hooks), target_s, min_reps, max_reps, deadline, given, "cpu_perf_counter")
    _warm_up(fn, 3, deadline)
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device)
    sample = _host_clock(fn, hooks, flush, host_samples)
    return _collect(sample, target_s, min_reps, max_reps, deadline, given, "wall_synchronized")


def _host_clock(fn: Callable, hooks: SampleHooks, flush: torch.Tensor | None = None, host_samples: list | None = None):
    """``sample(n, final=False)``: n host-clock times (us) of ``fn()``, the hooks around each. With ``flush`` (CUDA),
    L2 is flushed and the device drained before each call and drained after it; ``host_samples`` receives each
    call's time until it returned."""

    def sample(n: int, final: bool = False) -> list[float]:
        out = []
        for _ in range(n):
            hooks.before(final)
            if flush is not None:
                flush.zero_()
                torch.cuda.synchronize()
            t0 = _clock()
            result = fn()
            end = returned = _clock()
            if flush is not None:
                torch.cuda.synchronize()
                end = _clock()
            out.append((end - t0) * 1e6)
            hooks.after(result, final)
            if host_samples is not None:
                host_samples.append((returned - t0) * 1e6)
        return out

    return sample


def _capture(fn: Callable[[], object]) -> tuple[torch.cuda.CUDAGraph, object] | None:
    """(graph, its static output) of one captured call of ``fn``, or None when it cannot be captured (host syncs)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    try:
        with warnings.catch_warnings():  # a failed capture also warns that the graph is empty
            warnings.simplefilter("ignore")
            with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
                result = fn()
    except RuntimeError:
        torch.cuda.synchronize()
        # torch ends the device generator's capture only when the capture itself ends well: left as it is, every
        # later CUDA RNG call of the process (another backend's, the next case's) raises. A copy of its state
        # (seed and offset, not the capture) takes its place.
        generator = torch.cuda.default_generators[torch.cuda.current_device()]
        generator.graphsafe_set_state(generator.clone_state())
        return None
    torch.cuda.current_stream().wait_stream(stream)
    return graph, result


@dataclass(frozen=True)
class CallProbe:
    """What one eager call does besides computing: can it be graph-captured, how many syncs."""

    graph_capturable: bool | None  # None off CUDA
    device_syncs: int | None  # None off CUDA


def probe_call(fn: Callable[[], object], device: str) -> CallProbe:
    """Count the device syncs of one call of ``fn`` (``set_sync_debug_mode("warn")``); try to graph-capture it."""
    if not _is_cuda(device):
        return CallProbe(None, None)
    fn()
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    torch.cuda.synchronize()
    return CallProbe(_capture(fn) is not None, syncs)


def kernels_launched(fn: Callable[[], object], device: str, top: int = 3) -> str:
    """The device kernels one call of ``fn`` runs, longest first: ``name (share%); ...`` (empty off CUDA)."""
    if not _is_cuda(device):
        return ""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        device_time = event.device_time if hasattr(event, "device_time") else event.cuda_time
        if device_time > 0:
            totals[event.name] = totals.get(event.name, 0.0) + device_time
    whole = sum(totals.values()) or 1.0
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])[:top]
    return "; ".join(f"{name[:60]} ({100 * t / whole:.0f}%)" for name, t in ranked)
