"""tlsim: the Triton kernel's algorithm in torch, so it runs anywhere and predicts the
kernel's numerics.

Same tiling as ``kernels.triton_paged`` (keys walked TILE_N positions at a time from
:func:`kernels._common.choose_tiling`, query rows ordered token-major then head within
the KV head's group), the same base-2 online softmax with running max and sum, the
same fp32 accumulation and the same cast of p to the value dtype before ``p @ v``.
It is vectorised over sequences, KV heads and query rows; the only Python loop is over
KV tiles. Tiles past a sequence's end are exact no-ops (alpha = 1, p = 0), so walking
every sequence to the longest one changes no bit of the result. Where the kernel splits
the KV range (few programs, long sequences), tlsim splits it at the same positions and
combines the splits with the kernel's formula.

What it cannot copy is the order of additions inside a dot product or a row sum, which
the GPU's matrix units choose; that is why it predicts the kernel closely, not exactly.
"""

from __future__ import annotations

import math

import torch

from ._common import prepare_call, prepare_out, tiling_for


def paged_attention_tlsim(
    q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, scale=None, out=None
) -> torch.Tensor:
    """Paged attention by the kernel's streaming algorithm; the contract of DESIGN.md.

    q               [num_tokens, num_q_heads, head_dim]
    k_cache/v_cache [num_blocks, block_size, num_kv_heads, head_dim]
    block_table     [num_seqs, max_blocks_per_seq] int32 (entries past a sequence's end ignored)
    seq_lens        [num_seqs] int32
    query_start_loc [num_seqs + 1] int32 or None (one query per sequence)
    returns         [num_tokens, num_q_heads, head_dim] in q's dtype
    """
    call = prepare_call(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale)
    out = prepare_out(call, out)
    num_tokens = q.shape[0]
    if call.num_seqs == 0 or num_tokens == 0:
        return out
    device = q.device
    q_lens = call.q_lens
    max_q_len = int(q_lens.max())
    kv_end = int(call.seq_lens.long()[q_lens > 0].max()) if bool((q_lens > 0).any()) else 0
    tiling = tiling_for(call, max_q_len, int(call.seq_lens.max()))
    num_seqs, num_kv_heads, group = call.num_seqs, call.num_kv_heads, call.group_size
    head_dim, block_size = call.head_dim, call.block_size
    seq_lens_l = call.seq_lens.long()

    # Queries padded per sequence: [num_seqs, max_q_len] token index, then rows ordered as
    # in the kernel: row = token * group + head_in_group.
    j = torch.arange(max_q_len, device=device)
    token_valid = j[None, :] < q_lens[:, None]  # [num_seqs, max_q_len]
    token_index = (call.query_start_loc[:-1, None].long() + j[None, :]).clamp(max=num_tokens - 1)
    q_pad = torch.where(token_valid[..., None, None], q[token_index], 0).float()  # [S, Lq, Hq, D]
    q_rows = q_pad.view(num_seqs, max_q_len, num_kv_heads, group, head_dim)
    q_rows = q_rows.permute(0, 2, 1, 3, 4).reshape(num_seqs, num_kv_heads, max_q_len * group, head_dim)
    q_pos = (seq_lens_l - q_lens)[:, None] + j[None, :]  # [S, Lq]
    q_pos = q_pos.repeat_interleave(group, dim=1)[:, None, :, None]  # [S, 1, M, 1]

    num_rows = max_q_len * group
    state_shape = (num_seqs, num_kv_heads, num_rows)
    qk_scale_log2 = call.scale * math.log2(math.e)
    max_blocks = block_table.shape[1]
    split_size = tiling.SPLIT_SIZE or kv_end or 1
    splits = []  # (m, l, acc) of each KV split, combined at the end as the kernel does

    for tile_start in range(0, kv_end, tiling.TILE_N):
        if tile_start % split_size == 0:  # a split starts: fresh running state
            m_i = torch.full(state_shape, float("-inf"), device=device)
            l_i = torch.zeros(state_shape, device=device)
            acc = torch.zeros((*state_shape, head_dim), device=device)
            splits.append(None)
        k_pos = torch.arange(tile_start, tile_start + tiling.TILE_N, device=device)  # [N]
        k_valid = k_pos[None, :] < seq_lens_l[:, None]  # [S, N]
        blocks = block_table[:, (k_pos // block_size).clamp(max=max_blocks - 1)].long()
        blocks = torch.where(k_valid, blocks, 0)
        slots = (k_pos % block_size).expand(num_seqs, -1)
        k = torch.where(k_valid[..., None, None], k_cache[blocks, slots], 0)  # [S, N, Hkv, D]
        v = torch.where(k_valid[..., None, None], v_cache[blocks, slots], 0)
        k = k.permute(0, 2, 1, 3).float()  # [S, Hkv, N, D]
        v = v.permute(0, 2, 1, 3)

        s = (q_rows @ k.transpose(-1, -2)) * qk_scale_log2  # [S, Hkv, M, N]
        visible = (k_pos[None, None, None, :] <= q_pos) & k_valid[:, None, None, :]
        s = torch.where(visible, s, float("-inf"))
        m_new = torch.maximum(m_i, s.amax(-1))
        m_safe = torch.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: exp2 -> 0, not NaN
        alpha = torch.exp2(m_i - m_safe)
        p = torch.exp2(s - m_safe[..., None])
        l_i = l_i * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + p.to(v.dtype).float() @ v.float()
        m_i = m_new
        splits[-1] = (m_i, l_i, acc)

    if len(splits) == 1:
        m_i, l_i, acc = splits[0]
        o = acc / l_i[..., None]
    else:  # weight each split by 2^(its max - the overall max); a split that saw no key weighs 0
        m_all = torch.stack([m for m, _, _ in splits])
        weight = torch.exp2(m_all - m_all.amax(0))
        l_sum = (torch.stack([sums for _, sums, _ in splits]) * weight).sum(0)
        o = (torch.stack([a for _, _, a in splits]) * weight[..., None]).sum(0) / l_sum[..., None]
    o = o.view(num_seqs, num_kv_heads, max_q_len, group, head_dim)
    o = o.permute(0, 2, 1, 3, 4).reshape(num_seqs, max_q_len, call.num_q_heads, head_dim)
    out[token_index[token_valid]] = o[token_valid].to(out.dtype)
    return out
