"""The interpreter's bf16 correction computes as a GPU does and leaves the project's kernel bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kernels
from harness.backends import interpreter
from harness.backends.registry import load_plugin

if reason := kernels.triton_unavailable_reason("cpu"):
    pytest.skip(reason, allow_module_level=True)
if not interpreter.interpreting():
    pytest.skip("Triton runs compiled here (a GPU): nothing to correct", allow_module_level=True)

import triton
import triton.language as tl


@triton.jit
def _third_party_kernel(a_ptr, b_ptr, dot_ptr, mix_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    """What an attention kernel does with bf16: a dot of bf16 tiles, p rounded to bf16, bf16 arithmetic."""
    rows, cols, inner = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(a_ptr + rows[:, None] * K + inner[None, :])  # [M, K] bf16
    b = tl.load(b_ptr + inner[:, None] * N + cols[None, :])  # [K, N] bf16
    s = tl.dot(a, b)  # fp32
    p = s.to(tl.bfloat16)  # rounded to nearest even on a GPU
    mix = -(p * p + p) + tl.max(p, 1)[:, None]  # bf16 arithmetic, negation and a bf16 max
    tl.store(dot_ptr + rows[:, None] * N + cols[None, :], s)
    tl.store(mix_ptr + rows[:, None] * N + cols[None, :], mix)


def _run_third_party() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(16, 32, generator=generator).bfloat16()
    b = torch.randn(32, 16, generator=generator).bfloat16()
    dot, mix = torch.empty(16, 16), torch.empty(16, 16, dtype=torch.bfloat16)
    _third_party_kernel[(1,)](a, b, dot, mix, M=16, N=16, K=32)
    expected_dot = a.float() @ b.float()
    p = dot.bfloat16()  # what the kernel's rounding of its own dot must give
    expected_mix = -(p * p + p) + p.amax(dim=1, keepdim=True)
    return dot, mix, expected_dot, expected_mix


@pytest.fixture
def uncorrected():
    """The interpreter as Triton ships it for the test's body, whatever a plugin corrected before."""
    corrected_before = interpreter.bf16_corrected()
    interpreter.restore_bf16()
    yield
    interpreter.restore_bf16()
    if corrected_before:
        interpreter.correct_bf16()


def test_a_third_party_bf16_kernel_computes_as_a_gpu_under_the_corrected_interpreter(uncorrected):
    assert interpreter.correct_bf16()
    dot, mix, expected_dot, expected_mix = _run_third_party()
    torch.testing.assert_close(dot, expected_dot, atol=1e-5, rtol=1e-5)
    assert torch.equal(mix, expected_mix), (mix - expected_mix).abs().max()


def test_the_uncorrected_interpreter_gets_the_same_kernel_wrong(uncorrected):
    """The defect the correction answers (a Triton that fixed it would fail here: then drop the correction)."""
    assert not interpreter.bf16_corrected()
    dot, _, expected_dot, _ = _run_third_party()
    assert not torch.allclose(dot, expected_dot, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize(
    ("bits", "rounded"),
    [
        (0x3F808000, 0x3F80),  # a tie between two even-odd neighbours: to the even one
        (0x3F818000, 0x3F82),  # a tie above an odd one: up to the even
        (0x3F807FFF, 0x3F80),  # just under half an ulp: down
        (0xBF808001, 0xBF81),  # just over half an ulp, negative: away from zero
        (0x7F7FFFFF, 0x7F80),  # past bf16's largest: inf, as a GPU rounds
    ],
)
def test_fp32_to_bf16_rounds_to_nearest_even_as_torch_does(bits, rounded):
    value = np.array([bits], dtype=np.uint32).view(np.float32)
    assert int(interpreter.fp32_to_bf16(value)[0]) == rounded
    assert int(torch.from_numpy(value).bfloat16().view(torch.int16).numpy().view(np.uint16)[0]) == rounded


def test_fp32_to_bf16_keeps_a_nan_a_nan():
    nan = np.array([0x7F800001, 0xFFC00000], dtype=np.uint32).view(np.float32)  # a signalling NaN, a negative one
    assert np.isnan(interpreter.bf16_to_fp32(interpreter.fp32_to_bf16(nan))).all()


def test_the_projects_own_kernel_is_bit_identical_under_the_correction(uncorrected):
    """kernels.triton_paged never hands the interpreter a bf16 operand: the correction changes none of its bits."""
    from harness.cases.inputs import make_inputs

    inputs = make_inputs(num_q_heads=4, num_kv_heads=2, head_dim=32, block_size=16, seq_lens=[5, 40], q_lens=[1, 9],
                         dtype="bfloat16", layout="shuffled", input_scale=1.0, seed=3, device="cpu")  # fmt: skip
    plain = kernels.paged_attention_triton(*inputs.args(), logit_softcap=4.0)
    assert interpreter.correct_bf16()
    corrected = kernels.paged_attention_triton(*inputs.args(), logit_softcap=4.0)
    assert torch.equal(plain.view(torch.int16), corrected.view(torch.int16))


def test_importing_a_plugin_corrects_the_interpreter_in_that_process(tmp_path, clean_registry, uncorrected):
    (tmp_path / "empty_plugin.py").write_text("x = 1\n")
    assert not interpreter.bf16_corrected()
    load_plugin(str(tmp_path / "empty_plugin.py"))
    assert interpreter.bf16_corrected()
