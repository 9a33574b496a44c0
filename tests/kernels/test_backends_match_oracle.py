"""Every backend, on every chosen shape, against the float64 oracle at the kernel's tolerance."""

from __future__ import annotations

import pytest

import kernels
from harness.cases.vocab import DEFAULT_TOLERANCES
from harness.run.oracle import paged_attention_oracle
from tests.kernels.kernel_cases import (
    BACKENDS,
    FP32_PRECISION_CASES,
    KERNEL_CASES,
    ON_CUDA,
    KernelCase,
    assert_passes,
    run_backend,
    triton_output,
)

DEVICES = ["cpu", pytest.param("cuda", marks=ON_CUDA)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", [*KERNEL_CASES, *FP32_PRECISION_CASES], ids=str)
def test_backend_matches_float64_oracle(case: KernelCase, backend: str, device: str):
    if backend == "triton" and (reason := kernels.triton_unavailable_reason(device)):
        pytest.skip(reason)
    inputs = case.inputs(device)
    if backend == "triton":  # shared with tests/kernels/test_tlsim_predicts_triton.py (interpreted, it is slow)
        got = triton_output((case, device), inputs)
    else:
        got = run_backend(backend, inputs)
    assert got.dtype == inputs.q.dtype
    assert_passes(got, paged_attention_oracle(*inputs.args()), DEFAULT_TOLERANCES[case.dtype], f"{backend} on {case}")


def test_split_kv_cases_really_split_the_kv_range():
    """The split_kv cases run the two-pass path, asked as the launcher asks (from the table's capacity)."""
    from kernels.contract import prepare_call
    from kernels.tiling import tiling_for

    split_cases = [case for case in KERNEL_CASES if case.name.startswith(("split_kv", "bfloat16_split_kv"))]
    assert len(split_cases) == 3
    for case in split_cases:
        assert tiling_for(prepare_call(*case.inputs().args())).NUM_SPLITS > 1, case.name
