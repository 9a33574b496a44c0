"""fp8 KV caches: a cache stored as ``float8_e4m3fn`` or ``float8_e5m2`` holds ``x / scale``; the kernels widen
each stored value exactly and apply ``k_scale`` to the logits and ``v_scale`` to the accumulator, so they round
no more than the oracle of the dequantized cache does."""

from __future__ import annotations

import torch

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)  # KV caches only; q stays fp32/fp16/bf16


def quantize_kv(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What an fp8 cache stores for x [..., num_kv_heads, head_dim]: x / scale [num_kv_heads] fp32 in ``dtype``,
    saturated at the format's largest finite value (an outlier stays finite; NaN stays NaN: the poisoned slots)."""
    limit = torch.finfo(dtype).max
    return (x.float() / scale[:, None]).clamp(-limit, limit).to(dtype)


def dequantize_kv(stored: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """stored [..., num_kv_heads, head_dim] dequantized: ``stored.float() * scale`` in ``dtype`` (the
    reference passes fp32: exact); unchanged when scale is None (not fp8)."""
    if scale is None:
        return stored
    return (stored.float() * scale[:, None]).to(dtype)
