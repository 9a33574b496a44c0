"""Every backend, on every chosen shape, against the float64 oracle at the kernel's tolerance; tlsim, the kernel's
numerics model, sits well inside it; and the grading can fail: deliberately broken kernels (each a small change a
real bug makes) are caught.

tlsim's bound (kernel_cases.assert_tlsim_close): fp32, half the tolerance; fp16/bf16, two output ulps (three past
head dim 512 on a GPU, whose dots sum in the tensor cores' order). The fp32 large-logit case is held to the whole
tolerance: its logits' fp32 rounding depends on the dot's summation order; FP32_PRECISION_CASES to the oracle only."""

from __future__ import annotations

import pytest
import torch

import kernels
from harness.cases.vocab import DEFAULT_TOLERANCES
from harness.run.grading import grade
from kernels.contract import prepare_call
from kernels.tiling import tiling_for
from tests.kernels.kernel_cases import (
    CASES_BY_NAME,
    FP32_PRECISION_CASES,
    KERNEL_CASES,
    KernelCase,
    assert_passes,
    assert_tlsim_close,
    backend_grid,
    graded_inputs,
    run_backend,
)


@pytest.mark.parametrize(("case", "backend", "device"), backend_grid([*KERNEL_CASES, *FP32_PRECISION_CASES], True))
def test_backend_matches_float64_oracle(case: KernelCase, backend: str, device: str):
    inputs, expected = graded_inputs(case, device)
    got = run_backend(backend, inputs)
    assert got.dtype == inputs.q.dtype
    assert_passes(got, expected, DEFAULT_TOLERANCES[case.dtype], f"{backend} on {case}")
    if backend == "triton" and case in KERNEL_CASES:  # tlsim predicts the kernel (the module docstring)
        share = 1.0 if case.name == "large_logits" else 0.5
        ulps = 3 if device == "cuda" and case.head_dim > 512 else 2
        assert_tlsim_close(kernels.paged_attention_tlsim(*inputs.args()), got, inputs.q.dtype, share, ulps, case.name)


def test_split_kv_cases_really_split_the_kv_range():
    """The split_kv cases run the two-pass path, asked as the launcher asks (from the table's capacity)."""
    split_cases = [case for case in KERNEL_CASES if case.name.startswith(("split_kv", "bfloat16_split_kv"))]
    assert len(split_cases) == 3
    for case in split_cases:
        assert tiling_for(prepare_call(*case.inputs().args())).NUM_SPLITS > 1, case.name


def off_by_one_length(q, k, v, bt, seq_lens, qsl=None, scale=None, out=None):
    """Reads one slot past each sequence's end (into NaN); unchecked, as a buggy kernel would not check."""
    return kernels.paged_attention_tlsim(q, k, v, bt, seq_lens + 1, qsl, scale, out, check=False)


def no_causal_offset(q, k, v, bt, seq_lens, qsl=None, scale=None, out=None):
    """Lets every query see the whole history (the q_len > 1 causal bug)."""
    out = kernels.paged_attention_reference(q, k, v, bt, seq_lens, qsl, scale, out)
    lens, starts = seq_lens.tolist(), qsl.tolist()
    for s, n in enumerate(lens):
        rows = slice(starts[s], starts[s + 1])
        if starts[s + 1] > starts[s]:
            single = torch.tensor([n], dtype=torch.int32).expand(starts[s + 1] - starts[s]).contiguous()
            out[rows] = kernels.paged_attention_reference(q[rows], k, v, bt[s : s + 1].expand(len(single), -1), single)
    return out


def wrong_gqa_mapping(q, k, v, bt, seq_lens, qsl=None, scale=None, out=None):
    """Query head h reads KV head h % num_kv_heads instead of h // group_size."""
    group = q.shape[1] // k.shape[2]
    perm = torch.arange(q.shape[1]).view(k.shape[2], group).t().reshape(-1)
    result = kernels.paged_attention_reference(q[:, perm], k, v, bt, seq_lens, qsl, scale)
    out[:, perm] = result
    return out


def tf32_like_precision(q, k, v, bt, seq_lens, qsl=None, scale=None, out=None):
    """Rounds q and k to 10 mantissa bits, as TF32 matrix units do."""
    return kernels.paged_attention_tlsim(q.half().float(), k.half().float(), v, bt, seq_lens, qsl, scale, out)


def skips_last_row(q, k, v, bt, seq_lens, qsl=None, scale=None, out=None):
    """Forgets to write the last query row."""
    result = kernels.paged_attention_tlsim(q[:-1], k, v, bt, seq_lens, torch.clamp(qsl, max=q.shape[0] - 1), scale)
    out[:-1] = result
    return out


MUTANTS = [
    (off_by_one_length, "base"),
    (no_causal_offset, "spec_verify"),
    (wrong_gqa_mapping, "base"),
    (tf32_like_precision, "large_logits"),
    (skips_last_row, "base"),
]


@pytest.mark.parametrize(("mutant", "case_name"), MUTANTS, ids=[m.__name__ for m, _ in MUTANTS])
def test_grading_fails_a_broken_kernel(mutant, case_name):
    case = CASES_BY_NAME[case_name]
    inputs, expected = graded_inputs(case)
    assert grade(kernels.paged_attention_tlsim(*inputs.args()), expected, *DEFAULT_TOLERANCES[case.dtype]).passed
    out = torch.full_like(inputs.q, float("nan"))
    result = grade(mutant(*inputs.args(), out=out), expected, *DEFAULT_TOLERANCES[case.dtype])
    assert not result.passed, f"{mutant.__name__} slipped through on {case_name}: {result}"
    assert result.reason
