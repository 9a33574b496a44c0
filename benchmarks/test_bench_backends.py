"""pytest-benchmark suite: each backend on a few decode/prefill shapes, compared across commits.

    nox -s bench        # saves under .benchmarks/ and compares with the previous saved run

pytest-benchmark measures wall time around each call; on CUDA the call synchronizes, so
the time includes the launch path an engine pays. The Triton kernel runs only on a GPU
here (the CPU interpreter measures Python, not the kernel). Latency targets live here,
as numbers to compare, never as assertions in the test suite.
"""

from __future__ import annotations

import pytest
import torch

import kernels
from harness.inputs import make_inputs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SHAPES = {
    # name: (num_q_heads, num_kv_heads, head_dim, block_size, seq_lens, q_lens)
    "decode_gqa_b16": (32, 8, 128, 16, [512 + 37 * i for i in range(16)], [1] * 16),
    "decode_mqa_b8": (8, 1, 128, 16, [1024 + 101 * i for i in range(8)], [1] * 8),
    "prefill_chunk_q64": (32, 8, 128, 16, [700, 300], [64, 64]),
}
BACKENDS = {
    "reference": kernels.paged_attention_reference,
    "tlsim": kernels.paged_attention_tlsim,
    "triton": kernels.paged_attention_triton,
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_bench(benchmark, shape, backend):
    if backend == "triton" and DEVICE != "cuda":
        pytest.skip("the interpreter's speed says nothing about the kernel's")
    hq, hkv, d, bs, seq_lens, q_lens = SHAPES[shape]
    dtype = "bfloat16" if DEVICE == "cuda" else "float32"
    inputs = make_inputs(num_q_heads=hq, num_kv_heads=hkv, head_dim=d, block_size=bs, seq_lens=seq_lens,
                         q_lens=q_lens, dtype=dtype, device=DEVICE)  # fmt: skip
    fn, args, out = BACKENDS[backend], inputs.args(), torch.empty_like(inputs.q)

    def call():
        fn(*args, out=out)
        if DEVICE == "cuda":
            torch.cuda.synchronize()

    benchmark.extra_info.update(device=DEVICE, dtype=dtype, kv_tokens=sum(seq_lens))
    benchmark(call)
    assert not out.isnan().any(), "a benchmarked call must still produce a full output"
