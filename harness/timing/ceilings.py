"""The device's ceilings, measured at the start of a run: what "fast" is measured against."""

import json
import os
import time
from pathlib import Path

import torch

from harness.cases.vocab import DTYPES
from harness.timing.timer import time_call

# Dense (no sparsity) tensor-core peaks from NVIDIA's datasheets, TFLOP/s, by dtype.
# H100 and H200 SXM share the compute die; the H200 has more and faster memory only.
DATASHEET_PEAK_TFLOPS = {"H200": {"bfloat16": 989.4, "float16": 989.4, "float32": 66.9},
                         "H100 80GB HBM3": {"bfloat16": 989.4, "float16": 989.4, "float32": 66.9},
                         "A100": {"bfloat16": 312.0, "float16": 312.0, "float32": 19.5}}  # fmt: skip
DATASHEET_SOURCE = "NVIDIA datasheet, SXM, dense (float32: non-tensor-core FP32)"


CPU_BUFFER_BYTES = 256 * 2**20  # large enough to leave the caches, small enough for a laptop


def measure_copy_bandwidth(device: str) -> float:
    """GB/s of a device-to-device copy of 1 GiB (CPU_BUFFER_BYTES on a CPU), counting bytes read + bytes written."""
    size_bytes = CPU_BUFFER_BYTES if torch.device(device).type == "cpu" else 1 << 30
    src = torch.empty(size_bytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    timing = time_call(lambda: dst.copy_(src), device, graph=False, target_s=0.3, min_reps=5)
    return 2 * size_bytes / (timing.median_us * 1e3)


def measure_read_bandwidth(device: str) -> float:
    """GB/s of the fastest reader below over 2 GiB of float32 (CPU_BUFFER_BYTES on a CPU), each byte read once."""
    size_bytes = CPU_BUFFER_BYTES if torch.device(device).type == "cpu" else 1 << 31
    src = torch.rand(size_bytes // 4, dtype=torch.float32, device=device)
    result = torch.empty((), dtype=torch.float32, device=device)
    readers = [lambda: torch.sum(src, dim=0, out=result)]
    if torch.device(device).type == "cuda" and (streaming := _streaming_reader(src)) is not None:
        readers.append(streaming[0])
    best_us = min(time_call(read, device, graph=False, target_s=0.3, min_reps=5).median_us for read in readers)
    return size_bytes / (best_us * 1e3)


def _streaming_reader(src: torch.Tensor) -> tuple | None:
    """(read, sums): ``read()`` runs a Triton kernel that reads ``src`` (flat float32) once, each program's
    sum into ``sums`` [programs]; None without Triton (optional, so imported here)."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def read_all(x_ptr, out_ptr, n, BLOCK: tl.constexpr, STEPS: tl.constexpr):
        start = tl.program_id(0) * BLOCK * STEPS
        acc = tl.zeros((BLOCK,), tl.float32)
        for step in range(STEPS):
            offsets = start + step * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
        tl.store(out_ptr + tl.program_id(0), tl.sum(acc, 0))

    block, steps = 4096, 8
    grid = (triton.cdiv(src.numel(), block * steps),)
    sums = torch.empty(grid[0], dtype=torch.float32, device=src.device)
    return (lambda: read_all[grid](src, sums, src.numel(), BLOCK=block, STEPS=steps, num_warps=8)), sums


def measure_matmul_tflops(device: str, dtype: torch.dtype) -> float:
    """TFLOP/s of a square matrix product in ``dtype`` on random data (8192 on CUDA, 512 on CPU)."""
    n = 8192 if torch.device(device).type == "cuda" else 512
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    out = torch.empty(n, n, device=device, dtype=dtype)
    timing = time_call(lambda: torch.matmul(a, b, out=out), device, graph=False, target_s=0.3, min_reps=5)
    return 2 * n**3 / (timing.median_us * 1e6)


def measure_ceilings(device: str, dtype_names: list[str]) -> dict:
    """Every ceiling of the run (for meta.json and the rows' percentages): bandwidths, per dtype matmul and peak
    (the datasheet's for a listed GPU, else the measured matmul)."""
    ceilings: dict = {"read_gbps": measure_read_bandwidth(device), "copy_gbps": measure_copy_bandwidth(device),
                      "matmul_tflops": {}, "peak_tflops": {}, "peak_source": {}}  # fmt: skip
    cuda = torch.device(device).type == "cuda"
    gpu = torch.cuda.get_device_name(torch.device(device)) if cuda else ""
    for name in sorted(set(dtype_names)):
        ceilings["matmul_tflops"][name] = measured = measure_matmul_tflops(device, DTYPES[name])
        peak = next((peaks.get(name) for key, peaks in DATASHEET_PEAK_TFLOPS.items() if key in gpu), None)
        ceilings["peak_tflops"][name] = peak if peak is not None else measured
        ceilings["peak_source"][name] = DATASHEET_SOURCE if peak is not None else "measured matmul (no datasheet entry)"
    if cuda:
        torch.cuda.empty_cache()  # its buffers (2 GiB) go back before the first case
    return ceilings


# --- one run, several GPUs: each worker measures its own ---------------------------------------

_OWN: dict[str, dict] = {}  # this process's device, measured once (a worker runs many cases)
SHARE_ENV = "HARNESS_CEILINGS_DIR"  # set by a Ray driver: GPU tasks get a fresh process each (Ray's max_calls=1)


def own_device(device: str, dtype_names: list[str], timing: bool) -> dict:
    """{"gpu_name" ("" on a CPU), "ceilings" (on CUDA when timing, else {}), "measure_s"} of this process's
    device, measured once per process, or with ``$HARNESS_CEILINGS_DIR`` once per GPU of the node."""
    if device in _OWN:
        return _OWN[device]
    cuda = torch.device(device).type == "cuda"
    share = os.environ.get(SHARE_ENV) if cuda else None
    shared = Path(share) / f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'all')}.json" if share else None
    if shared is not None and shared.is_file():
        _OWN[device] = {**json.loads(shared.read_text()), "measure_s": 0.0}
        return _OWN[device]
    started = time.perf_counter()
    ceilings = measure_ceilings(device, dtype_names) if cuda and timing and dtype_names else {}
    name = torch.cuda.get_device_name(torch.device(device)) if cuda else ""
    _OWN[device] = {"gpu_name": name, "ceilings": ceilings, "measure_s": time.perf_counter() - started}
    if shared is not None:
        shared.parent.mkdir(parents=True, exist_ok=True)
        temp = shared.with_name(f".{shared.name}.{os.getpid()}")
        temp.write_text(json.dumps(_OWN[device]))
        os.replace(temp, shared)  # a GPU runs one task at a time; the rename keeps a reader from half a file
    return _OWN[device]


class GpuLedger:
    """Each GPU of a run by (host, gpu_index): its name and its worker's first-reported ceilings, for its rows."""

    def __init__(self):
        self.gpus: dict[tuple[str, str], dict] = {}

    def add(self, host: str, gpu_index: str, worker, report: dict) -> None:
        if not report.get("gpu_name"):
            return  # a CPU worker: the driver's ceilings stand
        record = self.gpus.setdefault((host, str(gpu_index)), {"host": host, "gpu_index": str(gpu_index), **report})
        workers = record.setdefault("workers", [])
        if worker not in workers:
            workers.append(worker)

    def apply(self, row: dict) -> dict:
        """The row with its GPU's name and percentages from its GPU's ceilings (as it is, without a record)."""
        record = self.gpus.get((row.get("host"), str(row.get("gpu_index"))))
        if record is None:
            return row
        row = {**row, "gpu_name": record["gpu_name"]}
        return {**row, **ceiling_columns(row, record["ceilings"])} if record["ceilings"] else row

    def to_meta(self) -> list[dict]:
        return [self.gpus[key] for key in sorted(self.gpus)]


def ceiling_columns(row: dict, ceilings: dict) -> dict:
    """A timed row's ``pct_of_ceiling`` (100 * gbps / read_gbps: a decode kernel only reads) and, for prefill rows,
    ``pct_of_peak`` (100 * tflops / peak_tflops[dtype]) against ``ceilings``."""
    out = {}
    gbps, tflops = row.get("gbps"), row.get("tflops")
    if isinstance(gbps, float) and gbps == gbps and (read := ceilings.get("read_gbps")):
        out["pct_of_ceiling"] = 100.0 * gbps / read
    peak = (ceilings.get("peak_tflops") or {}).get(row.get("dtype"))
    if isinstance(tflops, float) and tflops == tflops and peak and (row.get("max_q_len") or 0) > 1:
        out["pct_of_peak"] = 100.0 * tflops / peak
    return out


def mixed_models_note(gpus: list[dict]) -> str:
    """ "" when the run's GPUs (meta.json's ``gpus``) are of one model; else a note naming them."""
    if len(models := sorted({gpu["gpu_name"] for gpu in gpus if gpu.get("gpu_name")})) < 2:
        return ""
    return (f"mixed GPU models: {' + '.join(models)} (each row's pct_of_ceiling is against its own GPU; "
            "latencies compare only between rows of one gpu_name)")  # fmt: skip
