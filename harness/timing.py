"""One timing entry point: :func:`time_call`. It returns raw samples; statistics come after.

Method, by device:

* CPU: ``time.perf_counter`` around each call, after one warm-up call; repeats until
  ``target_s`` of samples or ``max_reps`` (at least ``min_reps``).
* CUDA: three warm-up calls; then, for a backend declared graphable, one call captured in
  a CUDA graph and each replay timed (launch overhead out, as an engine's decode step
  sees it), otherwise CUDA events around each eager call. Before every sample a 256 MB
  buffer is zeroed so the KV does not sit in the 60 MB L2 from the last repeat. The
  repeat count is chosen from the first samples to fill about ``target_s``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Timing:
    samples_us: tuple[float, ...]
    method: str

    def quantile(self, q: float) -> float:
        return float(torch.tensor(self.samples_us, dtype=torch.float64).quantile(q))

    @property
    def median_us(self) -> float:
        return self.quantile(0.5)


def time_call(
    fn: Callable[[], object],
    device: str,
    *,
    graphable: bool = False,
    target_s: float = 0.2,
    min_reps: int = 3,
    max_reps: int = 100,
) -> Timing:
    """Time ``fn()`` on ``device``; see the module docstring for the method."""
    if torch.device(device).type == "cuda":
        return _time_cuda(fn, graphable, target_s, min_reps, max_reps)
    fn()
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < min_reps or (len(samples) < max_reps and time.perf_counter() - start < target_s):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return Timing(tuple(samples), "cpu_perf_counter")


def _try_graph(fn: Callable[[], object]) -> torch.cuda.CUDAGraph | None:
    """A graph of one call of fn, or None when fn cannot be captured (host syncs, allocations)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            fn()
    except RuntimeError:
        torch.cuda.synchronize()
        return None
    torch.cuda.current_stream().wait_stream(stream)
    return graph


def _time_cuda(fn, graphable: bool, target_s: float, min_reps: int, max_reps: int) -> Timing:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = _try_graph(fn) if graphable else None
    call = graph.replay if graph is not None else fn
    method = "cuda_graph_replay" if graph is not None else "cuda_events"
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")

    def sample(n: int) -> list[float]:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for start, end in events:
            flush.zero_()
            start.record()
            call()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) * 1e3 for start, end in events]

    samples = sample(min_reps)
    per_call_s = max(sorted(samples)[len(samples) // 2] * 1e-6, 1e-6)
    extra = min(max_reps, int(target_s / per_call_s)) - min_reps
    if extra > 0:
        samples += sample(extra)
    return Timing(tuple(samples), method)


def measure_copy_bandwidth(device: str, size_bytes: int = 1 << 30) -> float:
    """Device memory ceiling in GB/s: a large device-to-device copy, bytes read + written.

    CPU: 256 MB buffers (a smaller copy would fit in cache and read faster than memory).
    """
    if torch.device(device).type == "cpu":
        size_bytes = min(size_bytes, 256 * 2**20)
    src = torch.empty(size_bytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    timing = time_call(lambda: dst.copy_(src), device, target_s=0.3, min_reps=5)
    return 2 * size_bytes / (timing.median_us * 1e3)
