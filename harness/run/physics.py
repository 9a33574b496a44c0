"""Timings held to physics (KernelBench's excessive-speedup check, against the measured limits): a timed row
fails, its timing withdrawn, when its ``gbps`` passes ``READ_MARGIN`` x the read ceiling (on a CPU only for
cases of ``CPU_CACHE_FACTOR`` x the last-level cache), its ``tflops`` ``COMPUTE_MARGIN`` x the GPU's peak,
or (a worker's backend) its ``call_us`` is below a ``WALL_FACTOR``-th of a batch the driver timed."""

import functools
import math
import os
from pathlib import Path

READ_MARGIN = 1.1
COMPUTE_MARGIN = 1.1
CPU_CACHE_FACTOR = 4
WALL_FACTOR = 3.0
WALL_SLACK_S = 0.005
WITHDRAWN = ("latency_us", "latency_p10_us", "latency_p90_us", "latency_samples_us", "call_us", "call_p10_us",
             "call_p90_us", "call_samples_us", "host_overhead_us", "host_us", "gbps", "tflops", "pct_of_ceiling",
             "pct_of_peak")  # fmt: skip


@functools.cache
def last_level_cache_bytes() -> int:
    """This CPU's largest cache in bytes (64 MiB when the system does not say)."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    with_sysconf = os.sysconf("SC_LEVEL3_CACHE_SIZE") if "SC_LEVEL3_CACHE_SIZE" in os.sysconf_names else 0
    return max([*sizes, with_sysconf or 0]) or 64 << 20


def _number(value) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def impossible(row: dict, ceilings: dict, wall: tuple | None = None) -> str:
    """'' when the row's timing is within physics; else why not, in words."""
    gbps, tflops = _number(row.get("gbps")), _number(row.get("tflops"))
    read = _number(ceilings.get("read_gbps"))
    cuda = str(row.get("device", "")).startswith("cuda")
    big_enough = cuda or (row.get("bytes_moved") or 0) >= CPU_CACHE_FACTOR * last_level_cache_bytes()
    if gbps and read and big_enough and gbps > READ_MARGIN * read:
        return (f"{row['latency_us']:.3g} us reads {row['bytes_moved']:,} bytes at {gbps:.4g} GB/s, past "
                f"{READ_MARGIN:g}x the read ceiling measured in this run ({read:.4g} GB/s)")  # fmt: skip
    dtype = row.get("dtype")
    peaks = [_number((ceilings.get(key) or {}).get(dtype)) for key in ("matmul_tflops", "peak_tflops")]
    peak = max([p for p in peaks if p] or [0.0])
    if cuda and tflops and peak and tflops > COMPUTE_MARGIN * peak:
        return (f"{row['latency_us']:.3g} us for {row['flops']:,} flops is {tflops:.4g} TFLOP/s, past "
                f"{COMPUTE_MARGIN:g}x this GPU's matmul peak for {dtype} ({peak:.4g} TFLOP/s)")  # fmt: skip
    call_us = _number(row.get("call_us"))
    if not (wall and call_us and wall[0] > 0):
        return ""
    calls, wall_s, cpu_s, threads = wall  # a batch of calls back to back: what one took at the least
    least = max(0.0, wall_s - WALL_SLACK_S)
    if not cuda and cpu_s is not None:
        least = min(least, cpu_s / max(1, threads))
    if call_us * WALL_FACTOR < (per_call_us := least / calls * 1e6):
        return (f"call_us {call_us:.3g} us, but {calls} calls back to back took at least {per_call_us:.3g} us a "
                f"call by the driver's clock ({per_call_us / call_us:.1f}x more): the worker's clock is not to be "
                "trusted")  # fmt: skip
    return ""


def withdraw(row: dict) -> None:
    """Take back a row's timing columns; the claimed median stays in the note."""
    claimed = _number(row.get("latency_us"))
    for column in WITHDRAWN:
        row.pop(column, None)
    if claimed is not None:
        row["note"] = "; ".join(filter(None, [row.get("note"), f"claimed latency {claimed:.3g} us (not credited)"]))
