"""The engine's fallback oracle, deliberately the most obvious program: a Python loop over sequences, each one's
pages gathered into a contiguous copy, KV heads repeated for their group, and torch's SDPA in fp32 with the causal
offset mask. The variants are spelled out as plainly: a window narrows the mask; softcap, ALiBi and sinks turn
SDPA into its three lines (logits, softmax with the sink's column, weights @ v).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .contract import PagedCall, contract_entry
from .fp8 import dequantize_kv


def gather_kv(cache: torch.Tensor, block_table_row: torch.Tensor, seq_len: int) -> torch.Tensor:
    """One sequence's keys (or values) in position order, a copy [seq_len, num_kv_heads, head_dim] in the cache's
    dtype, from cache [num_blocks, block_size, num_kv_heads, head_dim] and block_table_row [max_blocks_per_seq]
    int32, of which the first ceil(seq_len / block_size) are read (seq_len 45, block_size 16: 3 blocks)."""
    block_size = cache.shape[1]
    num_used = -(-seq_len // block_size)
    blocks = block_table_row[:num_used].long()
    return cache[blocks].flatten(0, 1)[:seq_len]


def causal_offset_mask(
    q_len: int, seq_len: int, device: torch.device, sliding_window: int | None = None
) -> torch.Tensor:
    """[q_len, seq_len] bool: query j sits at position seq_len - q_len + j and sees keys up to it
    (and, with a window W, no key more than W - 1 positions before it)."""
    q_pos = torch.arange(seq_len - q_len, seq_len, device=device)
    distance = q_pos[:, None] - torch.arange(seq_len, device=device)[None, :]  # query_pos - key_pos
    mask = distance >= 0
    return mask if sliding_window is None else mask & (distance < sliding_window)


def attention_with_variants(q, k, v, mask, scale, logit_softcap, sinks, alibi_slopes):
    """Softmax attention written out, for the variants and the log-sum-exp SDPA cannot give.

    q [num_q_heads, q_len, head_dim], k/v [num_q_heads, seq_len, head_dim] fp32, mask [q_len, seq_len] bool,
    sinks/alibi_slopes [num_q_heads] fp32 or None. Returns (out [num_q_heads, q_len, head_dim] fp32,
    lse [num_q_heads, q_len] fp32), lse the natural log of the softmax's denominator (the sink's column included).
    """
    logits = (q @ k.transpose(-1, -2)) * scale  # [num_q_heads, q_len, seq_len]
    if logit_softcap is not None:
        logits = logit_softcap * torch.tanh(logits / logit_softcap)
    if alibi_slopes is not None:
        q_len, seq_len = mask.shape
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
        distance = torch.arange(seq_len, device=q.device)[None, :] - q_pos[:, None]  # key_pos - query_pos
        logits = logits + alibi_slopes[:, None, None] * distance
    logits = logits.masked_fill(~mask, float("-inf"))
    if sinks is not None:  # one more column: the sink's logit, whose value row is zero
        logits = torch.cat([logits, sinks[:, None, None].expand(-1, logits.shape[1], 1)], -1)
    weights = torch.softmax(logits, -1)
    if sinks is not None:
        weights = weights[..., :-1]
    return weights @ v, torch.logsumexp(logits, -1)


@contract_entry
def paged_attention_reference(call: PagedCall, out: torch.Tensor, lse: torch.Tensor | None, **hints) -> None:
    """Paged attention by gather + SDPA in fp32 (explicit softmax for the variants and the lse); the launch hints
    are unused. Without the value checks a block id outside the pool is the caller's bug (IndexError or wrap)."""
    del hints
    q, k_cache, v_cache = call.q, call.k_cache, call.v_cache
    explicit = call.logit_softcap is not None or call.sinks is not None or call.alibi_slopes is not None
    explicit = explicit or lse is not None
    block_table = call.block_table
    starts = call.query_start_loc.tolist()
    lens = call.seq_lens.tolist()
    for seq, seq_len in enumerate(lens):
        q_begin, q_end = starts[seq], starts[seq + 1]
        if q_end == q_begin:
            continue
        k = dequantize_kv(gather_kv(k_cache, block_table[seq], seq_len), call.k_scale, torch.float32).float()
        v = dequantize_kv(gather_kv(v_cache, block_table[seq], seq_len), call.v_scale, torch.float32).float()
        k = k.repeat_interleave(call.group_size, dim=1).transpose(0, 1)  # [num_q_heads, seq_len, head_dim]
        v = v.repeat_interleave(call.group_size, dim=1).transpose(0, 1)
        q_seq = q[q_begin:q_end].float().transpose(0, 1)  # [num_q_heads, q_len, head_dim]
        mask = causal_offset_mask(q_end - q_begin, seq_len, q.device, call.sliding_window)
        if explicit:
            o, lse_seq = attention_with_variants(
                q_seq, k, v, mask, call.scale, call.logit_softcap, call.sinks, call.alibi_slopes
            )
            if lse is not None:
                lse[q_begin:q_end] = lse_seq.transpose(0, 1)
        else:
            o = F.scaled_dot_product_attention(q_seq, k, v, attn_mask=mask, scale=call.scale)
        out[q_begin:q_end] = o.transpose(0, 1).to(out.dtype)
