"""Hopper's prefill: the kernel's causal prefill launches on sm_90, written in Triton's Gluon dialect.

The algorithm is ``kernels.triton_paged``'s (the same key tiles, base-2 online softmax in the
multiply-add form, fp32 accumulators, p cast to the value dtype before ``p @ v``), so
``kernels.tlsim`` predicts it as it predicts that kernel. What differs is how the work is fed
to the tensor cores, which Triton's own compiler does not do for a paged tile on sm_90:

* a TILE_N-key tile spans TILE_N / block_size blocks; each block's rows arrive as one TMA box
  (``tma.async_copy_global_to_shared``) into a row slice of one shared-memory tile, so a
  paged tile is fed by the copy engine like a contiguous one;
* a producer warp issues those copies STAGES tiles ahead, behind mbarriers (warp
  specialization: ``gl.warp_specialize``);
* two consumer warpgroups of 64 query rows each run ``warpgroup_mma`` (wgmma) and the softmax,
  issuing tile j's Q K^T together with tile j - 1's P V and running tile j's softmax under it
  (FlashAttention-3's overlap). They take turns issuing, an mbarrier a turn (FlashAttention-3's
  ping-pong), so one warpgroup's softmax runs while the other's matrix products do: on an H100 that
  is 0.95-0.97x the time of one 8-warp partition, and the two warpgroups without turns were slower
  than it (docs/performance.md, "Hopper's prefill").

One program: 128 query tokens of one query head (the tiles packed over sequences as
``kernels.tiling.Tiling`` packs BLOCK_Q tiles, found by binary search). The last tile of a
sequence may hold keys past seq_len: their logits are masked, and V's rows there are zeroed
in shared memory before P V (the pool may hold anything there, NaN included; a box wholly past
seq_len copies the sequence's first box instead of reading the table past its end). A bad block
id among the columns a program reads turns all its rows into NaN and no tile is read: the
contract's rule, at 128-token programs where the Triton kernel's are BLOCK_Q tokens, so rows
that come before the bad key in a program that reaches it are NaN here and finite there. With
the checks off, no length read from the tensors wraps an int32 bound or makes a wait hang.
Nothing on the host reads a tensor value.

:func:`applies` says which launches take this path; the rest run ``kernels.triton_paged``.
Measured against that kernel and cuDNN in docs/performance.md ("Hopper's prefill").
"""

from __future__ import annotations

import math

import torch
import triton

from .contract import CALL_OPTIONS

# Gluon's API moves between Triton releases; this module is written and measured against 3.6.
GLUON_TRITON = "3.6."
try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError:  # a Triton without Gluon: applies() is False and nothing below is compiled
    gluon = None

BLOCK_M = 128  # query tokens a program: two warpgroups' 64 rows each
STAGES = 2  # K/V tiles in flight (a 128-key tile at head_dim 128: 64 KiB of shared memory a stage)
NUM_WARPS = 4  # each consumer partition's warps: one warpgroup of BLOCK_M // 2 rows (the producer's warp on top)
HEAD_DIMS = (64, 128)
# False: every launch runs kernels.triton_paged (call kernels.launch_plan.clear_plans() after: a plan keeps its path)
ENABLED = True


def applies(call, tiling, lse) -> bool:
    """Whether a launch takes this path, from host-known facts only: an NVIDIA sm_90 GPU and Triton 3.6;
    a prefill launch (the tiling's class, a mean q_len of at least BLOCK_M, no KV split) over fp16 / bf16
    q and cache with head_dim == head_dim_v in HEAD_DIMS; every call option off (no attention variant) and
    no lse; 128- or 64-key tiles (tiling.TILE_N); block_size a power of two from 16; and strides a TMA
    descriptor can take: q's and each pool's rows 16-byte aligned, each head's dims contiguous."""
    q, k, v = call.q, call.k_cache, call.v_cache
    if not (ENABLED and gluon is not None and on_hopper(q.device)):
        return False
    # every call option off (a new one stays with the Triton kernel until this kernel learns it), no lse
    plain = all(getattr(call, name) is None for name in CALL_OPTIONS) and lse is None and not call.kv_fp8
    shapes = (
        tiling.TUNING_KEY[2] == "prefill"
        and tiling.NUM_SPLITS == 1
        and tiling.TILE_N in (64, 128)
        and call.given_query_start_loc is not None
        and call.num_tokens >= BLOCK_M * call.num_seqs
        and q.dtype in (torch.float16, torch.bfloat16)
        and k.dtype == v.dtype == q.dtype
        and call.head_dim == call.head_dim_v
        and call.head_dim in HEAD_DIMS
        and call.block_size >= 16
        and call.block_size & (call.block_size - 1) == 0
        and call.num_blocks * call.block_size < 2**31
    )
    return plain and shapes and _tma_strides(q, k, v, call)


def on_hopper(device: torch.device) -> bool:
    """An NVIDIA sm_90 GPU, and the Triton release this module is written for."""
    if device.type != "cuda" or torch.version.hip or not triton.__version__.startswith(GLUON_TRITON):
        return False
    return torch.cuda.get_device_capability(device) == (9, 0)


def _tma_strides(q, k, v, call) -> bool:
    """q as [num_tokens, q.stride(0)] rows and each pool as [num_blocks * block_size, slot stride] rows, every
    head's head_dim elements contiguous inside a row (a head-major q is not), rows and bases 16-byte aligned
    (the copy engine's rule)."""
    size = q.element_size()
    q_ok = (
        q.stride(2) == 1
        and q.stride(1) >= call.head_dim
        and (call.num_q_heads - 1) * q.stride(1) + call.head_dim <= q.stride(0)
        and q.stride(0) * size % 16 == 0
    )
    pools_ok = all(
        p.stride(3) == 1
        and p.stride(0) == call.block_size * p.stride(1)
        and (call.num_kv_heads - 1) * p.stride(2) + call.head_dim <= p.stride(1)
        and p.stride(1) * size % 16 == 0
        for p in (k, v)
    )
    return q_ok and pools_ok and all(t.data_ptr() % 16 == 0 for t in (q, k, v))


class GluonPrefill:
    """One plan's launch of :func:`prefill_kernel`: the grid and constants from the call's shapes; the tensor
    descriptors (which hold the tensors' addresses) made at each launch.

    ``launch(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, out)`` with the tensors of
    ``kernels.triton_paged.TritonPlan.launch``."""

    def __init__(self, call, tiling):
        d, box = call.head_dim, min(call.block_size, tiling.TILE_N)
        dtype = gl.float16 if call.q.dtype == torch.float16 else gl.bfloat16
        self.q_layout = gl.NVMMASharedLayout.get_default_for([BLOCK_M, d], dtype)
        self.kv_layout = gl.NVMMASharedLayout.get_default_for([box, d], dtype)
        self.box, self.head_dim = box, d
        num_q_tiles = (call.num_tokens + call.num_seqs * (BLOCK_M - 1)) // BLOCK_M
        self.grid = (num_q_tiles, call.num_q_heads)
        self.scalars = (call.num_tokens, call.num_seqs, call.num_blocks, call.block_table.shape[1],
                        call.scale * math.log2(math.e))  # fmt: skip
        self.constexprs = dict(GROUP=call.group_size, D=d, BN=tiling.TILE_N, BLOCK_SIZE=call.block_size, BOX=box,
                               STAGES=STAGES, BM=BLOCK_M, num_warps=NUM_WARPS)  # fmt: skip

    def _desc(self, t: torch.Tensor, rows: int, row_stride: int, block: list, layout) -> TensorDescriptor:
        return TensorDescriptor(t, [rows, row_stride], [row_stride, 1], block, layout)

    def launch(self, q, k_cache, v_cache, block_table, seq_lens, query_start_loc, out) -> None:
        d, rows = self.head_dim, k_cache.shape[0] * k_cache.shape[1]
        q_desc = self._desc(q, q.shape[0], q.stride(0), [BLOCK_M, d], self.q_layout)
        k_desc = self._desc(k_cache, rows, k_cache.stride(1), [self.box, d], self.kv_layout)
        v_desc = self._desc(v_cache, rows, v_cache.stride(1), [self.box, d], self.kv_layout)
        prefill_kernel[self.grid](
            q_desc, k_desc, v_desc, out, block_table, seq_lens, query_start_loc,
            q.stride(1), k_cache.stride(2), v_cache.stride(2), out.stride(0), out.stride(1), block_table.stride(0),
            *self.scalars, **self.constexprs,
        )  # fmt: skip


if gluon is not None:

    @gluon.jit
    def _find_seq(query_start_loc_ptr, q_tile, num_seqs, BM: gl.constexpr):
        """kernels.triton_paged._find_seq at BM-token tiles: the sequence owning ``q_tile`` and its index there."""
        lo = q_tile * 0
        hi = lo + num_seqs
        while hi - lo > 1:
            mid = (lo + hi) // 2
            first = (gl.load(query_start_loc_ptr + mid) + mid * (BM - 1)) // BM
            if first <= q_tile:
                lo = mid
            else:
                hi = mid
        first = (gl.load(query_start_loc_ptr + lo) + lo * (BM - 1)) // BM
        return lo, q_tile - first

    @gluon.jit
    def _count_bad_blocks(bt_row, end_col, num_blocks, max_blocks_per_seq, num_warps: gl.constexpr):
        """Block-table columns [0, end_col) whose entry is outside [0, num_blocks) or past the table."""
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        bad = end_col * 0
        for c0 in range(0, end_col, 128):
            cols = c0 + gl.arange(0, 128, layout=layout)
            inside = cols < end_col
            ids = gl.load(bt_row + cols, mask=inside & (cols < max_blocks_per_seq), other=-1)
            bad += gl.sum((inside & ((ids < 0) | (ids >= num_blocks))).to(gl.int32), axis=0)
        return bad

    @gluon.jit
    def _store_nan_rows(out_ptr, o_row0, rows_left, head, stride_o_token, stride_o_head, BM: gl.constexpr,
                        D: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
        """A program whose block ids include a bad one: NaN in its rows, and no tile read."""
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
        rows = gl.arange(0, BM, layout=gl.SliceLayout(1, layout))
        dims = gl.arange(0, D, layout=gl.SliceLayout(0, layout))
        offs = (o_row0 + rows).to(gl.int64)[:, None] * stride_o_token + head * stride_o_head + dims[None, :]
        nan = gl.full([BM, D], float("nan"), out_ptr.dtype.element_ty, layout=layout)
        gl.store(out_ptr + offs, nan, mask=((rows < rows_left) & (o_row0 + rows >= 0))[:, None])

    @gluon.jit
    def _producer(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_free, v_free, bt_row, seq_len, k_col, v_col,
                  n_tiles, BN: gl.constexpr, BLOCK_SIZE: gl.constexpr, BOX: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
        """One warp: each tile's K and V, a TMA box of BOX rows at a time, STAGES tiles ahead of the consumers.
        A box wholly past seq_len copies the sequence's first box instead (finite values the masks ignore)."""
        BOXES: gl.constexpr = BN // BOX
        for j in range(n_tiles):
            st = j % STAGES
            phase = (j // STAGES) & 1
            mbarrier.wait(k_free.index(st), phase ^ 1)
            mbarrier.wait(v_free.index(st), phase ^ 1)
            mbarrier.expect(k_ready.index(st), BOXES * k_desc.block_type.nbytes)
            mbarrier.expect(v_ready.index(st), BOXES * v_desc.block_type.nbytes)
            for i in gl.static_range(BOXES):
                key = j * BN + i * BOX
                key = gl.where(key < seq_len, key, 0)
                row = gl.load(bt_row + key // BLOCK_SIZE) * BLOCK_SIZE + key % BLOCK_SIZE
                tma.async_copy_global_to_shared(k_desc, [row, k_col], k_ready.index(st),
                                                k_smem.index(st).slice(i * BOX, BOX))  # fmt: skip
                tma.async_copy_global_to_shared(v_desc, [row, v_col], v_ready.index(st),
                                                v_smem.index(st).slice(i * BOX, BOX))  # fmt: skip

    @gluon.jit
    def _softmax_step(s, m_i, l_i, key0, q_pos, last_key, masked, qk_scale, BN: gl.constexpr, s_layout: gl.constexpr):
        """One tile's online-softmax update (kernels.triton_paged._attend_tiles' fp16 / bf16 form): s [ROWS, BN]
        unscaled logits of keys key0.., masked to k_pos <= min(q_pos, last_key) where ``masked``."""
        if masked:
            bound = gl.minimum(q_pos, last_key) - key0
            visible = gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))[None, :] <= bound[:, None]
            s = gl.where(visible, s, -float("inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        m_scaled = gl.where(m_new == -float("inf"), 0.0, m_new) * qk_scale
        alpha = gl.exp2(m_i * qk_scale - m_scaled)
        p = gl.exp2(s * qk_scale - m_scaled[:, None])
        l_i = l_i * alpha + gl.sum(p, axis=1)
        return p, alpha, m_new, l_i

    @gluon.jit
    def _zero_past_end(v_tile, valid, BN: gl.constexpr, D: gl.constexpr, num_warps: gl.constexpr):
        """V's rows >= valid of one shared tile set to 0 (the pool past seq_len may hold NaN, and 0 * NaN is
        NaN). Both consumers write the same zeros; each fences its own writes before its P V reads them."""
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
        for c in gl.static_range(BN // 16):
            if c * 16 + 16 > valid:
                chunk = v_tile.slice(c * 16, 16)
                rows = c * 16 + gl.arange(0, 16, layout=gl.SliceLayout(1, layout))
                vals = chunk.load(layout)
                chunk.store(gl.where((rows < valid)[:, None], vals, gl.zeros_like(vals)))
        fence_async_shared()

    @gluon.jit
    def _consumer(q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_free, v_free, turn, out_ptr, n_tiles, q_pos0,
                  seq_len, o_row0, rows_left, head, stride_o_token, stride_o_head, qk_scale,
                  ROWS: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, W: gl.constexpr,
                  num_warps: gl.constexpr):  # fmt: skip
        """Warpgroup W (0 or 1): query rows q_pos0.. (``rows_left`` of them real), Q K^T of tile j issued with P V
        of tile j - 1 and tile j's softmax run under it; then the normalised rows stored. Its issues are its
        turns: turn t waits for the other warpgroup's turn t - 1 (``turn.index(W)``, warpgroup 0 first) and
        hands over when its wgmma are issued; both take n_tiles + 1 turns."""
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                           instr_shape=[16, BN, 16])  # fmt: skip
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                           instr_shape=[16, D, 16])  # fmt: skip
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        dtype: gl.constexpr = q_smem.dtype
        q_pos = q_pos0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
        unmasked = (q_pos0 + 1) // BN  # tiles before it lie wholly below every row's diagonal and before seq_len
        last_key = seq_len - 1
        m_i = gl.full([ROWS], -float("inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, s_layout))
        acc = gl.zeros([ROWS, D], gl.float32, layout=o_layout)
        s_zero = gl.zeros([ROWS, BN], gl.float32, layout=s_layout)
        mbarrier.wait(q_bar, 0)
        mbarrier.wait(k_ready.index(0), 0)
        mbarrier.wait(turn.index(W), (1 - W) & 1)
        s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        mbarrier.arrive(turn.index(1 - W), count=1)
        s = warpgroup_mma_wait(0, deps=(s,))
        mbarrier.arrive(k_free.index(0), count=1)
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, 0, q_pos, last_key, unmasked <= 0, qk_scale, BN, s_layout)
        for j in range(1, n_tiles):
            st = j % STAGES
            prev = (j - 1) % STAGES
            mbarrier.wait(k_ready.index(st), (j // STAGES) & 1)
            mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            mbarrier.wait(turn.index(W), (j + 1 - W) & 1)
            s = warpgroup_mma(q_smem, k_smem.index(st).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
            mbarrier.arrive(turn.index(1 - W), count=1)
            s = warpgroup_mma_wait(1, deps=(s,))
            mbarrier.arrive(k_free.index(st), count=1)
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, j * BN, q_pos, last_key, j >= unmasked, qk_scale, BN,
                                               s_layout)  # fmt: skip
            acc = warpgroup_mma_wait(0, deps=(acc,))
            mbarrier.arrive(v_free.index(prev), count=1)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        last = n_tiles - 1
        mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
        if (last + 1) * BN > seq_len:
            _zero_past_end(v_smem.index(last % STAGES), seq_len - last * BN, BN, D, num_warps)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        mbarrier.wait(turn.index(W), (n_tiles + 1 - W) & 1)
        acc = warpgroup_mma(p_op, v_smem.index(last % STAGES), acc, is_async=True)
        mbarrier.arrive(turn.index(1 - W), count=1)
        acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(v_free.index(last % STAGES), count=1)
        acc = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
        rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, o_layout))
        dims = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
        offs = (o_row0 + rows).to(gl.int64)[:, None] * stride_o_token + head * stride_o_head + dims[None, :]
        gl.store(out_ptr + offs, acc.to(dtype), mask=((rows < rows_left) & (o_row0 + rows >= 0))[:, None])

    @gluon.jit
    def prefill_kernel(
        q_desc,  # q [num_tokens, num_q_heads, head_dim] as rows of q.stride(0) elements, boxes [128, D]
        k_desc,  # k_cache [num_blocks, block_size, num_kv_heads, D] as rows of a slot, boxes [BOX, D]
        v_desc,  # v_cache, the same
        out_ptr,  # [num_tokens, num_q_heads, D]
        block_table_ptr,  # [num_seqs, max_blocks_per_seq] int32
        seq_lens_ptr,  # [num_seqs] int32
        query_start_loc_ptr,  # [num_seqs + 1] int32
        stride_q_head, stride_k_head, stride_v_head, stride_o_token, stride_o_head, stride_bt_seq,
        num_tokens, num_seqs, num_blocks, max_blocks_per_seq, qk_scale,  # qk_scale: softmax scale * log2(e)
        GROUP: gl.constexpr,  # query heads a KV head
        D: gl.constexpr,  # head_dim (64 or 128)
        BN: gl.constexpr,  # keys a tile (kernels.tiling's TILE_N)
        BLOCK_SIZE: gl.constexpr,
        BOX: gl.constexpr,  # rows a TMA box: min(BLOCK_SIZE, BN)
        STAGES: gl.constexpr,
        BM: gl.constexpr,  # query tokens a program (BLOCK_M)
        num_warps: gl.constexpr,  # each consumer partition's (NUM_WARPS)
    ):  # fmt: skip
        head = gl.program_id(1)
        seq, q_tile = _find_seq(query_start_loc_ptr, gl.program_id(0), num_seqs, BM)
        q_start = gl.load(query_start_loc_ptr + seq)
        q_len = gl.load(query_start_loc_ptr + seq + 1) - q_start
        if (q_tile < 0) | (q_tile * BM >= q_len):  # a spare tile (q_len 0, or short of a full tile)
            return
        seq_len = gl.load(seq_lens_ptr + seq)
        q_pos0 = seq_len - q_len + q_tile * BM
        # kernels.triton_paged's bounds, spelled so that garbage lengths (checks off) cannot wrap int32: the keys
        # the program's rows see end at kv_end; its tiles read whole tiles of them, up to seq_len (walked)
        kv_end = seq_len - q_len + gl.minimum(q_len, (q_tile + 1) * BM)
        span = gl.maximum(kv_end, 0)
        n_tiles = span // BN + (span % BN > 0).to(gl.int32)
        room = gl.maximum(seq_len, 0)
        walked = gl.where(n_tiles <= room // BN, gl.minimum(n_tiles, room // BN) * BN, room)
        # columns past the table are bad: counting one of them is enough
        end_col = gl.minimum(gl.where(walked > 0, (walked - 1) // BLOCK_SIZE + 1, 0), max_blocks_per_seq + 1)
        bt_row = block_table_ptr + seq * stride_bt_seq
        o_row0 = q_start + q_tile * BM
        rows_left = gl.minimum(q_len - q_tile * BM, num_tokens - o_row0)  # none past num_tokens (a bad table)
        bad = _count_bad_blocks(bt_row, end_col, num_blocks, max_blocks_per_seq, num_warps)
        if (bad > 0) | (n_tiles < 1):  # a bad block id, or no key to see (q_len > seq_len, checks off): NaN rows
            _store_nan_rows(out_ptr, o_row0, rows_left, head, stride_o_token, stride_o_head, BM, D, num_warps)
            return
        kv_head = head // GROUP
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [BM, D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BN, D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BN, D], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        mbarrier.init(turn.index(0), count=1)
        mbarrier.init(turn.index(1), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_free.index(i), count=2)  # one arrival a consumer partition
            mbarrier.init(v_free.index(i), count=2)
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [q_start + q_tile * BM, head * stride_q_head], q_bar, q_smem)
        HALF: gl.constexpr = BM // 2
        gl.warp_specialize(
            [
                (_consumer, (q_smem.slice(0, HALF), k_smem, v_smem, q_bar, k_ready, v_ready, k_free, v_free, turn,
                             out_ptr, n_tiles, q_pos0, seq_len, o_row0, rows_left, head, stride_o_token,
                             stride_o_head, qk_scale, HALF, BN, D, STAGES, 0, num_warps)),
                (_consumer, (q_smem.slice(HALF, HALF), k_smem, v_smem, q_bar, k_ready, v_ready, k_free, v_free, turn,
                             out_ptr, n_tiles, q_pos0 + HALF, seq_len, o_row0 + HALF, rows_left - HALF, head,
                             stride_o_token, stride_o_head, qk_scale, HALF, BN, D, STAGES, 1, num_warps)),
                (_producer, (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_free, v_free, bt_row, seq_len,
                             kv_head * stride_k_head, kv_head * stride_v_head, n_tiles, BN, BLOCK_SIZE, BOX, STAGES)),
            ],
            [num_warps, 1],
            [232, 24],
        )  # fmt: skip
