"""Which reader gets the most read bandwidth out of the GPU (the read ceiling)."""
import torch, triton, triton.language as tl, sys
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

size = 1 << 30
dev = "cuda"
src = torch.rand(size // 4, dtype=torch.float32, device=dev)
res = torch.empty((), dtype=torch.float32, device=dev)
def gbps(fn, nbytes=size):
    t = time_call(fn, dev, graph=False, target_s=0.3, min_reps=5)
    return nbytes / (t.median_us * 1e3)
out = {}
for rep in range(3):
    out.setdefault("sum_all_f32", []).append(gbps(lambda: torch.sum(src, dim=0, out=res)))
    v = src.view(-1, 4096); o = torch.empty(v.shape[0], device=dev)
    out.setdefault("sum_rows4096_f32", []).append(gbps(lambda: torch.sum(v, dim=1, out=o)))
    b = src.view(torch.bfloat16)
    out.setdefault("sum_all_bf16view", []).append(gbps(lambda: b.sum()))
    out.setdefault("amax_f32", []).append(gbps(lambda: src.amax()))
    for block, iters, warps in [(4096, 8, 8), (8192, 4, 8), (2048, 16, 4), (4096, 16, 8), (16384, 2, 16)]:
        n = src.numel(); grid = triton.cdiv(n, block * iters)
        o2 = torch.empty(grid, device=dev)
        f = lambda: _read[(grid,)](src, o2, n, BLOCK=block, ITERS=iters, num_warps=warps)
        out.setdefault(f"triton_b{block}_i{iters}_w{warps}", []).append(gbps(f))
    # bigger buffer
big = torch.rand((1 << 31) // 4, dtype=torch.float32, device=dev)
out["sum_all_f32_2GiB"] = [gbps(lambda: big.sum(), 1 << 31)]
n = big.numel(); grid = triton.cdiv(n, 4096 * 8); o3 = torch.empty(grid, device=dev)
out["triton_b4096_i8_w8_2GiB"] = [gbps(lambda: _read[(grid,)](big, o3, n, BLOCK=4096, ITERS=8, num_warps=8), 1 << 31)]
for k, v in out.items():
    print(f"{k:32s} " + " ".join(f"{x:7.1f}" for x in v))
