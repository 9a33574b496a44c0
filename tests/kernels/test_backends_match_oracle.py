"""Every backend, on every chosen shape, against the float64 oracle at the kernel's tolerance."""

from __future__ import annotations

import pytest
import torch

import kernels
from harness.cases.vocab import DEFAULT_TOLERANCES
from harness.run.grading import grade
from harness.run.oracle import paged_attention_oracle
from tests.kernels.kernel_cases import FP32_PRECISION_CASES, KERNEL_CASES, KernelCase, triton_output

CUDA = torch.cuda.is_available()
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="no CUDA device here")]),
]


def run_through_cache(case: KernelCase, inputs, device: str) -> torch.Tensor:
    """The engine's path: allocate, write each sequence through the slot mapping, read."""
    cache = kernels.PagedKVCache(
        num_layers=2,
        num_blocks=sum(-(-n // case.block_size) for n in case.seq_lens) + 3,
        block_size=case.block_size,
        num_kv_heads=case.num_kv_heads,
        head_dim=case.head_dim,
        dtype=inputs.q.dtype,
        device=device,
        head_dim_v=inputs.v_cache.shape[-1],
    )
    seq_ids = list(range(100, 100 + len(case.seq_lens)))
    for seq_id, keys, values in zip(seq_ids, inputs.keys, inputs.values, strict=True):
        cache.allocate(seq_id)
        cache.write(1, cache.append(seq_id, keys.shape[0]), keys, values)
    out = inputs.new_out()
    return cache.paged_attention(1, inputs.q, seq_ids, inputs.query_start_loc, out=out)


def call_backend(backend: str, case: KernelCase, inputs, device: str) -> torch.Tensor:
    if backend == "cache":
        return run_through_cache(case, inputs, device)
    if backend == "triton":  # shared with tests/kernels/test_tlsim_predicts_triton.py (interpreted, it is slow)
        return triton_output((case, device), inputs)
    fn = {
        "reference": kernels.paged_attention_reference,
        "tlsim": kernels.paged_attention_tlsim,
        "triton": kernels.paged_attention_triton,
        "dispatch": kernels.paged_attention_dispatch,
    }[backend]
    out = inputs.new_out()  # NaN-filled: an unwritten element fails
    result = fn(*inputs.args(), out=out)
    assert result is out, "the out buffer must be written in place and returned"
    return result


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["reference", "tlsim", "triton", "dispatch", "cache"])
@pytest.mark.parametrize("case", [*KERNEL_CASES, *FP32_PRECISION_CASES], ids=str)
def test_backend_matches_float64_oracle(case: KernelCase, backend: str, device: str):
    if backend == "triton" and (reason := kernels.triton_unavailable_reason(device)):
        pytest.skip(reason)
    inputs = case.inputs(device)
    expected = paged_attention_oracle(*inputs.args())
    got = call_backend(backend, case, inputs, device)
    assert got.dtype == inputs.q.dtype
    result = grade(got, expected, *DEFAULT_TOLERANCES[case.dtype])
    assert result.passed, f"{backend} on {case.name} ({device}): {result.reason}"


def test_split_kv_cases_really_split_the_kv_range():
    """The split_kv cases exist to run the two-pass path; a tiling change must not quietly skip it.

    The launcher decides from host-known bounds (the table's capacity), so this asks it the same way.
    """
    from kernels.contract import prepare_call
    from kernels.tiling import tiling_for

    split_cases = [case for case in KERNEL_CASES if case.name.startswith(("split_kv", "bfloat16_split_kv"))]
    assert len(split_cases) == 3
    for case in split_cases:
        assert tiling_for(prepare_call(*case.inputs().args())).NUM_SPLITS > 1, case.name
