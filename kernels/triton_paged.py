"""Paged attention as one Triton kernel: decode, chunked prefill and GQA in a single launch.

* One program owns one (query tile, KV head, KV split) (``kernels.tiling.Tiling``), so each KV tile is loaded
  once and shared by the group's query heads; the device split's programs go longest piece first.
* The launch reads no tensor value (no device sync; CUDA-graph capturable): the grid is sized from num_tokens
  and num_seqs alone, and each program finds its sequence by a binary search over query_start_loc (``_find_seq``).
* Online softmax in base 2 on the unscaled logits ``s = q . k``, the accumulator rescaled at every tile. fp32
  scales after subtracting the max (``s - m`` is exact near the max; scaling first rounds large logits:
  ``large_logits_q40``); fp16 and bf16, whose p is rounded to 8 or 11 bits anyway, use ``exp2(s * c - m * c)``.
* Causality (docs/contract.md): the tile loop stops at the last position any row of the program can see.
* The variants (docs/contract.md, "Attention variants") are constexpr switches in units of the unscaled logit:
  softcap ``c * tanh(s / c)`` with c = cap / scale, ALiBi ``(slope / scale) * (key_pos - query_pos)``, a sink
  ``sink / scale`` in the denominator once at the end; the window's loop starts at the first tile the
  program's earliest query sees (``kernels.tiling.window_tile_start``).
* An fp8 cache (KV_FP8) is widened exactly to the dots' dtype, k_scale applied to the logits and v_scale to the
  accumulator. A decode dots in fp16 under bf16 q too (FP16_DOTS, ``_q_to_fp16``: fp8 -> fp16 is one native
  conversion, fp8 -> bf16 goes through fp32 on sm_90) and reads V as uint16 pairs of dims (V_PAIRS).
* Wide heads (MLA; docs/contract.md, "V's head dim (MLA)"): K past 256 columns is two power-of-two pieces
  (DIM_MAIN + DIM_TAIL), a large group's heads are tiled (HEADS_PER_PROGRAM), V's dims may be too (V_PARTS),
  and a latent cache's p @ v takes the K tile already loaded (SHARED_KV).
* Indices are never trusted with memory: a query row past num_tokens is not touched, and a program whose tiles
  would read a block id outside [0, num_blocks) or past the table walks no tile and writes NaN rows.

Both dots accumulate in fp32; fp32 inputs dot in IEEE fp32 (TF32 fails the fp32 tolerance); p is cast to the
value dtype before ``p @ v``, as FlashAttention does. ``kernels.tlsim`` is this algorithm in torch: keep them in
step. On sm_90 a prefill with no variant but a window runs ``kernels.gluon_prefill`` instead (TMA copies of a
paged tile, which Triton does not make).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import gluon_prefill
from .contract import PagedCall, contiguous_strides, contract_entry
from .launch_plan import KernelLaunch, PlanCache
from .tiling import (
    LONGEST_FIRST_MAX_SEQS,
    cdiv,
    head_dim_pieces,
    heads_per_program,
    latent_kv,
    next_pow2,
    tiling_for,
    v_parts,
)


@triton.jit
def _bf16_rne(x):
    """fp32 -> bf16 rounded to nearest even on the bits (finite inputs): the CPU interpreter truncates such
    casts and multiplies bf16 dot operands as integers, so under it the kernel rounds by hand and dots in fp32."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = bits + 0x7FFF + ((bits >> 16) & 1)
    return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _softcap(s, cap_unscaled, inv_cap_unscaled):
    """c * tanh(s / c), c = cap / scale, as tanh|x| = (1 - t) / (1 + t), t = 2^(-2 |x| log2 e): exp2 only (the
    interpreter has no tanh), no overflow. kernels.tlsim.softcap_unscaled is the same expression."""
    x = s * inv_cap_unscaled
    t = tl.exp2(tl.abs(x) * (-2.0 * 1.4426950408889634))
    y = cap_unscaled * ((1.0 - t) / (1.0 + t))
    return tl.where(x < 0, -y, y)


@triton.jit
def _widen_fp8(x, out_dtype: tl.constexpr, INTERPRETED_BF16: tl.constexpr, DIRECT_FP16: tl.constexpr):
    """An fp8 tile in the dots' dtype, unscaled: exact (every fp8 value is an fp16 and a bf16 value). The scales
    apply outside the dots, so the kernel makes no rounding the dequantized cache's oracle does not. DIRECT_FP16:
    fp8 -> fp16 in one native conversion; otherwise through fp32 (no direct fp8 -> bf16 on sm_90)."""
    if INTERPRETED_BF16:
        return x.to(tl.float32)
    if DIRECT_FP16 and out_dtype == tl.float16:
        return x.to(tl.float16)
    return x.to(tl.float32).to(out_dtype)


@triton.jit
def _split_pairs(pair, fp8: tl.constexpr, INTERPRETED: tl.constexpr):
    """uint16 elements holding two fp8 values (low byte, high byte) -> the two as fp16 tensors, exactly. On the GPU
    a byte permute and the native fp8x2 -> f16x2 conversion each: 4 instructions for 4 values."""
    if INTERPRETED:
        return ((pair & 0xFF).to(tl.uint8).to(fp8, bitcast=True).to(tl.float16),
                (pair >> 8).to(tl.uint8).to(fp8, bitcast=True).to(tl.float16))  # fmt: skip
    if fp8 == tl.float8e5:
        return tl.inline_asm_elementwise(
            """{ .reg .b32 t; .reg .b16 lo, hi;
            prmt.b32 t, $2, 0, 0x0020; mov.b32 {lo, hi}, t; cvt.rn.f16x2.e5m2x2 $0, lo;
            prmt.b32 t, $2, 0, 0x0031; mov.b32 {lo, hi}, t; cvt.rn.f16x2.e5m2x2 $1, lo; }""",
            "=r,=r,r", [pair], dtype=(tl.float16, tl.float16), is_pure=True, pack=2)  # fmt: skip
    return tl.inline_asm_elementwise(
        """{ .reg .b32 t; .reg .b16 lo, hi;
        prmt.b32 t, $2, 0, 0x0020; mov.b32 {lo, hi}, t; cvt.rn.f16x2.e4m3x2 $0, lo;
        prmt.b32 t, $2, 0, 0x0031; mov.b32 {lo, hi}, t; cvt.rn.f16x2.e4m3x2 $1, lo; }""",
        "=r,=r,r", [pair], dtype=(tl.float16, tl.float16), is_pure=True, pack=2)  # fmt: skip


@triton.jit
def _q_to_fp16(q, q_tail, DIM_TAIL: tl.constexpr):
    """bf16 q [BLOCK_M, DIM_MAIN] (and q_tail) as fp16 for dots with an fp16-widened fp8 cache: each row times
    2^j, which puts its largest |element| in [2^14, 2^15); returns (q16, q_tail16, unscale [BLOCK_M] = 2^-j).
    Exact for elements at least 2^-31 of the row's largest; smaller ones round far below the dot's own fp32
    rounding. j is clamped to [-126, 126] so that 2^j and 2^-j are normal fp32."""
    amax = tl.max(tl.abs(q.to(tl.float32)), 1)
    if DIM_TAIL > 0:
        amax = tl.maximum(amax, tl.max(tl.abs(q_tail.to(tl.float32)), 1))
    biased_exponent = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF  # 0 for a zero row
    j = tl.minimum(tl.maximum(141 - biased_exponent, -126), 126)  # 141 = 127 + 14
    up = ((j + 127) << 23).to(tl.float32, bitcast=True)
    unscale = ((127 - j) << 23).to(tl.float32, bitcast=True)
    q16 = (q.to(tl.float32) * up[:, None]).to(tl.float16)
    q_tail16 = (q_tail.to(tl.float32) * up[:, None]).to(tl.float16)
    return q16, q_tail16, unscale


@triton.jit
def _find_seq(query_start_loc_ptr, q_tile, num_seqs, BLOCK_Q: tl.constexpr):
    """(the sequence that owns query tile ``q_tile``, the tile's index in it): the last s with first_tile(s) <=
    q_tile (kernels.tiling.Tiling), by binary search; a sequence of q_len 0 owns no tile."""
    lo = q_tile * 0  # invariant: first_tile(lo) <= q_tile < first_tile(hi)
    hi = lo + num_seqs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        first = (tl.load(query_start_loc_ptr + mid) + mid * (BLOCK_Q - 1)) // BLOCK_Q
        if first <= q_tile:
            lo = mid
        else:
            hi = mid
    first = (tl.load(query_start_loc_ptr + lo) + lo * (BLOCK_Q - 1)) // BLOCK_Q
    return lo, q_tile - first


@triton.jit
def _device_piece(seq_lens_ptr, num_seqs, SEQS_PADDED: tl.constexpr, PIECE_MUL: tl.constexpr,
                  PIECE_DIV: tl.constexpr, PIECE_MIN: tl.constexpr, PIECE_MEAN: tl.constexpr):  # fmt: skip
    """The device split's view of the batch, the same in every program: each sequence's length (int64
    [SEQS_PADDED], negative lengths and the lanes past num_seqs 0) and the piece of kernels.tiling.device_splits."""
    seqs = tl.arange(0, SEQS_PADDED)
    lens = tl.maximum(tl.load(seq_lens_ptr + seqs, mask=seqs < num_seqs, other=0), 0).to(tl.int64)
    total = tl.sum(lens, 0)
    piece = tl.maximum((total * PIECE_MUL + PIECE_DIV - 1) // PIECE_DIV, PIECE_MIN)
    piece = tl.maximum(piece, (total * PIECE_MEAN + num_seqs - 1) // num_seqs)
    return lens, piece


@triton.jit
def _device_splits(length, piece, NUM_SPLITS: tl.constexpr, TILE_N: tl.constexpr):
    """kernels.tiling.device_splits, line for line, for sequences of these lengths (a scalar or a vector):
    (their splits in [1, NUM_SPLITS], the keys a split covers, a multiple of TILE_N), int64 like the rule."""
    length = tl.maximum(length, 0).to(tl.int64)
    splits = tl.minimum(tl.maximum((length + piece - 1) // piece, 1), NUM_SPLITS)
    keys = (length + splits - 1) // splits
    return splits, (keys + TILE_N - 1) // TILE_N * TILE_N


@triton.jit
def _program_order(lens, piece, query_start_loc_ptr, num_seqs, ONE_QUERY_PER_SEQ: tl.constexpr,
                   LONGEST_FIRST: tl.constexpr, NUM_SPLITS: tl.constexpr, TILE_N: tl.constexpr,
                   SEQS_PADDED: tl.constexpr):  # fmt: skip
    """(grid axis 0's index, axis 1's, the split) this program takes: the grid's own, or under LONGEST_FIRST a
    permutation giving the linear block id to the sequences ranked by the keys their splits cover, longest first
    (ties to the lower index), so the long pieces start first and the short ones fill the tail. A batch whose
    tiles are not one a sequence keeps the sequences' own order."""
    pid_tile = tl.program_id(0)
    pid_heads = tl.program_id(1)
    split = tl.program_id(2)
    if LONGEST_FIRST:
        n_tiles = tl.num_programs(0)
        n_heads = tl.num_programs(1)
        slot = pid_tile + n_tiles * (pid_heads + n_heads * split)
        pid_heads = slot % n_heads
        split = slot // n_heads % NUM_SPLITS
        rank = slot // n_heads // NUM_SPLITS
        pid_tile = rank
        seqs = tl.arange(0, SEQS_PADDED)
        live = seqs < num_seqs
        one_each = n_tiles == num_seqs
        if not ONE_QUERY_PER_SEQ:  # tile s is sequence s only if query_start_loc[s] == s for all s (else the
            # ranking would order tiles by other sequences' lengths: still a permutation, since n_tiles == num_seqs)
            starts = tl.load(query_start_loc_ptr + seqs, mask=live, other=0)
            one_each = one_each & (tl.sum((live & (starts != seqs)).to(tl.int32), 0) == 0)
        if one_each:
            key = _device_splits(lens, piece, NUM_SPLITS, TILE_N)[1] * SEQS_PADDED + (SEQS_PADDED - 1 - seqs)
            ranked = tl.sort(tl.where(live, key, -1), descending=True)
            pid_tile = (SEQS_PADDED - 1 - tl.sum(tl.where(seqs == rank, ranked, 0), 0) % SEQS_PADDED).to(tl.int32)
    return pid_tile, pid_heads, split


@triton.jit
def _count_bad_blocks(block_table_ptr, seq, stride_bt_seq, first_col, end_col, num_blocks, max_blocks_per_seq,
                      CHUNK: tl.constexpr):  # fmt: skip
    """How many block-table columns [first_col, end_col) of ``seq`` hold an entry outside [0, num_blocks) or lie
    past the table: checked once before the tile loops, since a use of a tile's block ids in its softmax adds an
    unpipelined table load and a cross-warp reduction to every tile."""
    bad = first_col * 0
    for start in range(first_col, end_col, CHUNK):
        column = start + tl.arange(0, CHUNK)
        wanted = column < end_col
        in_table = wanted & (column < max_blocks_per_seq)
        block = tl.load(block_table_ptr + seq * stride_bt_seq + column, mask=in_table, other=0)
        ok = in_table & (block >= 0) & (block < num_blocks)
        bad += tl.sum((wanted & ~ok).to(tl.int32), 0)
    return bad


@triton.jit
def _attend_tiles(
    q, q_tail, m_i, l_i, acc,  # q [BLOCK_M, DIM_MAIN] (+ q_tail [BLOCK_M, DIM_TAIL]); the running state
    start, end,  # KV positions [start, end), TILE_N at a time
    seq, seq_len, q_pos, kv_head, dims, dim_valid, tail_dims, tail_valid, v_dims, v_dim_valid, slope, k_scale, v_scale,
    q_unscale,  # [BLOCK_M]: 2^-j of _q_to_fp16 (read when FP16_DOTS)
    v_first,  # V's first dim this program holds (v_dims[0]; V_PARTS)
    q_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, qk_scale_log2, sliding_window, cap_unscaled, inv_cap_unscaled,
    num_blocks, max_blocks_per_seq,
    stride_k_block, stride_k_slot, stride_k_head, stride_v_block, stride_v_slot, stride_v_head, stride_bt_seq,
    BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, DIM_TAIL: tl.constexpr, DOT_PRECISION: tl.constexpr,
    INTERPRETED_BF16: tl.constexpr,
    MASKED: tl.constexpr,  # False: every key of the range is visible to every row (no causal or length mask)
    USE_WINDOW: tl.constexpr, USE_SOFTCAP: tl.constexpr, USE_ALIBI: tl.constexpr, KV_FP8: tl.constexpr,
    FP16_DOTS: tl.constexpr,  # bf16 q, fp8 cache: q, K, V and p in fp16 for the dots (_q_to_fp16)
    V_PAIRS: tl.constexpr,  # an fp8 V read as uint16 pairs of dims, two dots (see below)
    HEAD_DIM_V: tl.constexpr,
    INTERPRETED: tl.constexpr,  # the CPU interpreter (no inline PTX)
    SHARED_KV: tl.constexpr,  # V is K's first HEAD_DIM_V (== DIM_MAIN) columns: p @ v takes the K tile as loaded
    POS_UNSIGNED: tl.constexpr,  # a KV split: each key's block column and slot in unsigned arithmetic (below)
    BLOCK_OFFS_U32: tl.constexpr,  # each key's block offset a 32 x 32 -> 64-bit unsigned product (below)
    CAUSAL_ONLY_MASK: tl.constexpr,  # a verify launch (rows of several query positions): the shorter mask (below)
    k_desc=None, k_tail_desc=None, v_desc=None,  # the pools' tensor descriptors (read when KV_TMA)
    KV_TMA: tl.constexpr = False,  # each tile one box of its block's rows, loaded by the tensor memory accelerator
):  # fmt: skip
    """The online softmax over KV positions [start, end) of one program; returns (m [BLOCK_M], l [BLOCK_M],
    acc [BLOCK_M, V_PART_DIM]). Called twice: unmasked over the tiles every row sees whole, masked over the rest.

    A program walks its tiles only when every table column its keys before seq_len read is valid
    (_count_bad_blocks), so the masked tiles mask only keys past seq_len (k_valid: their slots may hold NaN).
    The unmasked tiles keep the per-key checks: without them prefill runs slower (docs/performance.md).

    POS_UNSIGNED: where the compiler cannot prove the loop start non-negative, signed // and % by BLOCK_SIZE
    cost sign fix-ups and 64-bit offsets; unsigned (the same values) with the start a multiple of TILE_N, a key's
    slot is a per-lane constant. The loops that compile shorter signed leave it off.

    BLOCK_OFFS_U32 (block strides in [2, 2^31)): block * stride is one unsigned 32 x 32 -> 64-bit product a row,
    the table check one unsigned compare (the launcher caps num_blocks at 2^31), and the unmasked tiles drop
    k_valid, except in fp32 ("ieee" dots on CUDA cores), where ptxas then spills. The same outputs bit for bit.

    Masked tiles: key j is visible where j <= min(q_pos, seq_len - 1) - tile_start, one compare an element.
    Under CAUSAL_ONLY_MASK (verify) the bound is q_pos alone (a written row has q_pos < seq_len), which compiles
    shorter there; prefill and decode run faster with the longer form (docs/performance.md).

    KV_TMA (unmasked tiles, BLOCK_SIZE % TILE_N == 0): a tile is one box of the pool seen as [num_blocks *
    BLOCK_SIZE, a slot's elements], loaded by descriptor; a bad entry or a column past the table takes the row
    num_blocks * BLOCK_SIZE, past the pool, which the copy fills with zeros without reading.

    V_PAIRS: ldmatrix cannot transpose an 8-bit operand, so an fp8 V read as is leaves shared memory a byte at
    a time. Read as uint16, element (key, c) holds dims 2c and 2c + 1 and transposes as 16-bit data; the bytes
    are split, widened to fp16 (exact) and dotted into acc's even and odd dims."""
    BLOCK_M: tl.constexpr = acc.shape[0]
    HALF_DV: tl.constexpr = acc.shape[1] // 2
    acc_even, acc_odd = acc, acc  # unread unless V_PAIRS
    pairs = v_first // 2 + tl.arange(0, HALF_DV)  # the pairs of this program's V dims (v_first even)
    if V_PAIRS:
        acc_even, acc_odd = tl.split(tl.reshape(acc, [BLOCK_M, HALF_DV, 2]))
    for tile_start in range(start, end, TILE_N):
        k_pos = tile_start + tl.arange(0, TILE_N)
        k_valid = k_pos < seq_len
        if KV_TMA:  # one box of the tile's block: see the docstring
            box_col = tile_start // BLOCK_SIZE
            box_ok = box_col < max_blocks_per_seq
            box_block = tl.load(block_table_ptr + seq * stride_bt_seq + box_col, mask=box_ok, other=-1)
            box_block = tl.where(box_ok & (box_block.to(tl.uint32) < num_blocks), box_block, num_blocks)
            box_row = box_block * BLOCK_SIZE + tile_start % BLOCK_SIZE
            k = k_desc.load([box_row, kv_head * stride_k_head])
        else:
            if POS_UNSIGNED:  # the same values (k_pos >= 0): see the docstring
                k_pos_u = k_pos.to(tl.uint32)
                column = (k_pos_u // BLOCK_SIZE).to(tl.int32)
                slot = (k_pos_u % BLOCK_SIZE).to(tl.int32)
            else:
                column = k_pos // BLOCK_SIZE
                slot = k_pos % BLOCK_SIZE
            if MASKED:  # a key before seq_len lies in a checked column (no tile runs past a bad one): see the docstring
                block_ok = k_valid
                block = tl.load(block_table_ptr + seq * stride_bt_seq + column, mask=block_ok, other=0)
            else:
                if DOT_PRECISION == "ieee":  # fp32 (dots on CUDA cores) spills without k_valid: see the docstring
                    in_table = k_valid & (column < max_blocks_per_seq)
                else:  # every key here is before seq_len (the unmasked tiles end at or before it): k_valid is all true
                    in_table = column.to(tl.uint32) < max_blocks_per_seq  # unsigned: column >= 0, the width too
                block = tl.load(block_table_ptr + seq * stride_bt_seq + column, mask=in_table, other=0)
                # one unsigned compare is block >= 0 and block < num_blocks (redundant here, and faster: the docstring)
                block_ok = in_table & (block.to(tl.uint32) < num_blocks)
            if BLOCK_OFFS_U32:  # a loaded row's block is in [0, num_blocks), the strides >= 0: see the docstring
                block = block.to(tl.uint32).to(tl.uint64)
                stride_kb = stride_k_block.to(tl.uint32).to(tl.uint64)
                stride_vb = stride_v_block.to(tl.uint32).to(tl.uint64)
            else:
                block = block.to(tl.int64)
                stride_kb = stride_k_block
                stride_vb = stride_v_block
            k_offs = block[:, None] * stride_kb + slot[:, None] * stride_k_slot + kv_head * stride_k_head
            k = tl.load(k_cache_ptr + k_offs + dims[None, :], mask=block_ok[:, None] & dim_valid[None, :], other=0.0)
        if KV_FP8:  # exact: every fp8 value is an fp16 / bf16 value; k_scale multiplies the logits below
            k = _widen_fp8(k, q.dtype, INTERPRETED_BF16 and not FP16_DOTS, FP16_DOTS or V_PAIRS)
        if INTERPRETED_BF16 and not FP16_DOTS:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION, out_dtype=tl.float32)  # [BLOCK_M, TILE_N]
        if DIM_TAIL > 0:
            if KV_TMA:
                k_tail = k_tail_desc.load([box_row, kv_head * stride_k_head + q.shape[1]])
            else:
                k_tail = tl.load(k_cache_ptr + k_offs + tail_dims[None, :],
                                 mask=block_ok[:, None] & tail_valid[None, :], other=0.0)  # fmt: skip
            if KV_FP8:
                k_tail = _widen_fp8(k_tail, q.dtype, INTERPRETED_BF16 and not FP16_DOTS, FP16_DOTS or V_PAIRS)
            if INTERPRETED_BF16 and not FP16_DOTS:
                k_tail = k_tail.to(tl.float32)
            s += tl.dot(q_tail, tl.trans(k_tail), input_precision=DOT_PRECISION, out_dtype=tl.float32)
        if FP16_DOTS:  # q's power of two undone and k_scale applied in one multiply (q_unscale holds 2^-j * k_scale)
            s = s * q_unscale[:, None]
        elif KV_FP8:  # q . (k * k_scale) = k_scale * (q . k): one multiply per logit, not per K element
            s = s * k_scale
        if USE_SOFTCAP:  # on the logit itself, before any bias or mask
            s = _softcap(s, cap_unscaled, inv_cap_unscaled)
        distance = k_pos[None, :] - q_pos[:, None]  # key_pos - query_pos, <= 0 where causal (compiled away if unread)
        if USE_ALIBI:
            s = s + slope[:, None] * distance.to(tl.float32)
        if MASKED:  # key j of the tile is visible where j <= a row's bound: one compare an element
            if CAUSAL_ONLY_MASK:  # k_pos <= q_pos < seq_len in every row the kernel writes: causality implies k_valid
                last_visible = q_pos
            else:  # k_pos <= q_pos and k_pos < seq_len (decode and prefill: see the docstring)
                last_visible = tl.minimum(q_pos, seq_len - 1)
            visible = tl.arange(0, TILE_N)[None, :] <= (last_visible - tile_start)[:, None]
            if USE_WINDOW:
                visible = visible & (distance > -sliding_window)
            s = tl.where(visible, s, float("-inf"))  # [BLOCK_M, TILE_N]

        m_new = tl.maximum(m_i, tl.max(s, 1))
        # a row that has seen no key yet (possible inside a split) keeps m = -inf: subtract 0, so exp2 gives 0, not NaN
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        if q_ptr.dtype.element_ty == tl.float32:  # scale after subtracting: exact near the max (module docstring)
            alpha = tl.exp2((m_i - m_safe) * qk_scale_log2)
            p = tl.exp2((s - m_safe[:, None]) * qk_scale_log2)
        else:  # fp16 / bf16: one multiply-add an element (an fp32 rounding of m * scale, far below p's bf16 / fp16 one)
            m_scaled = m_safe * qk_scale_log2
            alpha = tl.exp2(m_i * qk_scale_log2 - m_scaled)
            p = tl.exp2(s * qk_scale_log2 - m_scaled[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)

        if not KV_TMA:
            v_offs = block[:, None] * stride_vb + slot[:, None] * stride_v_slot + kv_head * stride_v_head
        if V_PAIRS:  # V's strides come in uint16 units (the launcher halves them: all even)
            pair = tl.load(v_cache_ptr.to(tl.pointer_type(tl.uint16)) + v_offs + pairs[None, :], mask=block_ok[:, None] & (pairs < HEAD_DIM_V // 2)[None, :],
                           other=0)  # fmt: skip
            v_even, v_odd = _split_pairs(pair, v_cache_ptr.dtype.element_ty, INTERPRETED)
            p = p.to(tl.float16)
            acc_even = acc_even * alpha[:, None] + tl.dot(p, v_even, out_dtype=tl.float32)
            acc_odd = acc_odd * alpha[:, None] + tl.dot(p, v_odd, out_dtype=tl.float32)
        else:
            if SHARED_KV:  # the same elements a V load would bring (the launcher checked the view): no second load
                v = k
            elif KV_TMA:
                v = v_desc.load([box_row, kv_head * stride_v_head + v_first])
            else:
                v = tl.load(
                    v_cache_ptr + v_offs + v_dims[None, :], mask=block_ok[:, None] & v_dim_valid[None, :], other=0.0
                )
            if KV_FP8:  # exact, like K; v_scale multiplies the program's acc once, after the loop
                v = _widen_fp8(v, q.dtype, INTERPRETED_BF16 and not FP16_DOTS, FP16_DOTS or V_PAIRS)
            if INTERPRETED_BF16 and not FP16_DOTS:  # bf16 x bf16 products are exact in fp32: only the sum order moves
                p = _bf16_rne(p).to(tl.float32)
                v = v.to(tl.float32)
            else:
                p = p.to(v.dtype)
            pv = tl.dot(p, v, input_precision=DOT_PRECISION, out_dtype=tl.float32)
            acc = acc * alpha[:, None] + pv
        m_i = m_new
    if V_PAIRS:
        acc = tl.reshape(tl.join(acc_even, acc_odd), [BLOCK_M, 2 * HALF_DV])
    return m_i, l_i, acc


@triton.jit
def paged_attention_kernel(
    # pointers
    q_ptr,  # [num_tokens, num_q_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim_v]
    block_table_ptr,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens_ptr,  # [num_seqs] int32
    query_start_loc_ptr,  # [num_seqs + 1] int32 (unread when ONE_QUERY_PER_SEQ)
    out_ptr,  # [num_tokens, num_q_heads, head_dim_v]
    lse_ptr,  # [num_tokens, num_q_heads] fp32, contiguous (written when RETURN_LSE)
    partial_ptr,  # fp32 workspace, used when NUM_SPLITS > 1: m, l, acc of each split (and DEVICE_SPLIT's counts: _partial_numel)
    sinks_ptr,  # [num_q_heads] fp32, sink / scale (read when USE_SINKS)
    alibi_ptr,  # [num_q_heads] fp32, slope / scale (read when USE_ALIBI)
    k_scale_ptr,  # [num_kv_heads] fp32, an fp8 cache's dequantization scale (read when KV_FP8)
    v_scale_ptr,  # [num_kv_heads] fp32
    # scalars
    qk_scale_log2,  # softmax scale * log2(e)
    sliding_window,  # W (read when USE_WINDOW)
    cap_unscaled,  # logit_softcap / scale (read when USE_SOFTCAP)
    inv_cap_unscaled,  # scale / logit_softcap
    num_tokens,
    num_seqs,
    num_q_heads,
    num_blocks,
    max_blocks_per_seq,
    split_size,  # KV positions a split covers, a multiple of TILE_N (unread under DEVICE_SPLIT)
    # strides (the head_dim stride of every tensor is 1)
    stride_q_token,
    stride_q_head,
    stride_o_token,
    stride_o_head,
    stride_k_block,
    stride_k_slot,
    stride_k_head,
    stride_v_block,
    stride_v_slot,
    stride_v_head,
    stride_bt_seq,
    # meta-parameters
    GROUP_SIZE: tl.constexpr,
    HEADS_PER_PROGRAM: tl.constexpr,  # the group's heads a program holds (kernels.tiling.heads_per_program)
    HEAD_TILES: tl.constexpr,  # ceil(GROUP_SIZE / HEADS_PER_PROGRAM): grid axis 1 is num_kv_heads * HEAD_TILES
    HEAD_DIM: tl.constexpr,  # K's (and q's)
    DIM_MAIN: tl.constexpr,  # K loaded as DIM_MAIN + DIM_TAIL columns (kernels.tiling.head_dim_pieces)
    DIM_TAIL: tl.constexpr,  # 0: no second piece
    HEAD_DIM_V: tl.constexpr,  # V's and the output's
    HEAD_DIM_V_PADDED: tl.constexpr,
    V_PARTS: tl.constexpr,  # V's padded dims cut in V_PARTS programs of V_PART_DIM (kernels.tiling.v_parts)
    V_PART_DIM: tl.constexpr,  # HEAD_DIM_V_PADDED // V_PARTS
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    INTERPRETED_BF16: tl.constexpr,  # bf16 under the CPU interpreter: see _bf16_rne
    ONE_QUERY_PER_SEQ: tl.constexpr,  # query_start_loc None: tile t is sequence t's one query
    NUM_SPLITS: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    USE_ALIBI: tl.constexpr,
    USE_SINKS: tl.constexpr,
    RETURN_LSE: tl.constexpr,
    KV_FP8: tl.constexpr,  # fp8 pools: K = k_cache.float() * k_scale, the scales applied outside the dots
    FP16_DOTS: tl.constexpr,  # bf16 q over an fp8 cache: the dots run in fp16 (_q_to_fp16)
    V_PAIRS: tl.constexpr,  # an fp8 V read as uint16 pairs of dims (_attend_tiles)
    INTERPRETED: tl.constexpr,  # the CPU interpreter
    SHARED_KV: tl.constexpr = False,  # v_cache is a view of k_cache's first HEAD_DIM_V columns (MLA's latent cache)
    BLOCK_OFFS_U32: tl.constexpr = False,  # K's and V's block strides are in [2, 2^31): _attend_tiles
    CAUSAL_ONLY_MASK: tl.constexpr = False,  # a verify launch: the masked tiles' shorter mask (_attend_tiles)
    DEVICE_SPLIT: tl.constexpr = False,  # each sequence's splits decided here from seq_lens (kernels.tiling.device_splits)
    SEQS_PADDED: tl.constexpr = 1,  # next_pow2(num_seqs) (read when DEVICE_SPLIT), and the rule's constants:
    PIECE_MUL: tl.constexpr = 0,
    PIECE_DIV: tl.constexpr = 1,
    PIECE_MIN: tl.constexpr = 0,
    PIECE_MEAN: tl.constexpr = 0,  # a piece is at least PIECE_MEAN times the batch's mean length
    LONGEST_FIRST: tl.constexpr = False,  # under DEVICE_SPLIT: the sequences dispatched longest piece first (_program_order)
    KV_TMA: tl.constexpr = False,  # the unmasked tiles' K and V by tensor descriptor (_attend_tiles, _kv_tma)
):
    # Grid axis 1: (KV head, head tile, V part), the V part fastest: the programs that share a head
    # tile's q and K run side by side (each computes the same logits, and its own V dims of p @ v).
    lens, piece = qk_scale_log2, qk_scale_log2  # unread unless DEVICE_SPLIT
    if DEVICE_SPLIT:
        lens, piece = _device_piece(seq_lens_ptr, num_seqs, SEQS_PADDED, PIECE_MUL, PIECE_DIV, PIECE_MIN, PIECE_MEAN)
    pid_tile, pid_heads, split = _program_order(lens, piece, query_start_loc_ptr, num_seqs, ONE_QUERY_PER_SEQ,
                                                LONGEST_FIRST, NUM_SPLITS, TILE_N, SEQS_PADDED)  # fmt: skip
    v_part = pid_heads % V_PARTS
    kv_head = pid_heads // V_PARTS // HEAD_TILES
    head_tile = pid_heads // V_PARTS % HEAD_TILES
    if ONE_QUERY_PER_SEQ:
        seq = pid_tile
        q_tile = seq * 0
        q_start = seq
        q_len = q_tile + 1
    else:
        seq, q_tile = _find_seq(query_start_loc_ptr, pid_tile, num_seqs, BLOCK_Q)
        q_start = tl.load(query_start_loc_ptr + seq)
        q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if (q_tile < 0) | (q_tile * BLOCK_Q >= q_len):  # a spare tile (q_len 0, or short of a full tile)
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    last_split = NUM_SPLITS - 1
    if DEVICE_SPLIT:  # this sequence's own splits (kernels.tiling.device_splits); the programs past them exit
        seq_splits, split_size = _device_splits(seq_len, piece, NUM_SPLITS, TILE_N)
        seq_splits = seq_splits.to(tl.int32)
        split_size = split_size.to(tl.int32)
        if split >= seq_splits:
            return
        last_split = seq_splits - 1

    # Row r of the tile: query token q_tile * BLOCK_Q + r // HEADS_PER_PROGRAM, group head
    # head_tile * HEADS_PER_PROGRAM + r % HEADS_PER_PROGRAM (head_tile is 0 when a program holds the whole group).
    rows = tl.arange(0, BLOCK_M)
    token = q_tile * BLOCK_Q + rows // HEADS_PER_PROGRAM
    in_group = head_tile * HEADS_PER_PROGRAM + rows % HEADS_PER_PROGRAM
    head = kv_head * GROUP_SIZE + in_group
    q_rows = (q_start + token).to(tl.int64)
    row_valid = (rows < BLOCK_Q * HEADS_PER_PROGRAM) & (in_group < GROUP_SIZE) & (token < q_len)
    row_valid = row_valid & (q_rows >= 0) & (q_rows < num_tokens)
    q_pos = seq_len - q_len + token
    dims = tl.arange(0, DIM_MAIN)
    dim_valid = dims < HEAD_DIM
    v_first = v_part * V_PART_DIM
    v_dims = v_first + tl.arange(0, V_PART_DIM)
    v_dim_valid = v_dims < HEAD_DIM_V
    # m, l and the lse are the same in every V part (the same logits): V part 0 stores them.
    state_valid = row_valid
    if V_PARTS > 1:
        state_valid = row_valid & ((rows * 0 + v_part) == 0)

    q_offs = q_rows[:, None] * stride_q_token + head[:, None] * stride_q_head
    q = tl.load(q_ptr + q_offs + dims[None, :], mask=row_valid[:, None] & dim_valid[None, :], other=0.0)
    q_tail, tail_dims, tail_valid = q, dims, dim_valid  # unread unless DIM_TAIL > 0
    if DIM_TAIL > 0:  # K's columns past DIM_MAIN (MLA's 64 rope dims), a second dot
        tail_dims = DIM_MAIN + tl.arange(0, DIM_TAIL)
        tail_valid = tail_dims < HEAD_DIM
        q_tail = tl.load(q_ptr + q_offs + tail_dims[None, :], mask=row_valid[:, None] & tail_valid[None, :], other=0.0)
    q_unscale = tl.full([BLOCK_M], 1.0, tl.float32)  # unread unless FP16_DOTS
    if FP16_DOTS:
        q, q_tail, q_unscale = _q_to_fp16(q, q_tail, DIM_TAIL)
    elif INTERPRETED_BF16:
        q = q.to(tl.float32)
        q_tail = q_tail.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of the unscaled logits
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, V_PART_DIM], tl.float32)

    slope = m_i  # unread unless USE_ALIBI
    if USE_ALIBI:
        slope = tl.load(alibi_ptr + head, mask=row_valid, other=0.0)  # [BLOCK_M], per unscaled logit
    k_scale = qk_scale_log2  # unread unless KV_FP8
    v_scale = qk_scale_log2
    if KV_FP8:
        k_scale = tl.load(k_scale_ptr + kv_head)
        v_scale = tl.load(v_scale_ptr + kv_head)
        if FP16_DOTS:  # 2^-j * k_scale is exact (in fp32's normal range), so s * it rounds as (s * 2^-j) * k_scale
            q_unscale = q_unscale * k_scale

    kv_end = seq_len - q_len + tl.minimum(q_len, (q_tile + 1) * BLOCK_Q)
    kv_start = 0
    if USE_WINDOW:  # kernels.tiling.window_tile_start of the program's first query
        first_q_pos = seq_len - q_len + q_tile * BLOCK_Q
        kv_start = tl.maximum(first_q_pos - sliding_window + 1, 0) // TILE_N * TILE_N
    if NUM_SPLITS > 1:  # the splits cut [kv_start, kv_end) from kv_start; the last runs to kv_end
        # split_size is a multiple of TILE_N, spelled so that the compiler sees it: with POS_UNSIGNED, a key's
        # slot is then a per-lane constant in the tile loop (_attend_tiles' docstring).
        kv_start = kv_start + split * (split_size // TILE_N) * TILE_N
        kv_end = tl.where(split == last_split, kv_end, tl.minimum(kv_end, kv_start + split_size))
    # A bad table entry among the columns the tiles below read (from kv_start, whole tiles, keys before seq_len)
    # turns every row of the program into NaN. walked = min(whole tiles, seq_len - kv_start), with no int32 sum
    # past seq_len (a garbage seq_len near 2^31 would wrap the tile-rounded end; int64 here is far slower).
    span = tl.maximum(kv_end - kv_start, 0)
    tiles = span // TILE_N + (span % TILE_N > 0).to(tl.int32)
    room = tl.maximum(seq_len - kv_start, 0)
    # tiles * TILE_N where it fits in room, else room; the minimum keeps the branch not taken from overflowing
    walked = tl.where(tiles <= room // TILE_N, tl.minimum(tiles, room // TILE_N) * TILE_N, room)
    first_col = kv_start // BLOCK_SIZE
    end_col = tl.where(walked > 0, (kv_start + walked - 1) // BLOCK_SIZE + 1, first_col)
    bad_blocks = _count_bad_blocks(block_table_ptr, seq, stride_bt_seq, first_col, end_col, num_blocks,
                                   max_blocks_per_seq, 128)  # fmt: skip
    kv_end = tl.where(bad_blocks > 0, kv_start, kv_end)  # its rows are NaN: no tile is walked, no bad id read
    # Tiles wholly before the program's first query position are visible to every row: they skip the causal and
    # length masks (the elementwise work bounds prefill). The window masks every tile it touches.
    full_end = kv_start
    if not USE_WINDOW:
        first_visible_end = (seq_len - q_len + q_tile * BLOCK_Q + 1) // TILE_N * TILE_N
        full_end = tl.maximum(kv_start, tl.minimum(kv_end, first_visible_end))
        if CAUSAL_ONLY_MASK:  # a multiple of TILE_N already (kv_start, first_visible_end, a split's end): spelled so
            full_end = full_end // TILE_N * TILE_N
    k_desc, k_tail_desc, v_desc = k_cache_ptr, k_cache_ptr, v_cache_ptr  # unread unless KV_TMA
    if KV_TMA:  # the pools as [num_blocks * BLOCK_SIZE, a slot's elements]: a tile is one box (_attend_tiles)
        k_rows = [num_blocks * BLOCK_SIZE, stride_k_slot]
        k_desc = tl.make_tensor_descriptor(k_cache_ptr, k_rows, [stride_k_slot, 1], [TILE_N, DIM_MAIN])
        if DIM_TAIL > 0:
            k_tail_desc = tl.make_tensor_descriptor(k_cache_ptr, k_rows, [stride_k_slot, 1], [TILE_N, DIM_TAIL])
        if not SHARED_KV:
            v_rows = [num_blocks * BLOCK_SIZE, stride_v_slot]
            v_desc = tl.make_tensor_descriptor(v_cache_ptr, v_rows, [stride_v_slot, 1], [TILE_N, V_PART_DIM])
    m_i, l_i, acc = _attend_tiles(
        q, q_tail, m_i, l_i, acc, kv_start, full_end, seq, seq_len, q_pos, kv_head, dims, dim_valid, tail_dims, tail_valid,
        v_dims, v_dim_valid, slope, k_scale, v_scale, q_unscale, v_first, q_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, qk_scale_log2,
        sliding_window, cap_unscaled, inv_cap_unscaled, num_blocks, max_blocks_per_seq,
        stride_k_block, stride_k_slot, stride_k_head, stride_v_block, stride_v_slot, stride_v_head, stride_bt_seq,
        BLOCK_SIZE, TILE_N, DIM_TAIL, DOT_PRECISION, INTERPRETED_BF16, False, USE_WINDOW, USE_SOFTCAP, USE_ALIBI, KV_FP8,
        FP16_DOTS, V_PAIRS, HEAD_DIM_V, INTERPRETED, SHARED_KV, NUM_SPLITS > 1, BLOCK_OFFS_U32, CAUSAL_ONLY_MASK,
        k_desc, k_tail_desc, v_desc, KV_TMA,
    )  # fmt: skip
    m_i, l_i, acc = _attend_tiles(
        q, q_tail, m_i, l_i, acc, full_end, kv_end, seq, seq_len, q_pos, kv_head, dims, dim_valid, tail_dims, tail_valid,
        v_dims, v_dim_valid, slope, k_scale, v_scale, q_unscale, v_first, q_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, qk_scale_log2,
        sliding_window, cap_unscaled, inv_cap_unscaled, num_blocks, max_blocks_per_seq,
        stride_k_block, stride_k_slot, stride_k_head, stride_v_block, stride_v_slot, stride_v_head, stride_bt_seq,
        BLOCK_SIZE, TILE_N, DIM_TAIL, DOT_PRECISION, INTERPRETED_BF16, True, USE_WINDOW, USE_SOFTCAP, USE_ALIBI, KV_FP8,
        FP16_DOTS, V_PAIRS, HEAD_DIM_V, INTERPRETED, SHARED_KV, NUM_SPLITS > 1 or not CAUSAL_ONLY_MASK, BLOCK_OFFS_U32,
        CAUSAL_ONLY_MASK,
    )  # fmt: skip
    if KV_FP8:  # (p @ v) * v_scale, per KV head: before the split's store, so the combine needs no scale
        acc = acc * v_scale
    l_i = l_i + tl.where(bad_blocks > 0, float("nan"), 0.0)  # a bad index: NaN out, no stray read

    keep_state = NUM_SPLITS > 1
    if DEVICE_SPLIT:  # a sequence of one split finishes its rows here; the combine reads the count and skips them
        keep_state = last_split > 0
        counts = (2 + HEAD_DIM_V_PADDED) * NUM_SPLITS * num_tokens * num_q_heads  # after acc: _partial_numel
        tl.store(partial_ptr + counts + q_rows * num_q_heads + head, (rows * 0 + last_split + 1).to(tl.float32),
                 mask=state_valid & ((rows * 0 + split) == 0))  # fmt: skip
    if keep_state:  # keep this split's state; combine_splits_kernel finishes the rows
        row_ids = (split * num_tokens + q_rows) * num_q_heads + head
        split_rows = NUM_SPLITS * num_tokens * num_q_heads
        tl.store(partial_ptr + row_ids, m_i, mask=state_valid)
        tl.store(partial_ptr + split_rows + row_ids, l_i, mask=state_valid)
        acc_offs = 2 * split_rows + row_ids[:, None] * HEAD_DIM_V_PADDED + v_dims[None, :]
        tl.store(partial_ptr + acc_offs, acc, mask=row_valid[:, None])
    else:
        if USE_SINKS:  # the sink joins the denominator once, with no value
            sink = tl.load(sinks_ptr + head, mask=row_valid, other=0.0)
            m_tot = tl.maximum(m_i, sink)
            alpha = tl.exp2((m_i - m_tot) * qk_scale_log2)
            l_i = l_i * alpha + tl.exp2((sink - m_tot) * qk_scale_log2)
            acc = acc * alpha[:, None]
            m_i = m_tot
        if RETURN_LSE:  # ln of the denominator: ln 2 * (m * scale * log2 e + log2 l)
            lse = (m_i * qk_scale_log2 + tl.log2(l_i)) * 0.6931471805599453
            tl.store(lse_ptr + q_rows * num_q_heads + head, lse, mask=state_valid)
        acc = acc / l_i[:, None]
        if INTERPRETED_BF16:
            acc = _bf16_rne(acc)
        o_offs = q_rows[:, None] * stride_o_token + head[:, None] * stride_o_head + v_dims[None, :]
        tl.store(out_ptr + o_offs, acc.to(out_ptr.dtype.element_ty), mask=row_valid[:, None] & v_dim_valid[None, :])


@triton.jit
def combine_splits_kernel(
    partial_ptr,  # fp32 workspace: each split's running max (unscaled logits), running sum, unnormalised acc
    out_ptr,  # [num_tokens, num_q_heads, head_dim_v]
    lse_ptr,  # [num_tokens, num_q_heads] fp32, contiguous (written when RETURN_LSE)
    sinks_ptr,  # [num_q_heads] fp32, sink / scale (read when USE_SINKS)
    qk_scale_log2,  # softmax scale * log2(e)
    num_rows,  # num_tokens * num_q_heads
    stride_o_token,
    stride_o_head,
    NUM_Q_HEADS: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    HEAD_DIM_V_PADDED: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    INTERPRETED_BF16: tl.constexpr,
    USE_SINKS: tl.constexpr,
    RETURN_LSE: tl.constexpr,
    DEVICE_SPLIT: tl.constexpr = False,  # the row's splits are the count its split 0 stored (1: row done)
):
    """out = sum_s w_s acc_s / sum_s w_s l_s, w_s = 2^((m_s - m) * scale * log2(e)), m = max_s m_s; a program a row.
    A sink joins m and the denominator once here. Under DEVICE_SPLIT a row reads only its sequence's splits, and
    a one-split sequence's row, already written, is skipped."""
    row = tl.program_id(0)
    splits = tl.arange(0, NUM_SPLITS)
    dims = tl.arange(0, HEAD_DIM_V_PADDED)
    split_rows = NUM_SPLITS * num_rows  # the workspace's layout: _partial_numel
    live = splits < NUM_SPLITS  # every split
    if DEVICE_SPLIT:
        row_splits = tl.load(partial_ptr + (2 + HEAD_DIM_V_PADDED) * split_rows + row).to(tl.int32)
        if row_splits <= 1:
            return
        live = splits < row_splits
    m = tl.load(partial_ptr + splits * num_rows + row, mask=live, other=float("-inf"))
    l_s = tl.load(partial_ptr + split_rows + splits * num_rows + row, mask=live, other=0.0)
    acc = tl.load(partial_ptr + 2 * split_rows + (splits * num_rows + row)[:, None] * HEAD_DIM_V_PADDED + dims[None, :],
                  mask=live[:, None], other=0.0)  # fmt: skip
    token = row // NUM_Q_HEADS
    head = row % NUM_Q_HEADS
    m_top = tl.max(m, 0)
    if USE_SINKS:
        sink = tl.load(sinks_ptr + head)
        m_top = tl.maximum(m_top, sink)
    weight = tl.exp2((m - m_top) * qk_scale_log2)  # a split that saw no key has m = -inf: weight 0
    l_sum = tl.sum(l_s * weight, 0)
    if USE_SINKS:
        l_sum = l_sum + tl.exp2((sink - m_top) * qk_scale_log2)
    o = tl.sum(acc * weight[:, None], 0) / l_sum
    if RETURN_LSE:
        tl.store(lse_ptr + row, (m_top * qk_scale_log2 + tl.log2(l_sum)) * 0.6931471805599453)
    if INTERPRETED_BF16:
        o = _bf16_rne(o)
    o_offs = token.to(tl.int64) * stride_o_token + head * stride_o_head + dims
    tl.store(out_ptr + o_offs, o.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM_V)


def _check_launchable(device: torch.device) -> None:
    interpreted = not isinstance(paged_attention_kernel, triton.runtime.JITFunction)
    if device.type != "cuda" and not interpreted:
        raise RuntimeError(
            f"the Triton kernel got {device.type} tensors but Triton was imported without "
            "TRITON_INTERPRET=1; set it before Python starts to run the kernel on the CPU"
        )


PLANS = PlanCache()  # this kernel's launch plans (kernels/launch_plan.py)

KV_TMA = True  # the unmasked tiles' K and V by tensor descriptor where _kv_tma allows; False: by pointer


def _kv_tma(call: PagedCall, tiling, strides: tuple, copied: tuple, parts: int) -> bool:
    """Whether the unmasked tiles load K (and V, unless K's view) by tensor descriptor: a decode (prefill and
    verify run slower so), a tile in one block, the pool rows of 16-byte aligned heads, every piece loaded whole,
    sm_90 or newer (or the interpreter), no fp8 cache. ``strides``, ``copied``: K's and V's as launched."""
    if not KV_TMA or call.kv_fp8 or call.block_size % tiling.TILE_N or not tiling.TUNING_KEY[2].startswith("decode"):
        return False
    if call.q.device.type == "cuda" and (torch.version.hip or torch.cuda.get_device_capability(call.q.device)[0] < 9):
        return False
    main, tail = head_dim_pieces(call.head_dim)
    pools = [(call.k_cache, strides[0], copied[0], call.head_dim)]
    if not latent_kv(call):
        if call.head_dim_v % parts or next_pow2(call.head_dim_v // parts) != call.head_dim_v // parts:
            return False
        pools.append((call.v_cache, strides[1], copied[1], call.head_dim_v))
    size = call.k_cache.element_size()
    return (
        main + tail == call.head_dim
        and call.num_blocks * call.block_size < 2**31
        and all(
            st[0] == call.block_size * st[1]
            and (call.num_kv_heads - 1) * st[2] + dim <= st[1] < 2**31
            and st[1] * size % 16 == 0
            and (copy or pool.data_ptr() % 16 == 0)
            for pool, st, copy, dim in pools
        )
    )


def _tma_scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Triton's allocator for a launch's global scratch: the descriptors each program makes (KV_TMA)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


@contract_entry(plans=PLANS)
def paged_attention_triton(
    call: PagedCall, out: torch.Tensor, lse: torch.Tensor | None, max_q_len: int | None, max_seq_len: int | None
) -> TritonPlan:
    """Paged attention through the Triton kernel; reads no tensor value on the host (CUDA-graph capturable).
    The hints change speed, never the result: max_q_len the tile height, max_seq_len the KV split. On CPU
    tensors the kernel runs under Triton's interpreter (small cases only)."""
    _check_launchable(call.q.device)
    plan = TritonPlan(call, out, lse, max_q_len, max_seq_len)
    plan.launch(
        call.q, call.k_cache, call.v_cache, call.block_table, call.seq_lens, call.given_query_start_loc, out, lse,
        call.sinks, call.alibi_slopes, call.k_scale, call.v_scale,
    )  # fmt: skip
    return plan


def _partial_numel(splits: int, num_tokens: int, num_q_heads: int, head_dim_v_padded: int, device_split: bool) -> int:
    """Elements of the split path's fp32 workspace: m [splits, num_tokens, num_q_heads], l (the same), acc
    [splits, num_tokens, num_q_heads, head_dim_v_padded], and under the device split counts [num_tokens,
    num_q_heads] (each row's sequence's splits)."""
    rows = splits * num_tokens * num_q_heads
    return rows * (2 + head_dim_v_padded) + (num_tokens * num_q_heads if device_split else 0)


class TritonPlan:
    """Everything the launcher decides on the host for one plan key. ``launch(q, k_cache, v_cache, block_table,
    seq_lens, query_start_loc, out, lse, sinks, alibi_slopes, k_scale, v_scale)`` takes the checked tensors and
    launches, allocating only per-call buffers: nothing (no sequence or token), one kernel on the tensors as
    given (no copy, no split), Hopper's prefill kernel (``kernels.gluon_prefill.applies``), or the general path
    (copies of tensors whose head_dim stride is not 1, the split's combine)."""

    __slots__ = ("combine", "copy_k", "copy_out", "copy_q", "copy_v", "dummy", "gluon", "launch", "main", "noop",
                 "partial_numel", "scale", "scratch", "tiling")  # fmt: skip

    def __init__(self, call: PagedCall, out: torch.Tensor, lse: torch.Tensor | None, max_q_len, max_seq_len):
        q, k_cache, v_cache = call.q, call.k_cache, call.v_cache
        num_tokens = q.shape[0]
        self.noop = call.num_seqs == 0 or num_tokens == 0
        if self.noop:  # no sequence or no token: nothing to launch
            self.launch = lambda *tensors: None
            return
        tiling = self.tiling = tiling_for(call, max_q_len, max_seq_len)
        tensors = (q, k_cache, v_cache, out)
        self.copy_q, self.copy_k, self.copy_v, self.copy_out = copies = [t.stride(-1) != 1 for t in tensors]
        # The strides as launched: those of t.contiguous() where the launcher copies t.
        launched = zip(tensors, copies, strict=True)
        q_st, k_st, v_st, o_st = (contiguous_strides(t.shape) if c else t.stride() for t, c in launched)
        one_query_per_seq = call.given_query_start_loc is None
        interpreted_bf16 = q.device.type != "cuda" and q.dtype == torch.bfloat16
        splits = tiling.NUM_SPLITS
        head_dim_v_padded = max(16, next_pow2(call.head_dim_v))
        device_split = tiling.DEVICE_SPLIT
        self.partial_numel = _partial_numel(splits, num_tokens, call.num_q_heads, head_dim_v_padded,
                                            device_split is not None)  # fmt: skip
        self.dummy = torch.empty(1, dtype=torch.float32, device=q.device)  # any unread tensor argument
        self.scale = call.scale
        qk_scale_log2 = call.scale * math.log2(math.e)
        # The variants in units of the unscaled logit (launch divides sinks and slopes; tlsim does the same).
        cap_u = 1.0 if call.logit_softcap is None else call.logit_softcap / call.scale
        heads = heads_per_program(call)
        head_tiles = cdiv(call.group_size, heads)
        parts = v_parts(call)
        dim_main, dim_tail = head_dim_pieces(call.head_dim)
        # An fp8 V in a decode under fp16 / bf16 q is read as uint16 pairs of dims (_attend_tiles, V_PAIRS), its
        # strides given in uint16 units; that needs them and V's head dim even, and V's first byte at an even
        # address (a view one byte in would make every 16-bit load misaligned; a copied V starts aligned).
        v_pairs = (
            tiling.FP8_DOTS_FP16
            and call.head_dim_v % 2 == 0
            and all(st % 2 == 0 for st in v_st[:3])
            and (self.copy_v or v_cache.data_ptr() % 2 == 0)
        )
        v_units = v_st[:3] if not v_pairs else tuple(st // 2 for st in v_st[:3])
        # num_blocks capped at 2^31: every int32 block id is below it (the same checks), and the kernel's unsigned
        # table check (_attend_tiles) stays a 32-bit compare, exact for negative ids (an int64 bound would pass them).
        scalars = (
            qk_scale_log2, call.sliding_window or 0, cap_u, 1.0 / cap_u, num_tokens, call.num_seqs, call.num_q_heads,
            min(call.num_blocks, 2**31), call.block_table.shape[1], tiling.SPLIT_SIZE,
            q_st[0], q_st[1], o_st[0], o_st[1], k_st[0], k_st[1], k_st[2], *v_units,
            call.block_table.stride(0),
        )  # fmt: skip
        cuda = q.device.type == "cuda"
        kv_tma = _kv_tma(call, tiling, (k_st, v_st), (self.copy_k, self.copy_v), parts)
        # Descriptors made on the device take global scratch, which Triton allocates through its allocator.
        self.scratch = kv_tma and cuda
        self.main = KernelLaunch(
            (tiling.NUM_Q_TILES, call.num_kv_heads * head_tiles * parts, splits),
            dict(
                GROUP_SIZE=call.group_size, HEADS_PER_PROGRAM=heads, HEAD_TILES=head_tiles, HEAD_DIM=call.head_dim,
                DIM_MAIN=dim_main, DIM_TAIL=dim_tail, HEAD_DIM_V=call.head_dim_v, HEAD_DIM_V_PADDED=head_dim_v_padded,
                V_PARTS=parts, V_PART_DIM=head_dim_v_padded // parts, BLOCK_SIZE=call.block_size,
                BLOCK_M=tiling.BLOCK_M, BLOCK_Q=tiling.BLOCK_Q, TILE_N=tiling.TILE_N,
                DOT_PRECISION="ieee" if q.dtype == torch.float32 or interpreted_bf16 else "tf32",
                INTERPRETED_BF16=interpreted_bf16, ONE_QUERY_PER_SEQ=one_query_per_seq, NUM_SPLITS=splits,
                USE_WINDOW=call.sliding_window is not None, USE_SOFTCAP=call.logit_softcap is not None,
                USE_ALIBI=call.alibi_slopes is not None, USE_SINKS=call.sinks is not None, RETURN_LSE=lse is not None,
                KV_FP8=call.kv_fp8, FP16_DOTS=tiling.FP8_DOTS_FP16 and q.dtype == torch.bfloat16, V_PAIRS=v_pairs,
                INTERPRETED=not isinstance(paged_attention_kernel, triton.runtime.JITFunction),
                SHARED_KV=latent_kv(call), BLOCK_OFFS_U32=all(1 < st < 2**31 for st in (k_st[0], v_units[0])),
                CAUSAL_ONLY_MASK=tiling.TUNING_KEY[2] == "verify", DEVICE_SPLIT=device_split is not None,
                SEQS_PADDED=next_pow2(call.num_seqs) if device_split else 1,
                PIECE_MUL=device_split[0] if device_split else 0, PIECE_DIV=device_split[1] if device_split else 1,
                PIECE_MIN=device_split[2] if device_split else 0, PIECE_MEAN=device_split[3] if device_split else 0,
                LONGEST_FIRST=device_split is not None and next_pow2(call.num_seqs) <= LONGEST_FIRST_MAX_SEQS,
                KV_TMA=kv_tma,
            ),
            dict(num_warps=tiling.NUM_WARPS, num_stages=tiling.NUM_STAGES), cuda, scalars,
        )  # fmt: skip
        self.combine = None
        if splits > 1:
            combine_scalars = (qk_scale_log2, num_tokens * call.num_q_heads, o_st[0], o_st[1])
            combine_constexprs = dict(
                NUM_Q_HEADS=call.num_q_heads, HEAD_DIM_V=call.head_dim_v, HEAD_DIM_V_PADDED=head_dim_v_padded,
                NUM_SPLITS=splits, INTERPRETED_BF16=interpreted_bf16, USE_SINKS=call.sinks is not None,
                RETURN_LSE=lse is not None, DEVICE_SPLIT=device_split is not None,
            )  # fmt: skip
            self.combine = KernelLaunch((num_tokens * call.num_q_heads,), combine_constexprs, {}, cuda, combine_scalars)
        direct = self.combine is None and not (self.copy_q or self.copy_k or self.copy_v or self.copy_out)
        self.launch = self._launch_direct if direct else self._launch_general
        # On sm_90 a prefill it serves (no variant but a window) runs Hopper's kernel: the same algorithm and tiles.
        self.gluon = None
        if direct and gluon_prefill.applies(call, tiling, lse):
            self.gluon = gluon_prefill.GluonPrefill(call, tiling)
            self.launch = self._launch_gluon

    def _launch_gluon(self, q, k_cache, v_cache, block_table, seq_lens, query_start_loc, out, *unread) -> None:
        self.gluon.launch(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, out)

    def _launch_direct(self, q, k_cache, v_cache, block_table, seq_lens, query_start_loc, out, lse, sinks,
                       alibi_slopes, k_scale, v_scale) -> None:  # fmt: skip
        unread = self.dummy
        if self.scratch:
            triton.set_allocator(_tma_scratch)
        self.main(
            paged_attention_kernel,
            q, k_cache, v_cache, block_table, seq_lens, seq_lens if query_start_loc is None else query_start_loc, out,
            unread if lse is None else lse, unread,
            unread if sinks is None else sinks / self.scale, unread if alibi_slopes is None else alibi_slopes / self.scale,
            unread if k_scale is None else k_scale, unread if v_scale is None else v_scale,
        )  # fmt: skip

    def _launch_general(self, q, k_cache, v_cache, block_table, seq_lens, query_start_loc, out, lse, sinks,
                        alibi_slopes, k_scale, v_scale) -> None:  # fmt: skip
        q_c = q.contiguous() if self.copy_q else q
        k_c = k_cache.contiguous() if self.copy_k else k_cache
        v_c = v_cache.contiguous() if self.copy_v else v_cache
        out_c = torch.empty_like(out, memory_format=torch.contiguous_format) if self.copy_out else out
        starts = seq_lens if query_start_loc is None else query_start_loc  # unread when one query per seq
        # One allocation for the three per-split buffers (a CUDA allocation costs the host a few us).
        partial = self.dummy if self.combine is None else torch.empty(self.partial_numel, dtype=torch.float32,
                                                                      device=q.device)  # fmt: skip
        sinks_u = partial if sinks is None else sinks / self.scale
        alibi_u = partial if alibi_slopes is None else alibi_slopes / self.scale
        lse_c = partial if lse is None else lse  # unwritten without RETURN_LSE
        if self.scratch:
            triton.set_allocator(_tma_scratch)
        self.main(
            paged_attention_kernel,
            q_c, k_c, v_c, block_table, seq_lens, starts, out_c, lse_c, partial, sinks_u,
            alibi_u, partial if k_scale is None else k_scale, partial if v_scale is None else v_scale,
        )  # fmt: skip
        if self.combine is not None:
            self.combine(combine_splits_kernel, partial, out_c, lse_c, sinks_u)
        if out_c is not out:
            out.copy_(out_c)
