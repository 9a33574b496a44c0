"""tlsim: the Triton kernel's algorithm in torch, so it runs anywhere and predicts the kernel's numerics.

The kernel's tiling and KV split (:func:`kernels.tiling.tiling_for`), online softmax, casts, variants and
combine. A bad block id turns the rows that would see it into NaN (the kernel: every row of the program, the
same rows on decode, a superset on prefill). Vectorised over sequences, KV heads and query rows, it loops over KV
tiles only; tiles past a sequence's end are exact no-ops (alpha = 1, p = 0). It cannot copy the order of
additions inside a dot or a row sum, which the GPU chooses: it predicts the kernel closely, not exactly.
"""

from __future__ import annotations

import math

import torch

from .contract import PagedCall, contract_entry
from .tiling import device_splits, tiling_for, window_tile_start

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)


def softcap_unscaled(s: torch.Tensor, cap_unscaled: float) -> torch.Tensor:
    """c * tanh(s / c) for unscaled logits s (c = cap / scale), from exp2 as the kernel's ``_softcap`` spells it."""
    x = s * (1.0 / cap_unscaled)
    t = torch.exp2(x.abs() * (-2.0 * LOG2E))
    y = cap_unscaled * ((1.0 - t) / (1.0 + t))
    return torch.where(x < 0, -y, y)


@contract_entry
def paged_attention_tlsim(
    call: PagedCall, out: torch.Tensor, lse: torch.Tensor | None, max_q_len: int | None, max_seq_len: int | None
) -> None:
    """Paged attention by the kernel's streaming algorithm, with the tiling and KV split the kernel's launch
    hints (max_q_len, max_seq_len) give it. It reads lengths on the host: a model, not a sync-free path."""
    q, k_cache, v_cache = call.q, call.k_cache, call.v_cache
    num_tokens = q.shape[0]
    if call.num_seqs == 0 or num_tokens == 0:
        return
    device = q.device
    q_lens = call.q_lens.clamp(min=0)
    longest_q = int(q_lens.max())
    kv_end = int(call.seq_lens.long()[q_lens > 0].max()) if bool((q_lens > 0).any()) else 0
    tiling = tiling_for(call, max_q_len, max_seq_len)
    block_table = call.block_table
    num_seqs, num_kv_heads, group = call.num_seqs, call.num_kv_heads, call.group_size
    head_dim, block_size = call.head_dim, call.block_size
    seq_lens_l = call.seq_lens.long()

    # Queries padded per sequence [num_seqs, longest_q], rows as in the kernel: row = token * group + head_in_group.
    j = torch.arange(longest_q, device=device)
    token_valid = j[None, :] < q_lens[:, None]  # [num_seqs, longest_q]
    token_index = (call.query_start_loc[:-1, None].long() + j[None, :]).clamp(0, num_tokens - 1)
    q_pad = torch.where(token_valid[..., None, None], q[token_index], 0).float()  # [S, Lq, Hq, D]
    q_rows = q_pad.view(num_seqs, longest_q, num_kv_heads, group, head_dim)
    q_rows = q_rows.permute(0, 2, 1, 3, 4).reshape(num_seqs, num_kv_heads, longest_q * group, head_dim)
    q_pos = (seq_lens_l - q_lens)[:, None] + j[None, :]  # [S, Lq]
    q_pos = q_pos.repeat_interleave(group, dim=1)[:, None, :, None]  # [S, 1, M, 1]

    num_rows = longest_q * group
    state_shape = (num_seqs, num_kv_heads, num_rows)
    qk_scale_log2 = call.scale * math.log2(math.e)
    max_blocks, num_blocks = block_table.shape[1], call.num_blocks
    split_size = tiling.SPLIT_SIZE or kv_end or 1
    num_splits = tiling.NUM_SPLITS
    last_split = torch.full((num_seqs, 1, 1), num_splits - 1, device=device)  # [S, 1, 1]
    if tiling.DEVICE_SPLIT is not None:  # each sequence's own splits, by the kernel's rule (tiling.device_splits)
        seq_splits, seq_split_size = device_splits(call.seq_lens, num_splits, tiling.TILE_N, *tiling.DEVICE_SPLIT)
        split_size = seq_split_size.clamp(min=1)[:, None, None]  # a length 0 sequence: one split, never cut
        last_split = (seq_splits - 1)[:, None, None]
    # (m, l, acc) of each KV split, combined at the end as the kernel does: [NUM_SPLITS, S, Hkv, M(, Dv)]
    m_all = torch.full((num_splits, *state_shape), float("-inf"), device=device)
    l_all = torch.zeros((num_splits, *state_shape), device=device)
    acc_all = torch.zeros((num_splits, *state_shape, call.head_dim_v), device=device)
    # The per-head vectors in unscaled-logit units, fp32.
    sinks_u = None if call.sinks is None else call.sinks / call.scale
    slopes_u = None if call.alibi_slopes is None else call.alibi_slopes / call.scale
    k_scale = None if call.k_scale is None else call.k_scale.view(1, num_kv_heads, 1, 1)  # per KV head
    # An fp8 decode dots in fp16 (Tiling.FP8_DOTS_FP16): p is rounded to fp16; q . k keeps its value (_q_to_fp16).
    dot_dtype = torch.float16 if tiling.FP8_DOTS_FP16 else q.dtype
    if slopes_u is not None:  # [S, Hkv, M, 1], row order as q_rows
        slopes_u = slopes_u.view(1, num_kv_heads, 1, group).expand(1, num_kv_heads, longest_q, group)
        slopes_u = slopes_u.reshape(1, num_kv_heads, num_rows, 1)
    # The window: no row sees a tile before the earliest one a first query sees (the rest are no-ops anyway).
    first_tile = 0
    if call.sliding_window is not None and bool((q_lens > 0).any()):
        first_q_pos = (seq_lens_l - q_lens)[q_lens > 0]
        first_tile = int(window_tile_start(first_q_pos, call.sliding_window, tiling.TILE_N).min())
    # Each row's split, as its program cuts them: from the window's first tile of the program's first query,
    # split_size positions a piece, the last taking the rest. Splits a sequence does not take keep their empty
    # state (weight 0 in the combine); a one-split sequence's combine is the kernel's epilogue, bit for bit.
    row_lo = torch.zeros((num_seqs, 1, num_rows), dtype=torch.long, device=device)
    if call.sliding_window is not None:
        program_first = (seq_lens_l - q_lens)[:, None] + (j // tiling.BLOCK_Q * tiling.BLOCK_Q)[None, :]  # [S, Lq]
        row_lo = window_tile_start(program_first, call.sliding_window, tiling.TILE_N)
        row_lo = row_lo.repeat_interleave(group, dim=1)[:, None, :]

    for tile_start in range(first_tile, kv_end, tiling.TILE_N):
        split_of = ((tile_start - row_lo) // split_size).clamp(min=0).minimum(last_split).expand(state_shape)[None]
        acc_index = split_of[..., None].expand(1, *state_shape, call.head_dim_v)
        m_i, l_i = m_all.gather(0, split_of)[0], l_all.gather(0, split_of)[0]
        acc = acc_all.gather(0, acc_index)[0]
        k_pos = torch.arange(tile_start, tile_start + tiling.TILE_N, device=device)  # [N]
        k_valid = k_pos[None, :] < seq_lens_l[:, None]  # [S, N]
        column = k_pos // block_size
        blocks = block_table[:, column.clamp(max=max_blocks - 1)].long()
        bad = k_valid & ((column >= max_blocks)[None, :] | (blocks < 0) | (blocks >= num_blocks))  # [S, N]
        blocks = torch.where(k_valid & ~bad, blocks, 0)
        slots = (k_pos % block_size).expand(num_seqs, -1)
        # An fp8 pool widened to the dots' dtype unscaled (exact); k_scale scales the logits, v_scale the acc.
        k = torch.where(k_valid[..., None, None], k_cache[blocks, slots].to(dot_dtype), 0)
        v = torch.where(k_valid[..., None, None], v_cache[blocks, slots].to(dot_dtype), 0)
        k = k.permute(0, 2, 1, 3).float()  # [S, Hkv, N, D]
        v = v.permute(0, 2, 1, 3)

        s = q_rows @ k.transpose(-1, -2)  # [S, Hkv, M, N], unscaled
        if k_scale is not None:
            s = s * k_scale
        if call.logit_softcap is not None:
            s = softcap_unscaled(s, call.logit_softcap / call.scale)
        distance = k_pos[None, None, None, :] - q_pos  # [S, 1, M, N] key_pos - query_pos
        if slopes_u is not None:
            s = s + slopes_u * distance.float()
        visible = (distance <= 0) & k_valid[:, None, None, :]
        if call.sliding_window is not None:
            visible = visible & (distance > -call.sliding_window)
        s = torch.where(visible, s, float("-inf"))
        m_new = torch.maximum(m_i, s.amax(-1))
        m_safe = torch.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: exp2 -> 0, not NaN
        if q.dtype == torch.float32:  # the kernel's two forms (kernels.triton_paged module docstring)
            alpha = torch.exp2((m_i - m_safe) * qk_scale_log2)
            p = torch.exp2((s - m_safe[..., None]) * qk_scale_log2)
        else:
            m_scaled = m_safe * qk_scale_log2
            alpha = torch.exp2(m_i * qk_scale_log2 - m_scaled)
            p = torch.exp2(s * qk_scale_log2 - m_scaled[..., None])
        sees_bad = (visible & bad[:, None, None, :]).any(-1)
        l_i = l_i * alpha + p.sum(-1) + torch.where(sees_bad, float("nan"), 0.0)
        acc = acc * alpha[..., None] + p.to(v.dtype).float() @ v.float()
        m_all.scatter_(0, split_of, m_new[None])
        l_all.scatter_(0, split_of, l_i[None])
        acc_all.scatter_(0, acc_index, acc[None])

    if call.v_scale is not None:  # each program's acc times its KV head's v_scale, before the combine
        acc_all = acc_all * call.v_scale.view(1, 1, num_kv_heads, 1, 1)
    sink = None
    if sinks_u is not None:  # [1, Hkv, M]: each row's head's sink, in unscaled units
        sink = sinks_u.view(1, num_kv_heads, 1, group).expand(1, num_kv_heads, longest_q, group)
        sink = sink.reshape(1, num_kv_heads, num_rows)
    if num_splits == 1:
        m_i, l_i, acc = m_all[0], l_all[0], acc_all[0]
        if sink is not None:  # the sink joins the denominator once, with no value
            m_tot = torch.maximum(m_i, sink)
            alpha = torch.exp2((m_i - m_tot) * qk_scale_log2)
            l_i = l_i * alpha + torch.exp2((sink - m_tot) * qk_scale_log2)
            acc = acc * alpha[..., None]
            m_i = m_tot
        o = acc / l_i[..., None]
        m_top, l_sum = m_i, l_i
    else:  # weight each split by 2^(its max - the overall max); a split that saw no key weighs 0
        m_top = m_all.amax(0)
        if sink is not None:
            m_top = torch.maximum(m_top, sink)
        weight = torch.exp2((m_all - m_top) * qk_scale_log2)
        l_sum = (l_all * weight).sum(0)
        if sink is not None:  # once, in the combine: not once per split
            l_sum = l_sum + torch.exp2((sink - m_top) * qk_scale_log2)
        o = (acc_all * weight[..., None]).sum(0) / l_sum[..., None]
    o = o.view(num_seqs, num_kv_heads, longest_q, group, call.head_dim_v)
    o = o.permute(0, 2, 1, 3, 4).reshape(num_seqs, longest_q, call.num_q_heads, call.head_dim_v)
    out[token_index[token_valid]] = o[token_valid].to(out.dtype)
    if lse is not None:  # [S, Hkv, M] in the kernel's row order -> [S, Lq, Hq]
        row_lse = (m_top * qk_scale_log2 + torch.log2(l_sum)) * LN2
        row_lse = row_lse.view(num_seqs, num_kv_heads, longest_q, group).permute(0, 2, 1, 3)
        lse[token_index[token_valid]] = row_lse.reshape(num_seqs, longest_q, call.num_q_heads)[token_valid]
