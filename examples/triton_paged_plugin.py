"""A paged-attention kernel written outside this project, plugged into the harness.

A plain Triton kernel and the one ``register_backend`` call that puts it in every run named with ``--plugin``:

    harness run examples/triton_paged_plugin.toml --plugin examples/triton_paged_plugin.py --backend example_triton
    python examples/triton_paged_plugin.py --no-timing   # the same; further arguments go to harness run

One program per (sequence, query head, tile of BLOCK_M queries) walks the sequence's pages in order, one page a
step, with the online softmax. Key position ``p`` is slot ``p % block_size`` of page ``block_table[s, p //
block_size]``. ``plan_launch`` picks BLOCK_M and the grid on the host, once per input set, outside the timed region."""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

from harness import register_backend

NAME = "example_triton"
BLOCK_M_MAX = 64  # queries of one program; decode uses the smallest tile tl.dot takes (16)


@triton.jit
def _paged_attention_kernel(
    # pointers
    q_ptr,  # [num_tokens, num_q_heads, HEAD_DIM]
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    v_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM_V]
    block_table_ptr,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens_ptr,  # [num_seqs] int32
    query_start_loc_ptr,  # [num_seqs + 1] int32 (unread when ONE_QUERY_PER_SEQ)
    out_ptr,  # [num_tokens, num_q_heads, HEAD_DIM_V]
    # sizes
    scale,  # softmax scale (fp32)
    softcap,  # logit cap (read when USE_SOFTCAP)
    window,  # sliding window W (read when USE_WINDOW)
    # strides (in elements)
    stride_q_tok, stride_q_head,
    stride_k_blk, stride_k_slot, stride_k_head,
    stride_v_blk, stride_v_slot, stride_v_head,
    stride_o_tok, stride_o_head,
    stride_table,
    # meta-parameters
    GROUP: tl.constexpr,  # num_q_heads // num_kv_heads
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # keys per page: one tile
    BLOCK_M: tl.constexpr,
    ONE_QUERY_PER_SEQ: tl.constexpr,  # query_start_loc None: sequence s's one query is token s
    USE_SOFTCAP: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 (no tf32), "tf32" otherwise (unused by fp16/bf16 dots)
):  # fmt: skip
    seq, head, tile = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    kv_head = head // GROUP
    seq_len = tl.load(seq_lens_ptr + seq)
    if ONE_QUERY_PER_SEQ:
        q_start = seq
        q_len = 1
    else:
        q_start = tl.load(query_start_loc_ptr + seq)
        q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if tile * BLOCK_M >= q_len:
        return
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # query index within the sequence
    row_ok = rows < q_len
    pos = seq_len - q_len + rows  # each query's key position
    dims = tl.arange(0, HEAD_DIM)
    dims_v = tl.arange(0, HEAD_DIM_V)
    slots = tl.arange(0, BLOCK_SIZE)

    q = tl.load(q_ptr + (q_start + rows)[:, None] * stride_q_tok + head * stride_q_head + dims[None, :],
                mask=row_ok[:, None], other=0.0)  # fmt: skip
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_V], tl.float32)

    last_pos = seq_len - q_len + tl.minimum((tile + 1) * BLOCK_M, q_len) - 1  # the tile's last query
    first_page = 0
    if USE_WINDOW:
        first_page = tl.maximum(seq_len - q_len + tile * BLOCK_M - window + 1, 0) // BLOCK_SIZE
    for page in range(first_page, last_pos // BLOCK_SIZE + 1):
        block = tl.load(block_table_ptr + seq * stride_table + page)
        keys = page * BLOCK_SIZE + slots
        key_ok = keys < seq_len  # the page's tail past the sequence holds anything (NaN, say)
        k = tl.load(k_cache_ptr + block * stride_k_blk + slots[:, None] * stride_k_slot + kv_head * stride_k_head
                    + dims[None, :], mask=key_ok[:, None], other=0.0)  # fmt: skip
        v = tl.load(v_cache_ptr + block * stride_v_blk + slots[:, None] * stride_v_slot + kv_head * stride_v_head
                    + dims_v[None, :], mask=key_ok[:, None], other=0.0)  # fmt: skip
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale  # [BLOCK_M, BLOCK_SIZE] fp32
        if USE_SOFTCAP:  # cap * tanh(s / cap), tanh spelled with exp2 (the interpreter has no tanh)
            t = tl.exp2(tl.abs(s / softcap) * (-2.0 * 1.4426950408889634))
            capped = softcap * ((1.0 - t) / (1.0 + t))
            s = tl.where(s < 0, -capped, capped)
        visible = (keys[None, :] <= pos[:, None]) & key_ok[None, :]
        if USE_WINDOW:
            visible = visible & (keys[None, :] > pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(out_ptr + (q_start + rows)[:, None] * stride_o_tok + head * stride_o_head + dims_v[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])  # fmt: skip


@dataclass(frozen=True)
class LaunchPlan:
    """What ``plan_launch`` decides on the host once per input set: the query tile and the grid."""

    block_m: int
    grid: tuple[int, int, int]  # (num_seqs, num_q_heads, query tiles of the longest query)


def plan_launch(facts) -> LaunchPlan:
    """The plan step: BLOCK_M the next power of two of the longest query (16..64), and the grid it gives."""
    block_m = min(BLOCK_M_MAX, max(16, triton.next_power_of_2(max(facts.max_q_len, 1))))
    return LaunchPlan(block_m, (facts.num_seqs, facts.num_q_heads, max(1, math.ceil(facts.max_q_len / block_m))))


def paged_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, scale=None, out=None, *,
                    plan: LaunchPlan, sliding_window=None, logit_softcap=None):  # fmt: skip
    """Paged attention of packed queries over a paged KV cache (causal, aligned to each sequence's end).

    q               [num_tokens, num_q_heads, head_dim] fp32/fp16/bf16
    k_cache         [num_blocks, block_size, num_kv_heads, head_dim], q's dtype
    v_cache         [num_blocks, block_size, num_kv_heads, head_dim_v], q's dtype
    block_table     [num_seqs, max_blocks_per_seq] int32
    seq_lens        [num_seqs] int32, keys of each sequence
    query_start_loc [num_seqs + 1] int32 cumulative query offsets, or None: one query per sequence
    scale           softmax scale; None: head_dim ** -0.5
    out             [num_tokens, num_q_heads, head_dim_v] in q's dtype, written and returned
    plan            :func:`plan_launch`'s result for these inputs
    sliding_window  W: a query sees its W most recent keys; logit_softcap: cap * tanh(z / cap)
    """
    num_tokens, num_q_heads, head_dim = q.shape
    head_dim_v = v_cache.shape[-1]
    if out is None:
        out = q.new_empty(num_tokens, num_q_heads, head_dim_v)
    if num_tokens == 0:
        return out
    one_query_per_seq = query_start_loc is None
    _paged_attention_kernel[plan.grid](
        q, k_cache, v_cache, block_table, seq_lens, seq_lens if one_query_per_seq else query_start_loc, out,
        head_dim**-0.5 if scale is None else scale, logit_softcap or 1.0, sliding_window or 1,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1), block_table.stride(0),
        GROUP=num_q_heads // k_cache.shape[2], HEAD_DIM=head_dim, HEAD_DIM_V=head_dim_v, BLOCK_SIZE=k_cache.shape[1],
        BLOCK_M=plan.block_m, ONE_QUERY_PER_SEQ=one_query_per_seq, USE_SOFTCAP=logit_softcap is not None,
        USE_WINDOW=sliding_window is not None, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )  # fmt: skip
    return out


# What the kernel serves. A case outside is a skip row naming the limit, decided before any call.
LIMITS = {
    "dtypes": ["float32", "float16", "bfloat16"],
    "head_dims": [32, 64, 128, 256],  # tl.arange needs a power of two
    "block_size_multiple_of": 16,  # a page is one tl.dot tile: at least 16 keys
    "cpu_tags": ["small"],  # on the CPU (Triton's interpreter: seconds a call) only cases tagged small
}

register_backend(NAME, paged_attention, ("cpu", "cuda"), description="an example Triton kernel, one page a tile",
                 variants=("sliding_window", "logit_softcap", "head_dim_v"), plan=plan_launch, limits=LIMITS)  # fmt: skip


def main(argv: list[str]) -> int:
    """``harness run`` of the example's cases (examples/triton_paged_plugin.toml) with this file as the plugin."""
    here = Path(__file__).resolve()
    command = ["run", str(here.with_suffix(".toml")), "--plugin", str(here), "--backend", NAME, *argv]
    return subprocess.run([sys.executable, "-m", "harness", *command]).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
