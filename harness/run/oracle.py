"""The harness's truth: attention in float64 on the CPU, written from the definition.

It shares no code with the backends it grades: slots are found by flat index
(``block * block_size + offset``), the softmax is spelled out, and every number is
float64, so its own rounding is about 1e-16, far under any tolerance graded against it.
"""

from __future__ import annotations

import torch

CHUNK_BYTES = 1 << 30  # float64 logits of one chunk of query rows: about 1 GiB


def paged_attention_oracle(
    q,
    k_cache,
    v_cache,
    block_table,
    seq_lens,
    query_start_loc=None,
    scale=None,
    device="cpu",
    *,
    sliding_window: int | None = None,
    logit_softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    return_lse: bool = False,
    k_scale: float | torch.Tensor | None = None,
    v_scale: float | torch.Tensor | None = None,
):
    """Exact paged attention, with the variants of docs/contract.md ("Attention variants").

    q               [num_tokens, num_q_heads, head_dim]
    k_cache         [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache         [num_blocks, block_size, num_kv_heads, head_dim_v] (MLA: head_dim_v may differ)
    block_table     [num_seqs, max_blocks_per_seq] int
    seq_lens        [num_seqs] int
    query_start_loc [num_seqs + 1] int, or None for one query per sequence
    device          where the float64 arithmetic runs (the CPU by default)
    sliding_window  W: the query at position p sees keys p - W + 1 .. p only
    logit_softcap   cap: each scaled logit z becomes cap * tanh(z / cap), before any mask or bias
    sinks           [num_q_heads]: a logit per head that joins the softmax's denominator only
    alibi_slopes    [num_q_heads]: slope_h * (key_pos - query_pos) added to the (capped) logit
    k_scale/v_scale an fp8 cache's scales (float, or [1] / [num_kv_heads]): the oracle attends over
                    the dequantized cache k_cache * k_scale, exactly (float64), so the grade measures
                    the kernel and not the quantization
    return_lse      also return lse [num_tokens, num_q_heads] float64: ln(S + sum_j exp(l_j)),
                    the log of the softmax's denominator, the sink's term S included
    returns         [num_tokens, num_q_heads, head_dim_v] float64 on ``device`` (with return_lse: (out, lse))
    """
    q = q.detach().to(device, torch.float64)
    num_kv_heads, head_dim = k_cache.shape[2:]
    head_dim_v = v_cache.shape[-1]
    table = block_table.detach().cpu().long()
    lens = seq_lens.detach().cpu().tolist()
    num_seqs = len(lens)
    if query_start_loc is None:
        starts = list(range(num_seqs + 1))
    else:
        starts = query_start_loc.detach().cpu().tolist()
    num_q_heads = q.shape[1]
    group = num_q_heads // num_kv_heads  # query head h reads KV head h // group
    scale = head_dim**-0.5 if scale is None else float(scale)

    k_mult, v_mult = (_kv_multiplier(x, num_kv_heads, device) for x in (k_scale, v_scale))
    sink = None if sinks is None else sinks.detach().to(device, torch.float64).view(num_kv_heads, group, 1, 1)
    slope = None if alibi_slopes is None else alibi_slopes.detach().to(device, torch.float64)
    slope = None if slope is None else slope.view(num_kv_heads, group, 1, 1)

    expected = torch.zeros((*q.shape[:2], head_dim_v), dtype=torch.float64, device=device)
    lse = torch.zeros(q.shape[:2], dtype=torch.float64, device=device)
    for seq in range(num_seqs):
        q_len, seq_len = starts[seq + 1] - starts[seq], lens[seq]
        if q_len == 0:
            continue
        k, v = sequence_kv(k_cache, v_cache, table[seq], seq_len, device)  # [seq_len, num_kv_heads, head_dim(_v)]
        k, v = k * k_mult, v * v_mult
        pos = torch.arange(seq_len, device=device)
        # Query rows go in chunks so the float64 logits stay near CHUNK_BYTES, whatever the case.
        rows_per_chunk = max(1, CHUNK_BYTES // (8 * num_q_heads * seq_len))
        for first in range(0, q_len, rows_per_chunk):
            last = min(q_len, first + rows_per_chunk)
            rows = last - first
            qs = q[starts[seq] + first : starts[seq] + last].view(rows, num_kv_heads, group, head_dim)
            logits = torch.einsum("qhgd,khd->hgqk", qs, k) * scale  # [num_kv_heads, group, rows, seq_len]
            q_pos = seq_len - q_len + first + torch.arange(rows, device=device)
            if logit_softcap is not None:
                logits = logit_softcap * torch.tanh(logits / logit_softcap)
            distance = pos[None, :] - q_pos[:, None]  # [rows, seq_len]: key_pos - query_pos, <= 0 where seen
            if slope is not None:
                logits = logits + slope * distance.to(torch.float64)
            hidden = distance > 0
            if sliding_window is not None:
                hidden = hidden | (distance <= -sliding_window)
            logits = logits.masked_fill(hidden[None, None], float("-inf"))
            top = logits.amax(-1, keepdim=True)
            if sink is not None:
                top = torch.maximum(top, sink)
            weights = torch.exp(logits - top)
            denominator = weights.sum(-1, keepdim=True)
            if sink is not None:
                denominator = denominator + torch.exp(sink - top)
            weights = weights / denominator
            lse[starts[seq] + first : starts[seq] + last] = (
                (top + denominator.log()).permute(2, 0, 1, 3).reshape(rows, num_q_heads)
            )
            o = torch.einsum("hgqk,khd->qhgd", weights, v)
            expected[starts[seq] + first : starts[seq] + last] = o.reshape(rows, num_q_heads, head_dim_v)
    return (expected, lse) if return_lse else expected


def sequence_kv(k_cache, v_cache, table_row, seq_len: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's keys and values in float64, gathered slot by slot.

    Key position p sits at slot ``table_row[p // block_size] * block_size + p % block_size``
    of the pool flattened to slots (block 7, offset 3, block_size 16: slot 7 * 16 + 3 = 115).

    k_cache         [num_blocks, block_size, num_kv_heads, head_dim], any dtype (no float64
                    copy of the pool is made, only of the sequence's rows)
    v_cache         [num_blocks, block_size, num_kv_heads, head_dim_v]
    table_row       [max_blocks_per_seq] int64 on the CPU: the sequence's row of the block table
    returns         k [seq_len, num_kv_heads, head_dim], v [seq_len, num_kv_heads, head_dim_v],
                    float64 on ``device`` (an fp8 pool's raw values: its scales are the caller's)
    """
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    pos = torch.arange(seq_len)
    slots = (table_row[pos // block_size] * block_size + pos % block_size).to(k_cache.device)
    k = k_cache.detach().reshape(num_blocks * block_size, num_kv_heads, head_dim)[slots]
    v = v_cache.detach().reshape(num_blocks * block_size, num_kv_heads, v_cache.shape[-1])[slots]
    return k.to(device, torch.float64), v.to(device, torch.float64)


def _kv_multiplier(scale, num_kv_heads: int, device) -> torch.Tensor:
    """[num_kv_heads, 1] float64: an fp8 cache's scale per KV head (1 when None)."""
    if scale is None:
        scale = 1.0
    if not isinstance(scale, torch.Tensor):
        scale = torch.tensor([float(scale)])
    return scale.detach().to(device, torch.float64).reshape(-1).expand(num_kv_heads)[:, None]
