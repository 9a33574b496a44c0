"""Which reader gets the most read bandwidth out of the GPU (the read ceiling): GB/s of each, three times."""

import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, ".")
from harness.timing.timer import time_call


@triton.jit
def _read(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros((BLOCK,), tl.float32)
    base = pid * BLOCK * ITERS
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, 0))


def gbps(fn, nbytes: int) -> float:
    return nbytes / (time_call(fn, "cuda", graph=False, target_s=0.3, min_reps=5).median_us * 1e3)


def triton_reader(src: torch.Tensor, block: int, iters: int, warps: int):
    n = src.numel()
    grid = triton.cdiv(n, block * iters)
    sums = torch.empty(grid, device=src.device)
    return lambda: _read[(grid,)](src, sums, n, BLOCK=block, ITERS=iters, num_warps=warps)


def main() -> None:
    size = 1 << 30
    src = torch.rand(size // 4, dtype=torch.float32, device="cuda")
    res = torch.empty((), dtype=torch.float32, device="cuda")
    rows = src.view(-1, 4096)
    row_sums = torch.empty(rows.shape[0], device="cuda")
    halves = src.view(torch.bfloat16)
    readers = {
        "sum_all_f32": lambda: torch.sum(src, dim=0, out=res),
        "sum_rows4096_f32": lambda: torch.sum(rows, dim=1, out=row_sums),
        "sum_all_bf16view": lambda: halves.sum(),
        "amax_f32": lambda: src.amax(),
    }
    for block, iters, warps in [(4096, 8, 8), (8192, 4, 8), (2048, 16, 4), (4096, 16, 8), (16384, 2, 16)]:
        readers[f"triton_b{block}_i{iters}_w{warps}"] = triton_reader(src, block, iters, warps)
    out = {name: [gbps(read, size) for _ in range(3)] for name, read in readers.items()}
    big = torch.rand((1 << 31) // 4, dtype=torch.float32, device="cuda")
    out["sum_all_f32_2GiB"] = [gbps(lambda: big.sum(), 1 << 31)]
    out["triton_b4096_i8_w8_2GiB"] = [gbps(triton_reader(big, 4096, 8, 8), 1 << 31)]
    for name, values in out.items():
        print(f"{name:32s} " + " ".join(f"{x:7.1f}" for x in values))


if __name__ == "__main__":
    main()
