"""Quick side-by-side timing of the backends on a CUDA device (one process, same inputs).

    python scripts/gpu_kernel_bench.py

Times with triton.testing.do_bench (CUDA events, median of repeats after warm-up) and
reports microseconds, the KV bytes each call must read, and GB/s. Ratios within one run
are the numbers to trust; absolute times move with the machine.
"""

from __future__ import annotations

import os
import sys

import torch
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import kernels
from harness.inputs import make_inputs

SHAPES = [
    # name, num_q_heads, num_kv_heads, head_dim, block_size, num_seqs, seq_len, q_len
    ("llama8b_decode_b64_ctx4k", 32, 8, 128, 16, 64, 4096, 1),
    ("llama8b_decode_b256_ctx1k", 32, 8, 128, 16, 256, 1024, 1),
    ("llama70b_tp8_decode_b64_ctx8k", 8, 1, 128, 16, 64, 8192, 1),
    ("llama8b_spec_b32_ctx2k_q4", 32, 8, 128, 32, 32, 2048, 4),
    ("llama8b_chunk_b4_ctx4k_q512", 32, 8, 128, 16, 4, 4096, 512),
]


def main() -> None:
    print(f"device={torch.cuda.get_device_name()} torch={torch.__version__} triton={triton.__version__}")
    print(f"{'shape':32s} {'backend':10s} {'us':>10s} {'GB/s':>8s} {'x triton':>9s}")
    for name, hq, hkv, d, bs, n, seq_len, q_len in SHAPES:
        inputs = make_inputs(
            num_q_heads=hq, num_kv_heads=hkv, head_dim=d, block_size=bs, seq_lens=[seq_len] * n,
            q_lens=[q_len] * n, dtype="bfloat16", device="cuda",
        )  # fmt: skip
        kv_bytes = 2 * n * seq_len * hkv * d * 2 + 2 * inputs.q.numel() * 2
        out = torch.empty_like(inputs.q)
        times = {}
        args = inputs.args()
        for backend, fn in [
            ("triton", kernels.paged_attention_triton),
            ("tlsim", kernels.paged_attention_tlsim),
            ("reference", kernels.paged_attention_reference),
        ]:
            times[backend] = 1e3 * triton.testing.do_bench(lambda fn=fn: fn(*args, out=out), return_mode="median")  # noqa: B023
        for backend, us in times.items():
            print(f"{name:32s} {backend:10s} {us:10.1f} {kv_bytes / us / 1e3:8.1f} {us / times['triton']:9.2f}")


if __name__ == "__main__":
    main()
