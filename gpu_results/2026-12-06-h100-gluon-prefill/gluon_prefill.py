"""Probe: a paged causal prefill in Gluon on sm_90, K/V tiles gathered by TMA, one 16-row box a block.

Each program: BM queries of one head of one sequence (dense prefill, equal lengths). A BN-key tile spans
BN / block_size blocks; each block's rows arrive as one TMA box into a row slice of one shared tile, then
wgmma computes S = Q K^T and O += P V (P from registers). OVERLAP issues tile j's Q K^T and tile j-1's P V
together, softmax of j running under P V (FlashAttention-3's intra-warpgroup overlap).
Timed beside SDPA (cuDNN) on a contiguous copy and the harness's paged Triton kernel, paired rounds.
"""

from __future__ import annotations

import fnmatch
import os
import statistics
import sys
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


@gluon.jit
def _issue_kv(k_desc, v_desc, k_buf, v_buf, k_bar, v_bar, bt_row, j, col, BN: gl.constexpr, PAGE: gl.constexpr):
    NB: gl.constexpr = BN // PAGE
    mbarrier.expect(k_bar, NB * k_desc.block_type.nbytes)
    mbarrier.expect(v_bar, NB * v_desc.block_type.nbytes)
    for i in gl.static_range(NB):
        blk = gl.load(bt_row + j * NB + i)
        tma.async_copy_global_to_shared(k_desc, [blk * PAGE, col], k_bar, k_buf.slice(i * PAGE, PAGE))
        tma.async_copy_global_to_shared(v_desc, [blk * PAGE, col], v_bar, v_buf.slice(i * PAGE, PAGE))


@gluon.jit
def _softmax(s, m_i, l_i, j, n_full, q0, qk_scale, BM: gl.constexpr, BN: gl.constexpr, s_layout: gl.constexpr):
    s = s * qk_scale
    if j >= n_full:
        q_pos = q0 + gl.arange(0, BM, layout=gl.SliceLayout(1, s_layout))
        k_pos = j * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
        s = gl.where(q_pos[:, None] >= k_pos[None, :], s, -float("inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit
def gluon_prefill(q_desc, k_desc, v_desc, o_ptr, bt_ptr, S, bt_stride, qk_scale,
                  HQ: gl.constexpr, GROUP: gl.constexpr, D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                  PAGE: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
    pid_m = gl.program_id(0)
    bh = gl.program_id(1)
    b = bh // HQ
    h = bh % HQ
    col = (h // GROUP) * D
    q0 = pid_m * BM
    bt_row = bt_ptr + b * bt_stride

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BN, 16])  # fmt: skip
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, D, 16])  # fmt: skip
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)

    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BM, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, D], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)

    n_tiles = gl.cdiv(q0 + BM, BN)
    n_full = (q0 + 1) // BN
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [b * S + q0, h * D], q_bar, q_smem)
    LOOKAHEAD: gl.constexpr = STAGES - 1
    for i in gl.static_range(LOOKAHEAD):
        if i < n_tiles:
            _issue_kv(k_desc, v_desc, k_smem.index(i), v_smem.index(i), k_bars.index(i), v_bars.index(i), bt_row,
                      i, col, BN, PAGE)  # fmt: skip
    mbarrier.wait(q_bar, 0)

    m_i = gl.full([BM], -float("inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BM], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BM, D], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BM, BN], gl.float32, layout=s_layout)
    if OVERLAP:
        mbarrier.wait(k_bars.index(0), 0)
        s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s,))
        p, alpha, m_i, l_i = _softmax(s, m_i, l_i, 0, n_full, q0, qk_scale, BM, BN, s_layout)
        for j in range(1, n_tiles):
            st = j % STAGES
            prev = (j - 1) % STAGES
            mbarrier.wait(k_bars.index(st), (j // STAGES) & 1)
            s = warpgroup_mma(q_smem, k_smem.index(st).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
            acc = warpgroup_mma(gl.convert_layout(p.to(gl.bfloat16), p_layout), v_smem.index(prev), acc,
                                is_async=True)  # fmt: skip
            s = warpgroup_mma_wait(1, deps=(s,))
            p, alpha, m_i, l_i = _softmax(s, m_i, l_i, j, n_full, q0, qk_scale, BM, BN, s_layout)
            acc = warpgroup_mma_wait(0, deps=(acc,))
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            nxt = j + LOOKAHEAD - 1
            if nxt < n_tiles:
                _issue_kv(k_desc, v_desc, k_smem.index(nxt % STAGES), v_smem.index(nxt % STAGES),
                          k_bars.index(nxt % STAGES), v_bars.index(nxt % STAGES), bt_row, nxt, col, BN, PAGE)  # fmt: skip
        last = n_tiles - 1
        mbarrier.wait(v_bars.index(last % STAGES), (last // STAGES) & 1)
        acc = warpgroup_mma(gl.convert_layout(p.to(gl.bfloat16), p_layout), v_smem.index(last % STAGES), acc,
                            is_async=True)  # fmt: skip
        acc = warpgroup_mma_wait(0, deps=(acc,))
    else:
        for j in range(n_tiles):
            st = j % STAGES
            ph = (j // STAGES) & 1
            nxt = j + LOOKAHEAD
            if nxt < n_tiles:
                _issue_kv(k_desc, v_desc, k_smem.index(nxt % STAGES), v_smem.index(nxt % STAGES),
                          k_bars.index(nxt % STAGES), v_bars.index(nxt % STAGES), bt_row, nxt, col, BN, PAGE)  # fmt: skip
            mbarrier.wait(k_bars.index(st), ph)
            s = warpgroup_mma(q_smem, k_smem.index(st).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(0, deps=(s,))
            p, alpha, m_i, l_i = _softmax(s, m_i, l_i, j, n_full, q0, qk_scale, BM, BN, s_layout)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            mbarrier.wait(v_bars.index(st), ph)
            acc = warpgroup_mma(gl.convert_layout(p.to(gl.bfloat16), p_layout), v_smem.index(st), acc,
                                is_async=True)  # fmt: skip
            acc = warpgroup_mma_wait(0, deps=(acc,))

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))
    acc = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
    rows = b * S + q0 + gl.arange(0, BM, layout=gl.SliceLayout(1, o_layout))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    gl.store(o_ptr + rows[:, None] * (HQ * D) + h * D + cols[None, :], acc.to(gl.bfloat16))


@gluon.jit
def _ws_producer(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_free, v_free, bt_row, col, n_tiles,
                 BN: gl.constexpr, PAGE: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
    """One warp: the K and V boxes of every tile, STAGES ahead of the consumers."""
    NB: gl.constexpr = BN // PAGE
    for j in range(n_tiles):
        st = j % STAGES
        ph = (j // STAGES) & 1
        mbarrier.wait(k_free.index(st), ph ^ 1)
        mbarrier.expect(k_ready.index(st), NB * k_desc.block_type.nbytes)
        for i in gl.static_range(NB):
            blk = gl.load(bt_row + j * NB + i)
            tma.async_copy_global_to_shared(k_desc, [blk * PAGE, col], k_ready.index(st),
                                            k_smem.index(st).slice(i * PAGE, PAGE))  # fmt: skip
        mbarrier.wait(v_free.index(st), ph ^ 1)
        mbarrier.expect(v_ready.index(st), NB * v_desc.block_type.nbytes)
        for i in gl.static_range(NB):
            blk = gl.load(bt_row + j * NB + i)
            tma.async_copy_global_to_shared(v_desc, [blk * PAGE, col], v_ready.index(st),
                                            v_smem.index(st).slice(i * PAGE, PAGE))  # fmt: skip


@gluon.jit
def _ws_consumer(q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_free, v_free, n_tiles, n_full, q0, qk_scale,
                 BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
                 num_warps: gl.constexpr):  # fmt: skip
    """The default partition's warpgroups: Q K^T of tile j and P V of tile j - 1 issued together."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BN, 16])  # fmt: skip
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, D, 16])  # fmt: skip
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    m_i = gl.full([BM], -float("inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BM], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BM, D], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BM, BN], gl.float32, layout=s_layout)
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_ready.index(0), 0)
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s,))
    mbarrier.arrive(k_free.index(0), count=1)
    p, alpha, m_i, l_i = _softmax(s, m_i, l_i, 0, n_full, q0, qk_scale, BM, BN, s_layout)
    for j in range(1, n_tiles):
        st = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_ready.index(st), (j // STAGES) & 1)
        s = warpgroup_mma(q_smem, k_smem.index(st).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
        acc = warpgroup_mma(gl.convert_layout(p.to(gl.bfloat16), p_layout), v_smem.index(prev), acc,
                            is_async=True)  # fmt: skip
        s = warpgroup_mma_wait(1, deps=(s,))
        mbarrier.arrive(k_free.index(st), count=1)
        p, alpha, m_i, l_i = _softmax(s, m_i, l_i, j, n_full, q0, qk_scale, BM, BN, s_layout)
        acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(v_free.index(prev), count=1)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    last = n_tiles - 1
    mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
    acc = warpgroup_mma(gl.convert_layout(p.to(gl.bfloat16), p_layout), v_smem.index(last % STAGES), acc,
                        is_async=True)  # fmt: skip
    acc = warpgroup_mma_wait(0, deps=(acc,))
    acc = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
    return (acc,)  # Triton 3.6 flattens the default partition's results as a tuple


@gluon.jit
def gluon_prefill_ws(q_desc, k_desc, v_desc, o_ptr, bt_ptr, S, bt_stride, qk_scale,
                     HQ: gl.constexpr, GROUP: gl.constexpr, D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                     PAGE: gl.constexpr, STAGES: gl.constexpr, ARRIVALS: gl.constexpr, REVERSE: gl.constexpr,
                     num_warps: gl.constexpr):  # fmt: skip
    """gluon_prefill's overlap loop with the K/V loads in a producer warp of their own."""
    pid_m = gl.program_id(0)
    if REVERSE:
        pid_m = gl.num_programs(0) - 1 - pid_m
    bh = gl.program_id(1)
    b = bh // HQ
    h = bh % HQ
    col = (h // GROUP) * D
    q0 = pid_m * BM
    bt_row = bt_ptr + b * bt_stride
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BM, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, D], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_free.index(i), count=ARRIVALS)
        mbarrier.init(v_free.index(i), count=ARRIVALS)
    n_tiles = gl.cdiv(q0 + BM, BN)
    n_full = (q0 + 1) // BN
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [b * S + q0, h * D], q_bar, q_smem)
    (acc,) = gl.warp_specialize(
        [
            (_ws_consumer, (q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_free, v_free, n_tiles, n_full, q0,
                            qk_scale, BM, BN, D, STAGES, num_warps)),
            (_ws_producer, (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_free, v_free, bt_row, col, n_tiles,
                            BN, PAGE, STAGES)),
        ],
        [1],
        [40],
    )  # fmt: skip
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, D, 16])  # fmt: skip
    rows = b * S + q0 + gl.arange(0, BM, layout=gl.SliceLayout(1, o_layout))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    gl.store(o_ptr + rows[:, None] * (HQ * D) + h * D + cols[None, :], acc.to(gl.bfloat16))


@gluon.jit
def _ws2_consumer(q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_free, v_free, o_ptr, n_tiles, q_first, o_row,
                  h, qk_scale, HQ: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr,
                  STAGES: gl.constexpr):  # fmt: skip
    """One warpgroup's 64 query rows (q_smem: its slice of the Q tile), stored by itself."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    n_full = (q_first + 1) // BN
    m_i = gl.full([BM], -float("inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BM], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BM, D], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BM, BN], gl.float32, layout=s_layout)
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_ready.index(0), 0)
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s,))
    mbarrier.arrive(k_free.index(0), count=1)
    p, alpha, m_i, l_i = _softmax(s, m_i, l_i, 0, n_full, q_first, qk_scale, BM, BN, s_layout)
    for j in range(1, n_tiles):
        st = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_ready.index(st), (j // STAGES) & 1)
        s = warpgroup_mma(q_smem, k_smem.index(st).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
        acc = warpgroup_mma(gl.convert_layout(p.to(gl.bfloat16), p_layout), v_smem.index(prev), acc,
                            is_async=True)  # fmt: skip
        s = warpgroup_mma_wait(1, deps=(s,))
        mbarrier.arrive(k_free.index(st), count=1)
        p, alpha, m_i, l_i = _softmax(s, m_i, l_i, j, n_full, q_first, qk_scale, BM, BN, s_layout)
        acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(v_free.index(prev), count=1)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    last = n_tiles - 1
    mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
    acc = warpgroup_mma(gl.convert_layout(p.to(gl.bfloat16), p_layout), v_smem.index(last % STAGES), acc,
                        is_async=True)  # fmt: skip
    acc = warpgroup_mma_wait(0, deps=(acc,))
    mbarrier.arrive(v_free.index(last % STAGES), count=1)
    acc = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
    rows = o_row + gl.arange(0, BM, layout=gl.SliceLayout(1, o_layout))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    gl.store(o_ptr + rows[:, None] * (HQ * D) + h * D + cols[None, :], acc.to(gl.bfloat16))


@gluon.jit
def gluon_prefill_ws2(q_desc, k_desc, v_desc, o_ptr, bt_ptr, S, bt_stride, qk_scale,
                      HQ: gl.constexpr, GROUP: gl.constexpr, D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                      PAGE: gl.constexpr, STAGES: gl.constexpr, REGS: gl.constexpr,
                      num_warps: gl.constexpr):  # fmt: skip
    """Two consumer warpgroups as partitions of their own (64 query rows each, no barrier between them) and a
    producer warp: the kernel's num_warps (4) are the first consumer."""
    pid_m = gl.program_id(0)
    bh = gl.program_id(1)
    b = bh // HQ
    h = bh % HQ
    col = (h // GROUP) * D
    q0 = pid_m * BM
    HALF: gl.constexpr = BM // 2
    bt_row = bt_ptr + b * bt_stride
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BM, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, D], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_free.index(i), count=2)
        mbarrier.init(v_free.index(i), count=2)
    n_tiles = gl.cdiv(q0 + BM, BN)
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [b * S + q0, h * D], q_bar, q_smem)
    gl.warp_specialize(
        [
            (_ws2_consumer, (q_smem.slice(0, HALF), k_smem, v_smem, q_bar, k_ready, v_ready, k_free, v_free, o_ptr,
                             n_tiles, q0, b * S + q0, h, qk_scale, HQ, HALF, BN, D, STAGES)),
            (_ws2_consumer, (q_smem.slice(HALF, HALF), k_smem, v_smem, q_bar, k_ready, v_ready, k_free, v_free,
                             o_ptr, n_tiles, q0 + HALF, b * S + q0 + HALF, h, qk_scale, HQ, HALF, BN, D, STAGES)),
            (_ws_producer, (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_free, v_free, bt_row, col, n_tiles,
                            BN, PAGE, STAGES)),
        ],
        [4, 1],
        [REGS, 24],
    )  # fmt: skip


def gluon_runner(q, k_cache, v_cache, block_table, out, S, bm, bn, stages, overlap, warps):
    """q, out [B * S, hq, d]; k_cache, v_cache [num_blocks, page, hkv, d] (bf16); block_table [B, max_blocks]
    int32. Returns a no-argument launch."""
    T, hq, d = q.shape
    nb, page, hkv, _ = k_cache.shape
    assert S % bm == 0 and bn % page == 0
    q2 = q.reshape(T, hq * d)
    k2 = k_cache.reshape(nb * page, hkv * d)
    v2 = v_cache.reshape(nb * page, hkv * d)
    q_layout = gl.NVMMASharedLayout.get_default_for([bm, d], gl.bfloat16)
    kv_layout = gl.NVMMASharedLayout.get_default_for([page, d], gl.bfloat16)
    qd = TensorDescriptor(q2, list(q2.shape), list(q2.stride()), [bm, d], q_layout)
    kd = TensorDescriptor(k2, list(k2.shape), list(k2.stride()), [page, d], kv_layout)
    vd = TensorDescriptor(v2, list(v2.shape), list(v2.stride()), [page, d], kv_layout)
    grid = (S // bm, T // S * hq)
    scale = d**-0.5 * 1.4426950408889634
    args = dict(HQ=hq, GROUP=hq // hkv, D=d, BM=bm, BN=bn, PAGE=page, STAGES=stages, num_warps=warps)
    kernel, extra = kernel_and_constants(overlap)
    args.update(extra)
    return lambda: kernel[grid](qd, kd, vd, out, block_table, S, block_table.stride(0), scale, **args)


ARRIVALS = int(os.environ.get("ARRIVALS", "1"))  # arrivals a consumer release makes (one elected thread: 1)


CONFIGS = [  # (bm, bn, stages, overlap, warps)
    (128, 128, 2, False, 8),
    (128, 64, 3, False, 8),
    (128, 64, 4, False, 8),
    (128, 128, 3, True, 8),
    (128, 64, 3, True, 8),
    (128, 64, 4, True, 8),
    (64, 128, 2, False, 4),
    (64, 64, 3, True, 4),
]
WS_CONFIGS = [
    (128, 128, 2, "ws", 8),
    (128, 128, 3, "ws", 8),
    (64, 64, 3, "ws", 4),
    (64, 64, 2, "ws", 4),
    (64, 128, 2, "ws", 4),
]
REVERSE = os.environ.get("REVERSE") == "1"  # the heaviest query tiles (the last) first
REGS = int(os.environ.get("REGS", "232"))  # registers a thread of the second consumer warpgroup


def kernel_and_constants(overlap):
    if overlap == "ws":
        return gluon_prefill_ws, dict(ARRIVALS=ARRIVALS, REVERSE=REVERSE)
    if overlap == "ws2":
        return gluon_prefill_ws2, dict(REGS=REGS)
    return gluon_prefill, dict(OVERLAP=overlap)
WS2_CONFIGS = [
    (128, 128, 2, "ws", 8),
    (128, 128, 2, "ws2", 4),
    (128, 128, 3, "ws2", 4),
    (128, 64, 3, "ws2", 4),
    (128, 64, 4, "ws2", 4),
]
if os.environ.get("WS") == "1":
    CONFIGS = WS_CONFIGS
if os.environ.get("WS") == "2":
    CONFIGS = WS2_CONFIGS


def compile_only() -> None:
    """Compiles every config for sm_90 on a machine without a GPU (Triton 3.6): catches what the frontend
    refuses and prints each config's shared memory, registers and spills."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    d, page = 128, 16
    for bm, bn, stages, overlap, warps in CONFIGS:
        q = torch.empty(4096, 32 * d, dtype=torch.bfloat16)
        kv = torch.empty(1024 * page, 8 * d, dtype=torch.bfloat16)
        qd = TensorDescriptor(q, list(q.shape), list(q.stride()), [bm, d],
                              gl.NVMMASharedLayout.get_default_for([bm, d], gl.bfloat16))  # fmt: skip
        kd = TensorDescriptor(kv, list(kv.shape), list(kv.stride()), [page, d],
                              gl.NVMMASharedLayout.get_default_for([page, d], gl.bfloat16))  # fmt: skip
        sig = {"q_desc": mangle_type(qd), "k_desc": mangle_type(kd), "v_desc": mangle_type(kd), "o_ptr": "*bf16",
               "bt_ptr": "*i32", "S": "i32", "bt_stride": "i32", "qk_scale": "fp32"}  # fmt: skip
        consts = dict(HQ=32, GROUP=4, D=d, BM=bm, BN=bn, PAGE=page, STAGES=stages, num_warps=warps)
        kernel, extra = kernel_and_constants(overlap)
        consts.update(extra)
        sig.update({k: "constexpr" for k in consts})
        name = f"bm{bm} bn{bn} s{stages} {overlap} w{warps}"
        try:
            c = triton.compile(GluonASTSource(kernel, sig, constexprs=consts),
                               target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})  # fmt: skip
        except Exception as error:
            print(f"{name}: {type(error).__name__}: {str(error)[-1500:]}")
            continue
        ptx = c.asm["ptx"]
        print(f"{name}: shared {c.metadata.shared} B, wgmma {ptx.count('wgmma.mma_async')}, "
              f"cp.async.bulk.tensor {ptx.count('cp.async.bulk.tensor')}, local st {ptx.count('st.local')}")  # fmt: skip


def main() -> None:
    if not torch.cuda.is_available():
        compile_only()
        return
    from harness.backends.builtin import resolve_backends
    from harness.cases.loading import load_cases
    from harness.cases.packaged import resolve_case_arg
    from harness.run.runner import case_inputs
    from harness.timing.timer import time_call

    rounds = int(os.environ.get("ROUNDS", "5"))
    pattern = os.environ.get("CASES", "prefill_*")
    cases = [c for c in load_cases([resolve_case_arg("gpu_peers")]) if fnmatch.fnmatch(c.id, pattern)
             and len(set(c.seq_lens)) == 1 and list(c.q_lens) == list(c.seq_lens) and c.dtype == "bfloat16"]  # fmt: skip
    (paged,) = resolve_backends(["triton"])
    (sdpa,) = resolve_backends(["sdpa_contiguous"])
    for case in cases:
        inputs = case_inputs(case, "cuda")
        B, S, hq, d = len(case.seq_lens), case.seq_lens[0], case.num_q_heads, case.head_dim
        flops = 4 * B * hq * d * S * (S + 1) / 2
        runs, outs = {}, {}
        for name, backend in (("sdpa", sdpa), ("paged", paged)):
            out = inputs.new_out()
            p = backend.prepare(case, inputs, out)
            p.run()
            runs[name], outs[name] = p.run, out
        hkv = case.num_kv_heads
        keys = torch.stack(inputs.keys).transpose(1, 2)  # [B, hkv, S, d]
        values = torch.stack(inputs.values).transpose(1, 2)
        ref = torch.nn.functional.scaled_dot_product_attention(
            inputs.q.view(B, S, hq, d).transpose(1, 2), keys, values, is_causal=True, enable_gqa=True
        ).transpose(1, 2).reshape(B * S, hq, d).float()
        for name in outs:
            o = outs[name].float()
            print(f"{name} vs SDPA on the gathered KV: max err {(o - ref).abs().max().item():.3g}, "
                  f"NaN {o.isnan().sum().item()}", flush=True)
        for bm, bn, stages, overlap, warps in CONFIGS:
            name = f"gluon bm{bm} bn{bn} s{stages} {dict([(False, 'ser'), (True, 'ovl')]).get(overlap, overlap)} w{warps}"
            out = inputs.new_out()
            try:
                fn = gluon_runner(inputs.q, inputs.k_cache, inputs.v_cache, inputs.block_table, out, S, bm, bn,
                                  stages, overlap, warps)  # fmt: skip
                fn()
                torch.cuda.synchronize()
            except Exception as error:
                print(f"{case.id} {name}: {type(error).__name__}: {str(error)[-600:]}", flush=True)
                continue
            err = (out.float() - ref).abs().max().item()
            print(f"{case.id} {name}: max err against SDPA {err:.3g}, NaN {out.isnan().sum().item()}", flush=True)
            if not err < 0.05:
                continue
            runs[name] = fn
        times = {name: [] for name in runs}
        for _ in range(rounds):
            for name, fn in runs.items():
                times[name].append(time_call(fn, "cuda", target_s=0.05, graph=True).median_us)
        base = statistics.median(times["sdpa"])
        print(f"\n== {case.id} (B {B}, S {S}, {hq}/{case.num_kv_heads} heads, d {d}, page {case.block_size}); "
              f"SDPA {base:.1f} us", flush=True)  # fmt: skip
        for name, ts in sorted(times.items(), key=lambda kv: statistics.median(kv[1])):
            med = statistics.median(ts)
            r = sorted(t / b for t, b in zip(ts, times["sdpa"], strict=True))
            print(f"  {name:34s} {med:9.1f} us {flops / med / 1e6:7.1f} TFLOP/s  x cuDNN {med / base:.3f} "
                  f"[{r[0]:.3f}, {r[-1]:.3f}]", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
