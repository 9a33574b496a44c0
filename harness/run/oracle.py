"""The harness's truth: attention in float64 on the CPU, written from the definition; it shares no code with
the backends it grades (each variant enters through its oracle hook)."""

from collections.abc import Iterator
from functools import partial

import torch

from harness.cases.variants import VARIANTS

CHUNK_BYTES = 1 << 30  # float64 logits of one chunk of query rows: about 1 GiB


def paged_attention_oracle(q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, scale=None, device="cpu",
                           *, return_lse: bool = False, **options):  # fmt: skip
    """Exact paged attention, with the variants of docs/contract.md ("Attention variants").

    q               [num_tokens, num_q_heads, head_dim]
    k_cache         [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache         [num_blocks, block_size, num_kv_heads, head_dim_v]
    block_table     [num_seqs, max_blocks_per_seq] int
    seq_lens        [num_seqs] int
    query_start_loc [num_seqs + 1] int, or None for one query per sequence
    device          where the float64 arithmetic runs (the CPU by default)
    options         the variants' keywords, as the kernel call takes them; fp8 scales dequantize exactly
    return_lse      also return lse [num_tokens, num_q_heads] float64: ln(S + sum_j exp(l_j)), sink included
    returns         [num_tokens, num_q_heads, head_dim_v] float64 on ``device`` (with return_lse: (out, lse))"""
    keywords = [keyword for v in VARIANTS for keyword in v.keywords if keyword != "return_lse"]
    if unknown := sorted(set(options) - set(keywords)):
        raise TypeError(f"paged_attention_oracle got unexpected keyword(s) {unknown}; the variants': {keywords}")
    # Per stage, the hooks of the variants whose keywords ``options`` gives, bound to them.
    given = [(v.oracle, {k: options[k] for k in v.keywords if options.get(k) is not None}) for v in VARIANTS]
    kv_hooks, score_hooks, mask_hooks, sink_hooks = (
        [partial(getattr(hook, stage), **keywords) for hook, keywords in given if keywords and getattr(hook, stage)]
        for stage in ("kv", "score", "mask", "sink")
    )
    q = q.detach().to(device, torch.float64)
    num_kv_heads, head_dim = k_cache.shape[2:]
    head_dim_v = v_cache.shape[-1]
    num_q_heads = q.shape[1]
    group = num_q_heads // num_kv_heads  # query head h reads KV head h // group
    scale = head_dim**-0.5 if scale is None else float(scale)

    expected = torch.zeros((*q.shape[:2], head_dim_v), dtype=torch.float64, device=device)
    lse = torch.zeros(q.shape[:2], dtype=torch.float64, device=device)
    for start, q_len, seq_len, k, v in sequences(k_cache, v_cache, block_table, seq_lens, query_start_loc, device):
        for hook in kv_hooks:
            k, v = hook(k, v)
        pos = torch.arange(seq_len, device=device)
        # Query rows go in chunks so the float64 logits stay near CHUNK_BYTES, whatever the case.
        rows_per_chunk = max(1, CHUNK_BYTES // (8 * num_q_heads * seq_len))
        for first in range(0, q_len, rows_per_chunk):
            last = min(q_len, first + rows_per_chunk)
            rows, span = last - first, slice(start + first, start + last)
            qs = q[span].view(rows, num_kv_heads, group, head_dim)
            logits = torch.einsum("qhgd,khd->hgqk", qs, k) * scale  # [num_kv_heads, group, rows, seq_len]
            q_pos = seq_len - q_len + first + torch.arange(rows, device=device)
            distance = pos[None, :] - q_pos[:, None]  # [rows, seq_len]: key_pos - query_pos, <= 0 where seen
            for hook in score_hooks:
                logits = hook(logits, distance)
            hidden = distance > 0
            for hook in mask_hooks:
                hidden = hidden | hook(distance)
            logits = logits.masked_fill(hidden[None, None], float("-inf"))
            sinks = [hook(logits) for hook in sink_hooks]  # each [num_kv_heads, group, 1, 1]
            top = logits.amax(-1, keepdim=True)
            for sink in sinks:
                top = torch.maximum(top, sink)
            weights = torch.exp(logits - top)
            denominator = weights.sum(-1, keepdim=True)
            for sink in sinks:
                denominator = denominator + torch.exp(sink - top)
            weights = weights / denominator
            lse[span] = (top + denominator.log()).permute(2, 0, 1, 3).reshape(rows, num_q_heads)
            expected[span] = torch.einsum("hgqk,khd->qhgd", weights, v).reshape(rows, num_q_heads, head_dim_v)
    return (expected, lse) if return_lse else expected


def sequences(k_cache, v_cache, block_table, seq_lens, query_start_loc, device) -> Iterator[tuple]:
    """(first query row, q_len, seq_len, k, v) of each sequence with queries (query_start_loc None: one each), its
    keys and values in float64 on ``device`` (an fp8 pool's raw values: its scales are the caller's).

    k_cache         [num_blocks, block_size, num_kv_heads, head_dim], any dtype
    v_cache         [num_blocks, block_size, num_kv_heads, head_dim_v]
    yields          k [seq_len, num_kv_heads, head_dim], v [seq_len, num_kv_heads, head_dim_v]"""
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    k_slots = k_cache.detach().reshape(num_blocks * block_size, num_kv_heads, head_dim)
    v_slots = v_cache.detach().reshape(num_blocks * block_size, num_kv_heads, v_cache.shape[-1])
    table, lens = block_table.detach().cpu().long(), seq_lens.detach().cpu().tolist()
    starts = list(range(len(lens) + 1)) if query_start_loc is None else query_start_loc.detach().cpu().tolist()
    for seq, seq_len in enumerate(lens):
        if q_len := starts[seq + 1] - starts[seq]:
            pos = torch.arange(seq_len)
            slots = (table[seq, pos // block_size] * block_size + pos % block_size).to(k_cache.device)
            yield starts[seq], q_len, seq_len, *(x[slots].to(device, torch.float64) for x in (k_slots, v_slots))
