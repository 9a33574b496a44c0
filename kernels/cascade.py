"""Cascade attention: a shared prefix attended once per query, merged with the rest by the log-sum-exp.

Attention over keys A + B is the partial attentions over A and over B, each normalised on its own, weighted by
their denominators (lse: the natural log of a part's denominator; docs/contract.md, "The log-sum-exp"):

    lse = ln(exp(lse_a) + exp(lse_b))
    out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b

An engine serves sequences that share a prompt so (vLLM's cascade attention, FlashInfer's
MultiLevelCascadeAttentionWrapper): each query over the shared prefix's keys, then the usual causal call over
each sequence's own keys, merged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def merge_attention_states(out_a, lse_a, out_b, lse_b, out=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attentions of the same queries over disjoint key sets.

    out_a/out_b [num_tokens, num_q_heads, head_dim_v], any float dtype (each normalised by its own part)
    lse_a/lse_b [num_tokens, num_q_heads] fp32, the natural log of each part's denominator
    out         optional buffer like out_a, written and returned
    returns     (out [num_tokens, num_q_heads, head_dim_v] in out_a's dtype, lse [num_tokens, num_q_heads] fp32),
                merged in fp32; a part that saw no key (lse -inf) weighs 0
    """
    lse = torch.logaddexp(lse_a.float(), lse_b.float())
    weight_a = torch.exp(lse_a.float() - lse)[..., None]
    weight_b = torch.exp(lse_b.float() - lse)[..., None]
    merged = weight_a * out_a.float() + weight_b * out_b.float()
    if out is None:
        return merged.to(out_a.dtype), lse
    out.copy_(merged)
    return out, lse


def cascade_attention(fn: Callable, q, k_cache, v_cache, block_table, seq_lens, query_start_loc, prefix_blocks: int,
                      scale=None, out=None, *, logit_softcap: float | None = None, sinks: torch.Tensor | None = None,
                      **hints) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The contract's attention, as a shared-prefix part and a suffix part merged by their lse.

    fn              a contract function that takes return_lse (kernels.paged_attention_*)
    block_table     [num_seqs, max_blocks_per_seq] int32 whose first ``prefix_blocks`` columns are
                    the same blocks in every row (the shared prefix)
    prefix_blocks   host int P_b; the prefix is P = P_b * block_size keys, and every query must
                    sit after it (seq_len - q_len >= P for each sequence), so it sees all of it
    other arguments as in the contract; returns (out, lse) as fn(..., return_lse=True) would

    The prefix part is each query token over the same P keys (one query per "sequence"); the suffix part is the
    call itself on the columns after the prefix (seq_lens - P). The softcap applies to both; the sink joins the
    prefix's denominator only. A window or ALiBi depends on positions the prefix part drops: refused. ``hints``
    (check, max_q_len) go to both calls.
    """
    if hints.get("sliding_window") is not None or hints.get("alibi_slopes") is not None:
        raise ValueError("cascade_attention: sliding_window and alibi_slopes depend on positions the prefix part drops")
    hints = {k: v for k, v in hints.items() if k not in ("sliding_window", "alibi_slopes", "max_seq_len")}
    block_size = k_cache.shape[1]
    prefix_len = prefix_blocks * block_size
    num_tokens = q.shape[0]
    if query_start_loc is None:
        query_start_loc = torch.arange(seq_lens.shape[0] + 1, dtype=torch.int32, device=q.device)
    prefix_table = block_table[:1, :prefix_blocks].expand(num_tokens, -1).contiguous()
    prefix_lens = torch.full((num_tokens,), prefix_len, dtype=torch.int32, device=q.device)
    out_a, lse_a = fn(q, k_cache, v_cache, prefix_table, prefix_lens, None, scale, return_lse=True,
                      logit_softcap=logit_softcap, sinks=sinks, **hints)  # fmt: skip
    suffix_table = block_table[:, prefix_blocks:].contiguous()
    if suffix_table.shape[1] == 0:
        suffix_table = torch.full((block_table.shape[0], 1), -1, dtype=torch.int32, device=q.device)
    out_b, lse_b = fn(q, k_cache, v_cache, suffix_table, seq_lens - prefix_len, query_start_loc, scale,
                      return_lse=True, logit_softcap=logit_softcap, **hints)  # fmt: skip
    return merge_attention_states(out_a, lse_a, out_b, lse_b, out=out)
