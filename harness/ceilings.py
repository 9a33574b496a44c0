"""The device's ceilings, measured at the start of a run: what "fast" is measured against.

* read bandwidth  -- a large reduction reads every byte once and writes nothing: the floor
  of a decode kernel, which only reads its KV. ``pct_of_ceiling`` is against this.
* copy bandwidth  -- a large device-to-device copy, bytes read plus bytes written.
* matmul rate     -- a large matrix product in the dtype, measured; beside it the dense
  datasheet peak where the device is known (``peak_tflops`` and its ``peak_source``),
  since a prefill kernel is judged against what the chip can do, not against one library.

All through :mod:`harness.timing`, so the ceilings and the rows share one timer.
"""

from __future__ import annotations

import torch

from .timing import time_call

# Dense (no sparsity) tensor-core peaks from NVIDIA's datasheets, TFLOP/s, by dtype.
# H100 and H200 SXM share the compute die; the H200 has more and faster memory only.
DATASHEET_PEAK_TFLOPS = {
    "H200": {"bfloat16": 989.4, "float16": 989.4, "float32": 66.9},
    "H100 80GB HBM3": {"bfloat16": 989.4, "float16": 989.4, "float32": 66.9},
    "A100": {"bfloat16": 312.0, "float16": 312.0, "float32": 19.5},
}
DATASHEET_SOURCE = "NVIDIA datasheet, SXM, dense (float32: non-tensor-core FP32)"


def _buffer_bytes(device: str, size_bytes: int) -> int:
    # CPU: 256 MB, large enough to leave the caches, small enough for a laptop.
    return min(size_bytes, 256 * 2**20) if torch.device(device).type == "cpu" else size_bytes


def measure_copy_bandwidth(device: str, size_bytes: int = 1 << 30) -> float:
    """GB/s of a device-to-device copy, counting bytes read + bytes written."""
    size_bytes = _buffer_bytes(device, size_bytes)
    src = torch.empty(size_bytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    timing = time_call(lambda: dst.copy_(src), device, graph=False, target_s=0.3, min_reps=5)
    return 2 * size_bytes / (timing.median_us * 1e3)


def measure_read_bandwidth(device: str, size_bytes: int = 1 << 30) -> float:
    """GB/s of a reduction over a large float32 buffer: every byte read once, nothing written."""
    size_bytes = _buffer_bytes(device, size_bytes)
    src = torch.rand(size_bytes // 4, dtype=torch.float32, device=device)
    result = torch.empty((), dtype=torch.float32, device=device)
    timing = time_call(lambda: torch.sum(src, dim=0, out=result), device, graph=False, target_s=0.3, min_reps=5)
    return size_bytes / (timing.median_us * 1e3)


def measure_matmul_tflops(device: str, dtype: torch.dtype) -> float:
    """TFLOP/s of a square matrix product in ``dtype`` on random data (8192 on CUDA, 512 on CPU)."""
    n = 8192 if torch.device(device).type == "cuda" else 512
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    timing = time_call(lambda: torch.matmul(a, b, out=out), device, graph=False, target_s=0.3, min_reps=5)
    return 2 * n**3 / (timing.median_us * 1e6)


def datasheet_peak(device: str, dtype_name: str) -> float | None:
    """The dense datasheet peak of the device for the dtype, or None when the device is not listed."""
    if torch.device(device).type != "cuda":
        return None
    name = torch.cuda.get_device_name(torch.device(device))
    for key, peaks in DATASHEET_PEAK_TFLOPS.items():
        if key in name:
            return peaks.get(dtype_name)
    return None


def measure_ceilings(device: str, dtype_names: list[str]) -> dict:
    """Every ceiling of the run, for meta.json and the rows' percentages.

    {"read_gbps", "copy_gbps", "matmul_tflops": {dtype: measured}, "peak_tflops": {dtype: peak},
     "peak_source": {dtype: "datasheet ..." or "measured matmul"}}
    """
    from .vocab import DTYPES

    ceilings: dict = {
        "read_gbps": measure_read_bandwidth(device),
        "copy_gbps": measure_copy_bandwidth(device),
        "matmul_tflops": {},
        "peak_tflops": {},
        "peak_source": {},
    }
    for name in sorted(set(dtype_names)):
        measured = measure_matmul_tflops(device, DTYPES[name])
        ceilings["matmul_tflops"][name] = measured
        peak = datasheet_peak(device, name)
        ceilings["peak_tflops"][name] = peak if peak is not None else measured
        ceilings["peak_source"][name] = DATASHEET_SOURCE if peak is not None else "measured matmul (no datasheet entry)"
    return ceilings
