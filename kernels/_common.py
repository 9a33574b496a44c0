"""Argument checks and the tiling shared by the Triton kernel and its torch model.

Both ``paged_attention_triton`` and ``paged_attention_tlsim`` call
:func:`prepare_call` and :func:`choose_tiling`, so the model can never drift from the
kernel's tile sizes or its view of the inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MIN_HEAD_DIM, MAX_HEAD_DIM = 32, 256
MIN_BLOCK_SIZE, MAX_BLOCK_SIZE = 1, 256


@dataclass(frozen=True)
class PagedCall:
    """A validated paged-attention call, with the derived sizes every backend needs.

    q               [num_tokens, num_q_heads, head_dim]
    k_cache/v_cache [num_blocks, block_size, num_kv_heads, head_dim]
    block_table     [num_seqs, max_blocks_per_seq] int32
    seq_lens        [num_seqs] int32
    query_start_loc [num_seqs + 1] int32 (never None here: decode is filled in)
    """

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    scale: float
    num_seqs: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int

    @property
    def group_size(self) -> int:
        """Query heads that share one KV head (1 = MHA, num_q_heads = MQA)."""
        return self.num_q_heads // self.num_kv_heads

    @property
    def q_lens(self) -> torch.Tensor:
        """[num_seqs] int64: queries of each sequence."""
        return (self.query_start_loc[1:] - self.query_start_loc[:-1]).long()


def _fail(msg: str) -> None:
    raise ValueError(f"paged attention: {msg}")


def prepare_call(
    q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, scale=None, check_values=True
) -> PagedCall:
    """Check shapes, dtypes and devices of a call against the contract; fill in defaults.

    Raises ValueError naming the offending argument. ``query_start_loc=None`` means one
    query per sequence (decode) and becomes ``arange(num_seqs + 1)``.
    ``check_values=False`` skips the checks that read tensor values (q_len <= seq_len,
    lengths within the table, the query total): each is a device-to-host sync, which a
    CUDA-graph capture forbids. Shapes, dtypes and devices are always checked.
    """
    if q.dim() != 3:
        _fail(f"q must be [num_tokens, num_q_heads, head_dim], got shape {tuple(q.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        _fail(
            "k_cache and v_cache must both be [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    num_tokens, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, kv_head_dim = k_cache.shape
    if kv_head_dim != head_dim:
        _fail(f"head_dim of q ({head_dim}) and of the caches ({kv_head_dim}) differ")
    if num_q_heads % num_kv_heads:
        _fail(f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if q.dtype not in SUPPORTED_DTYPES or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        _fail(f"q, k_cache, v_cache must share one of fp32/fp16/bf16, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if block_table.dim() != 2 or seq_lens.dim() != 1 or block_table.shape[0] != seq_lens.shape[0]:
        _fail(
            "block_table must be [num_seqs, max_blocks_per_seq] and seq_lens [num_seqs], "
            f"got {tuple(block_table.shape)} and {tuple(seq_lens.shape)}"
        )
    if block_table.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        _fail(f"block_table and seq_lens must be int32, got {block_table.dtype} and {seq_lens.dtype}")
    num_seqs = seq_lens.shape[0]
    devices = {t.device for t in (q, k_cache, v_cache, block_table, seq_lens)}
    if query_start_loc is None:
        if num_tokens != num_seqs:
            _fail(
                f"query_start_loc=None means one query per sequence, but q has {num_tokens} rows for {num_seqs} sequences"
            )
        query_start_loc = torch.arange(num_seqs + 1, dtype=torch.int32, device=q.device)
    else:
        devices.add(query_start_loc.device)
        if query_start_loc.shape != (num_seqs + 1,) or query_start_loc.dtype != torch.int32:
            _fail(
                f"query_start_loc must be int32 [num_seqs + 1] = [{num_seqs + 1}], got {query_start_loc.dtype} {tuple(query_start_loc.shape)}"
            )
        if check_values and int(query_start_loc[-1]) != num_tokens:
            _fail(f"query_start_loc[-1] ({int(query_start_loc[-1])}) must equal num_tokens ({num_tokens})")
    if len(devices) != 1:
        _fail(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    if check_values:
        q_lens = (query_start_loc[1:] - query_start_loc[:-1]).long()
        if bool((q_lens < 0).any()) or bool((q_lens > seq_lens.long()).any()):
            _fail("every sequence needs 0 <= q_len <= seq_len (query_start_loc must be non-decreasing)")
        if seq_lens.numel() and int(seq_lens.max()) > block_table.shape[1] * block_size:
            _fail(f"a seq_len exceeds max_blocks_per_seq * block_size = {block_table.shape[1] * block_size}")
    return PagedCall(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        block_table=block_table,
        seq_lens=seq_lens,
        query_start_loc=query_start_loc,
        scale=float(head_dim**-0.5 if scale is None else scale),
        num_seqs=num_seqs,
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
    )


def prepare_out(call: PagedCall, out: torch.Tensor | None) -> torch.Tensor:
    """Return ``out`` after checking it matches q, or a fresh buffer shaped like q."""
    if out is None:
        return torch.empty_like(call.q)
    if out.shape != call.q.shape or out.dtype != call.q.dtype or out.device != call.q.device:
        _fail(f"out must match q ({tuple(call.q.shape)}, {call.q.dtype}), got {tuple(out.shape)}, {out.dtype}")
    return out


@dataclass(frozen=True)
class Tiling:
    """How the kernel cuts the work.

    One program owns one (sequence, KV head, query tile, KV split). Its BLOCK_M rows are
    BLOCK_Q query tokens times the group's query heads (row r = token r // group_size,
    head r % group_size), so a KV tile is loaded once and used by every query head of
    its group. KV is walked in TILE_N key positions at a time, independent of
    block_size, with an online softmax across tiles.

    When there are too few programs to fill the GPU (long contexts, few sequences, one
    KV head per GPU), each sequence's KV range is cut into NUM_SPLITS pieces of
    SPLIT_SIZE positions (a multiple of TILE_N, so tile boundaries do not move); each
    piece keeps its own (max, sum, accumulator) and a second pass combines them.

    Example: GQA 32/8 heads (group 4), BLOCK_M 16 gives BLOCK_Q = 4 tokens a program;
    decode of 4 sequences of 131072 tokens is 4 * 8 = 32 programs, so the range is cut
    in 16 splits of 8192 positions (512 programs).
    """

    BLOCK_M: int
    BLOCK_Q: int
    TILE_N: int
    HEAD_DIM_PADDED: int
    NUM_SPLITS: int = 1
    SPLIT_SIZE: int = 0  # 0 when NUM_SPLITS == 1
    NUM_WARPS: int = 4  # launch setting (no effect on numerics)


# Programs the split aims for: two waves of an H100/H200's 132 SMs. A constant, not the
# device's SM count, so that tlsim makes the same split (and so the same numerics) anywhere.
TARGET_PROGRAMS = 264
MIN_TILES_PER_SPLIT = 8
MAX_SPLITS = 64


def choose_tiling(
    head_dim: int,
    group_size: int,
    max_q_len: int,
    num_seqs: int = 1,
    num_kv_heads: int = 1,
    max_seq_len: int = 0,
    fp32: bool = False,
) -> Tiling:
    """Tile sizes and KV split for a call; the kernel launcher and tlsim both use exactly these.

    ``max_seq_len`` 0 (unknown) means no split. ``fp32`` inputs keep BLOCK_M at 16: their
    dots run in IEEE fp32 on CUDA cores, and a 64-row tile spills registers (measured on an
    H200, gpu_results/2026-11-29-h200-tile-probe: prefill at head_dim 128 took 46 ms with
    BLOCK_M 64 and 3.7 ms with 16). Half-precision tiles keep 64 rows for tensor cores.
    """
    if group_size > 128:
        _fail(f"group_size (num_q_heads // num_kv_heads) {group_size} is above the kernel's limit of 128")
    head_dim_padded = max(16, next_pow2(head_dim))
    if group_size >= 16:  # one token's heads already fill tl.dot's minimum M of 16
        block_m = next_pow2(group_size)
    else:  # decode pads the group up to 16 rows; prefill packs up to 16 tokens, at most 64 rows
        block_m = min(16 if fp32 else 64, max(16, next_pow2(group_size * min(max(max_q_len, 1), 16))))
    tile_n = 64 if head_dim_padded <= 128 else 32
    block_q = block_m // group_size
    programs = num_seqs * num_kv_heads * cdiv(max(max_q_len, 1), block_q)
    num_splits = 1
    if programs < TARGET_PROGRAMS // 2:
        by_work = next_pow2(cdiv(TARGET_PROGRAMS, programs))
        by_length = max_seq_len // (MIN_TILES_PER_SPLIT * tile_n)
        while num_splits * 2 <= min(by_work, by_length, MAX_SPLITS):
            num_splits *= 2
    # Each split covers ceil(max_seq_len / num_splits) positions, rounded up to whole tiles.
    split_size = cdiv(cdiv(max_seq_len, num_splits), tile_n) * tile_n if num_splits > 1 else 0
    return Tiling(
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        TILE_N=tile_n,
        HEAD_DIM_PADDED=head_dim_padded,
        NUM_SPLITS=num_splits,
        SPLIT_SIZE=split_size,
        NUM_WARPS=4 if block_m * head_dim_padded <= 64 * 128 else 8,
    )


def tiling_for(call: PagedCall, max_q_len: int, max_seq_len: int) -> Tiling:
    """The tiling of one call: what the launcher runs and what tlsim models, from one place."""
    return choose_tiling(
        call.head_dim,
        call.group_size,
        max_q_len,
        call.num_seqs,
        call.num_kv_heads,
        max_seq_len,
        fp32=call.q.dtype == torch.float32,
    )


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for non-negative ints."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (same as triton.next_power_of_2, without importing Triton)."""
    return 1 if n <= 1 else 2 ** math.ceil(math.log2(n))
