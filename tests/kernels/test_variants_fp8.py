"""fp8 KV caches: K = k_cache.float() * k_scale (vLLM's convention), q in fp32/fp16/bf16.

Every built-in backend matches the oracle of the dequantized cache, per-tensor and per-head scales,
e4m3fn and e5m2 single-pass, e4m3fn split; PagedKVCache quantizes on write; a scale ignored, inverted or
from the wrong head fails the grade (the rows' quant_error: tests/kernels/test_attention_variants.py)."""

from __future__ import annotations

import functools

import pytest
import torch

import kernels
from harness.cases.vocab import DEFAULT_TOLERANCES, FP8_KV_TOLERANCES
from harness.run.grading import grade
from harness.run.oracle import paged_attention_oracle
from kernels.fp8 import quantize_kv
from tests.kernels.kernel_cases import CASES_BY_NAME, assert_passes, assert_tlsim_close, backend_grid, run_backend

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
BASES = ["base", "spec_verify", "split_kv_decode", "bfloat16_split_kv", "float16_prefill"]


def _fp8_inputs(base: str, fp8: torch.dtype, per_head: bool):
    """A kernel case's pools quantized with amax scales (one per tensor, or per KV head)."""
    inputs = CASES_BY_NAME[base].inputs()
    num_kv_heads = inputs.k_cache.shape[2]
    limit = torch.finfo(fp8).max

    def scale_of(pool):
        amax = pool.float().abs().nan_to_num(0.0).amax(dim=(0, 1, 3))
        return (amax if per_head else amax.amax().expand(num_kv_heads)).contiguous() / limit

    k_scale, v_scale = scale_of(inputs.k_cache), scale_of(inputs.v_cache)
    k_cache, v_cache = quantize_kv(inputs.k_cache, k_scale, fp8), quantize_kv(inputs.v_cache, v_scale, fp8)
    scales = {"k_scale": k_scale, "v_scale": v_scale} if per_head else {"k_scale": float(k_scale[0]),
                                                                        "v_scale": float(v_scale[0])}  # fmt: skip
    return inputs, (inputs.q, k_cache, v_cache, *inputs.args()[3:]), scales


def _tolerance(q: torch.Tensor) -> tuple[float, float]:
    name = str(q.dtype).removeprefix("torch.")
    return FP8_KV_TOLERANCES.get(name, DEFAULT_TOLERANCES[name])


# The split cases have one KV head, so there a per-head scale is the per-tensor one, as a tensor: the
# contract turns a float scale into that same [num_kv_heads] tensor (the other bases test both forms), so
# the split path runs with per-head scales only. The format reaches the kernel only where a tile is widened,
# the same code in both passes: the split path runs e4m3fn, the single-pass bases both formats.
SPLIT_BASES = {"split_kv_decode", "bfloat16_split_kv"}
SCALED = [f"{base}-{fp8}-{scale}" for base in BASES for fp8 in FP8 for scale in ("per_tensor", "per_head")
          if base not in SPLIT_BASES or (fp8, scale) == ("e4m3", "per_head")]  # fmt: skip
# The kernel reads that tensor either way (the same specialization, the same loads): its per_tensor rows would
# repeat its per_head rows, so the Triton kernel runs the per_head rows; the other backends run both forms.
GRID = [row for row in backend_grid(SCALED) if row.values[1] != "triton" or row.values[0].endswith("per_head")]


@functools.cache
def _graded(scaled: str):
    """A SCALED row's inputs, quantized args, scales and the oracle of its dequantized cache, once a process."""
    base, fp8, scale = scaled.split("-")
    inputs, args, scales = _fp8_inputs(base, FP8[fp8], scale == "per_head")
    return inputs, args, scales, paged_attention_oracle(*args, **scales)


@pytest.mark.parametrize(("scaled", "backend"), GRID)
def test_backend_matches_oracle_of_the_dequantized_cache(scaled, backend):
    """The cache backend writes the unquantized keys and values into an fp8 cache, which quantizes them; on
    e4m3 per-head scales tlsim predicts the kernel (tests/kernels/test_tlsim_predicts_triton.py's bound)."""
    inputs, args, scales, expected = _graded(scaled)
    result = run_backend(backend, inputs, args, **scales)
    assert_passes(result, expected, _tolerance(inputs.q), f"{backend} on {scaled}")
    if backend == "triton" and scaled.endswith("-e4m3-per_head"):
        assert_tlsim_close(kernels.paged_attention_tlsim(*args, **scales), result, inputs.q.dtype, what=scaled)


# Mutants, each a wrong dequantization as the scale keywords tlsim gets from the right ones (k, v).
WRONG_SCALES = {
    "scale_ignored": lambda k, v: {},
    "scale_divided": lambda k, v: {"k_scale": 1 / k, "v_scale": 1 / v},
    "scales_swapped": lambda k, v: {"k_scale": v, "v_scale": k},
    "scale_of_the_wrong_head": lambda k, v: {"k_scale": k.roll(1), "v_scale": v.roll(1)},
}


@pytest.mark.parametrize("mutant", WRONG_SCALES)
def test_oracle_catches_a_wrong_dequantization(mutant):
    inputs, args, scales = _fp8_inputs("spec_verify", torch.float8_e4m3fn, True)
    expected = paged_attention_oracle(*args, **scales)
    assert grade(kernels.paged_attention_tlsim(*args, **scales), expected, *_tolerance(inputs.q)).passed
    wrong = kernels.paged_attention_tlsim(*args, **WRONG_SCALES[mutant](scales["k_scale"], scales["v_scale"]))
    assert not grade(wrong, expected, *_tolerance(inputs.q)).passed


def test_fp8_cache_quantizes_on_write_and_poisons_freed_blocks():
    scale = torch.tensor([0.01, 0.02])
    cache = kernels.PagedKVCache(1, 4, 16, 2, 32, dtype=torch.float8_e4m3fn, k_scale=scale, v_scale=0.5)
    cache.allocate(0)
    keys, values = torch.randn(20, 2, 32), torch.randn(20, 2, 32)
    slots = cache.append(0, 20)
    cache.write(0, slots, keys, values)
    stored = cache.k_caches[0].view(-1, 2, 32)[slots]
    assert torch.equal(stored.view(torch.uint8), quantize_kv(keys, scale, torch.float8_e4m3fn).view(torch.uint8))
    assert torch.allclose(stored.float() * scale[:, None], keys, rtol=2**-3, atol=scale.max().item() * 2**-6)
    big = torch.full((1, 2, 32), 1e6)  # saturates at 448 * scale instead of becoming NaN
    cache.write(0, cache.append(0, 1), big, big)
    assert bool(cache.k_caches[0].view(-1, 2, 32)[20].float().isfinite().all())
    cache.free(0)
    assert bool(cache.k_caches[0].float().isnan().all())
    with pytest.raises(ValueError, match="k_scale applies to an fp8 cache"):
        kernels.PagedKVCache(1, 4, 16, 2, 32, dtype=torch.bfloat16, k_scale=0.5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("fp8", list(FP8), ids=str)
@pytest.mark.parametrize("base", ["bfloat16_split_kv", "float16_prefill", "base"])
def test_triton_on_cuda_matches_oracle_with_an_fp8_cache(base, fp8):
    """The compiled kernel's fp8 loads and dequantization (the interpreter only models them)."""
    inputs, args, scales = _fp8_inputs(base, FP8[fp8], True)
    cuda_args = [a.cuda() for a in args]
    cuda_scales = {k: v.cuda() for k, v in scales.items()}
    result = kernels.paged_attention_triton(*cuda_args, **cuda_scales)
    assert_passes(result.cpu(), paged_attention_oracle(*args, **scales), _tolerance(inputs.q))
