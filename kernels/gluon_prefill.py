"""Hopper's prefill: the kernel's causal prefill launches on sm_90, written in Triton's Gluon dialect.

The algorithm is ``kernels.triton_paged``'s (the same key tiles, base-2 online softmax in the
multiply-add form, fp32 accumulators, p cast to the value dtype before ``p @ v``), so
``kernels.tlsim`` predicts it as it predicts that kernel. What differs is how the work is fed
to the tensor cores, which Triton's own compiler does not do for a paged tile on sm_90:

* a TILE_N-key tile spans TILE_N / block_size blocks; each block's rows arrive as one TMA box
  (``tma.async_copy_global_to_shared``) into a row slice of one shared-memory tile, so a
  paged tile is fed by the copy engine like a contiguous one;
* a producer warp issues those copies STAGES tiles ahead, behind mbarriers (warp
  specialization: ``gl.warp_specialize``); a stage's K tile is refilled as soon as its Q K^T is
  done, without waiting for its V's P V (docs/performance.md, "Hopper's prefill");
* two consumer warpgroups of 64 query rows each run ``warpgroup_mma`` (wgmma) and the softmax,
  issuing tile j's Q K^T together with tile j - 1's P V and running tile j's softmax under it
  (FlashAttention-3's overlap). They take turns issuing, an mbarrier a turn (FlashAttention-3's
  ping-pong), so one warpgroup's softmax runs while the other's matrix products do: on an H100 that
  is 0.95-0.97x the time of one 8-warp partition, and the two warpgroups without turns were slower
  than it (docs/performance.md, "Hopper's prefill").

A work item: 128 query tokens of one query head (the tiles packed over sequences as
``kernels.tiling.Tiling`` packs BLOCK_Q tiles, found by binary search). The grid is persistent:
one program a multiprocessor, each taking item program_id first and then, as it nears the end of
an item, the next one no program has taken (an atomic counter, zeroed at each launch: greedy, as
the hardware hands out the programs of a grid of one program an item). Items are numbered a
sequence's last (longest) query tiles first, the heads of one tile side by side. The producer finds
each item (the block-table lookups and checks) and hands its numbers to the consumers through shared
memory, so they read no global memory between items; it copies the next item's Q into the second of
two Q buffers while the consumers work on this one, and its first K/V tiles as the ring frees.
The last tile of a sequence may hold keys past seq_len: their logits are masked, and V's rows
there are zeroed in shared memory before P V (the pool may hold anything there, NaN included; a
box wholly past seq_len copies the item's first box instead of reading the table past its end).
A bad block id among the columns a work item reads turns all its rows into NaN and no tile is
read: the contract's rule, at 128-token items where the Triton kernel's programs are BLOCK_Q
tokens, so rows that come before the bad key in an item that reaches it are NaN here and finite
there (and, with a window, rows whose window starts past it). With the checks off, no length read
from the tensors wraps an int32 bound or makes a wait hang. Nothing on the host reads
a tensor value.

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

BLOCK_M = 128  # query tokens a work item: two warpgroups' 64 rows each
STAGES = 2  # K/V tiles in flight (a 128-key tile at head_dim 128: 64 KiB of shared memory a stage)
NUM_WARPS = 4  # each consumer partition's warps: one warpgroup of BLOCK_M // 2 rows (the producer's warp on top)
HEAD_DIMS = (64, 128)
# False: every launch runs kernels.triton_paged (call kernels.launch_plan.clear_plans() after: a plan keeps its path)
ENABLED = True


def applies(call, tiling, lse) -> bool:
    """Whether a launch takes this path, from host-known facts only: an NVIDIA sm_90 GPU and Triton 3.6;
    a prefill launch (the tiling's class, a mean q_len of at least BLOCK_M, no KV split) over fp16 / bf16
    q and cache with head_dim == head_dim_v in HEAD_DIMS; no attention variant but a sliding window, and no
    lse; 128- or 64-key tiles (tiling.TILE_N); block_size a power of two from 16; and strides a TMA
    descriptor can take: q's and each pool's rows 16-byte aligned, each head's dims contiguous."""
    q, k, v = call.q, call.k_cache, call.v_cache
    if not (ENABLED and gluon is not None and on_hopper(q.device)):
        return False
    # every call option but the window off (a new one stays with the Triton kernel until this kernel learns it)
    plain = all(getattr(call, name) is None for name in CALL_OPTIONS if name != "sliding_window")
    plain = plain and lse is None and not call.kv_fp8
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
        programs = torch.cuda.get_device_properties(call.q.device).multi_processor_count  # one a multiprocessor
        self.grid = (min(num_q_tiles * call.num_q_heads, programs),)
        self.scalars = (num_q_tiles, call.num_q_heads, call.num_tokens, call.num_seqs, call.num_blocks,
                        call.block_table.shape[1], call.scale * math.log2(math.e), call.sliding_window or 0)  # fmt: skip
        self.constexprs = dict(GROUP=call.group_size, D=d, BN=tiling.TILE_N, BLOCK_SIZE=call.block_size, BOX=box,
                               STAGES=STAGES, BM=BLOCK_M, USE_WINDOW=call.sliding_window is not None,
                               num_warps=NUM_WARPS)  # fmt: skip

    def _desc(self, t: torch.Tensor, rows: int, row_stride: int, block: list, layout) -> TensorDescriptor:
        return TensorDescriptor(t, [rows, row_stride], [row_stride, 1], block, layout)

    def launch(self, q, k_cache, v_cache, block_table, seq_lens, query_start_loc, out) -> None:
        d, rows = self.head_dim, k_cache.shape[0] * k_cache.shape[1]
        q_desc = self._desc(q, q.shape[0], q.stride(0), [BLOCK_M, d], self.q_layout)
        k_desc = self._desc(k_cache, rows, k_cache.stride(1), [self.box, d], self.kv_layout)
        v_desc = self._desc(v_cache, rows, v_cache.stride(1), [self.box, d], self.kv_layout)
        item_counter = torch.zeros(1, dtype=torch.int32, device=q.device)
        prefill_kernel[self.grid](
            q_desc, k_desc, v_desc, out, block_table, seq_lens, query_start_loc, item_counter,
            q.stride(1), k_cache.stride(2), v_cache.stride(2), out.stride(0), out.stride(1), block_table.stride(0),
            *self.scalars, **self.constexprs,
        )  # fmt: skip


if gluon is not None:
    ITEM_SLOTS = gl.constexpr(2)  # work items handed from the producer to the consumers ahead of their reads
    Q_SLOTS = gl.constexpr(2)  # work items' Q tiles in shared memory: the next item's is copied during this one
    ITEM_FIELDS = gl.constexpr(8)  # what _publish_item hands over of a work item

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
    def _count_bad_blocks(bt_row, first_col, end_col, num_blocks, max_blocks_per_seq, num_warps: gl.constexpr):
        """Block-table columns [first_col, end_col) whose entry is outside [0, num_blocks) or past the table."""
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        bad = end_col * 0
        for c0 in range(first_col, end_col, 128):
            cols = c0 + gl.arange(0, 128, layout=layout)
            inside = cols < end_col
            ids = gl.load(bt_row + cols, mask=inside & (cols < max_blocks_per_seq), other=-1)
            bad += gl.sum((inside & ((ids < 0) | (ids >= num_blocks))).to(gl.int32), axis=0)
        return bad

    @gluon.jit
    def _store_nan_rows(out_ptr, o_row0, rows_left, head, stride_o_token, stride_o_head, BM: gl.constexpr,
                        D: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
        """A work item whose block ids include a bad one: NaN in its rows, and no tile read."""
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
        rows = gl.arange(0, BM, layout=gl.SliceLayout(1, layout))
        dims = gl.arange(0, D, layout=gl.SliceLayout(0, layout))
        offs = (o_row0 + rows).to(gl.int64)[:, None] * stride_o_token + head * stride_o_head + dims[None, :]
        nan = gl.full([BM, D], float("nan"), out_ptr.dtype.element_ty, layout=layout)
        gl.store(out_ptr + offs, nan, mask=((rows < rows_left) & (o_row0 + rows >= 0))[:, None])

    @gluon.jit
    def _publish_item(item_smem, item_ready, item_free, fields, taken, SLOTS: gl.constexpr):
        """The producer hands its program's taken-th work item to both consumers: ``fields``, the ITEM_FIELDS
        numbers :func:`_next_item` returns, through a ring of SLOTS rows of shared words (one ready barrier a
        slot, and a free one both consumers arrive on once they have read it). The consumers read no global
        memory to find their work: the lookups' latency stays with the producer, which runs ahead of them."""
        slot = taken % SLOTS
        mbarrier.wait(item_free.index(slot), ((taken // SLOTS) & 1) ^ 1)
        layout: gl.constexpr = gl.BlockedLayout([ITEM_FIELDS], [32], [1], [0])
        idx = gl.arange(0, ITEM_FIELDS, layout=layout)
        row = gl.zeros([ITEM_FIELDS], gl.int32, layout)
        for f in gl.static_range(ITEM_FIELDS):
            row = gl.where(idx == f, fields[f], row)
        item_smem.index(slot).store(row)
        mbarrier.arrive(item_ready.index(slot), count=1)

    @gluon.jit
    def _next_item(item_smem, item_ready, item_free, taken, SLOTS: gl.constexpr, num_warps: gl.constexpr):
        """A consumer's taken-th work item as :func:`_publish_item` handed it over: its head, seq_len, first query
        position, first row of out, real rows, key tiles [t0, t_end), and state (:func:`_work_item`'s, or -1: no
        more items)."""
        slot = taken % SLOTS
        mbarrier.wait(item_ready.index(slot), (taken // SLOTS) & 1)
        layout: gl.constexpr = gl.BlockedLayout([ITEM_FIELDS], [32], [num_warps], [0])  # every thread the whole row
        idx = gl.arange(0, ITEM_FIELDS, layout=layout)
        row = item_smem.index(slot).load(layout)
        mbarrier.arrive(item_free.index(slot), count=1)
        return (gl.sum(gl.where(idx == 0, row, 0), axis=0), gl.sum(gl.where(idx == 1, row, 0), axis=0),
                gl.sum(gl.where(idx == 2, row, 0), axis=0), gl.sum(gl.where(idx == 3, row, 0), axis=0),
                gl.sum(gl.where(idx == 4, row, 0), axis=0), gl.sum(gl.where(idx == 5, row, 0), axis=0),
                gl.sum(gl.where(idx == 6, row, 0), axis=0), gl.sum(gl.where(idx == 7, row, 0), axis=0))  # fmt: skip

    @gluon.jit
    def _work_item(w, walk, sizes, sliding_window, BM: gl.constexpr, BN: gl.constexpr, BLOCK_SIZE: gl.constexpr,
                   USE_WINDOW: gl.constexpr):  # fmt: skip
        """Work item w of the persistent grid (``walk`` and ``sizes``: the tuples prefill_kernel builds): query tile
        num_q_tiles - 1 - w // num_q_heads (a sequence's last tiles, the longest, first) of query head
        w % num_q_heads. Returns the head, the sequence's block-table row and seq_len, the tile's first query
        position, first row of q and out and real rows, its key tiles [t0, t_end) (t0 > 0 where a window hides the
        tiles before it: kernels.tiling.window_tile_start of the item's first query), and ``state``: 0 a spare tile
        (no query rows), 1 NaN rows (a bad block id among the columns it reads, or no key to see), 2 a tile to
        attend."""
        query_start_loc_ptr, seq_lens_ptr, block_table_ptr, stride_bt_seq = walk
        num_q_tiles, num_q_heads, num_tokens, num_seqs, num_blocks, max_blocks_per_seq = sizes
        head = w % num_q_heads
        seq, q_tile = _find_seq(query_start_loc_ptr, num_q_tiles - 1 - w // num_q_heads, num_seqs, BM)
        q_start = gl.load(query_start_loc_ptr + seq)
        q_len = gl.load(query_start_loc_ptr + seq + 1) - q_start
        seq_len = gl.load(seq_lens_ptr + seq)
        q_pos0 = seq_len - q_len + q_tile * BM
        # kernels.triton_paged's bounds, spelled so that garbage lengths (checks off) cannot wrap int32: the keys
        # the tile's rows see end at kv_end; its tiles read whole tiles of them, up to seq_len (walked)
        kv_end = seq_len - q_len + gl.minimum(q_len, (q_tile + 1) * BM)
        kv_start = q_pos0 * 0
        if USE_WINDOW:
            kv_start = gl.where(q_pos0 >= sliding_window, q_pos0 - sliding_window + 1, 0) // BN * BN  # no wrap
        span = gl.maximum(kv_end - kv_start, 0)
        n_tiles = span // BN + (span % BN > 0).to(gl.int32)
        room = gl.maximum(seq_len - kv_start, 0)
        walked = gl.where(n_tiles <= room // BN, gl.minimum(n_tiles, room // BN) * BN, room)
        # columns past the table are bad: counting one of them is enough
        first_col = gl.minimum(kv_start // BLOCK_SIZE, max_blocks_per_seq)
        end_col = gl.where(walked > 0, (kv_start + walked - 1) // BLOCK_SIZE + 1, first_col)
        end_col = gl.minimum(end_col, max_blocks_per_seq + 1)
        bt_row = block_table_ptr + seq * stride_bt_seq
        o_row0 = q_start + q_tile * BM
        rows_left = gl.minimum(q_len - q_tile * BM, num_tokens - o_row0)  # none past num_tokens (a bad table)
        bad = _count_bad_blocks(bt_row, first_col, end_col, num_blocks, max_blocks_per_seq, 1)
        spare = (q_tile < 0) | (q_tile * BM >= q_len)  # q_len 0, or short of a full tile
        state = gl.where(spare, 0, gl.where((bad > 0) | (n_tiles < 1), 1, 2))
        t0 = kv_start // BN
        return head, bt_row, seq_len, q_pos0, o_row0, rows_left, t0, t0 + n_tiles, state

    @gluon.jit
    def _box_row(bt_row, key, seq_len, first_key, BLOCK_SIZE: gl.constexpr):
        """The pool row of ``key``'s slot, or of ``first_key``'s (a checked column) where key is past seq_len."""
        key = gl.where(key < seq_len, key, first_key)
        return gl.load(bt_row + key // BLOCK_SIZE) * BLOCK_SIZE + key % BLOCK_SIZE

    @gluon.jit
    def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_free, k_ready, v_ready, k_free, v_free,
                  item_counter_ptr, item_smem, item_ready, item_free, walk, sizes, sliding_window, stride_q_head,
                  stride_k_head, stride_v_head, GROUP: gl.constexpr,
                  BM: gl.constexpr, BN: gl.constexpr, BLOCK_SIZE: gl.constexpr, BOX: gl.constexpr, STAGES: gl.constexpr,
                  USE_WINDOW: gl.constexpr):  # fmt: skip
        """One warp: the program's work items, item program_id first and then the next one not yet taken by any
        program (an atomic counter, taken once this item's copies are issued), each handed to the consumers; each
        item's Q into the buffer of the item two before it once both consumers are done with that item's Q K^Ts, and
        its K and V tiles (each as soon as its stage's last one is consumed), a TMA box of BOX rows at a time, STAGES
        tiles ahead of the consumers (across work items). A box wholly past seq_len copies the item's first box
        instead (a checked column; finite values the masks ignore)."""
        BOXES: gl.constexpr = BN // BOX
        done = 0  # tiles copied so far: the ring's slot and phase
        items = 0  # work items attended so far: Q's phase
        taken = 0  # work items taken so far: the item ring's slot and phase
        w = gl.program_id(0)
        head, bt_row, seq_len, q_pos0, q_row, rows_left, t0, t_end, state = _work_item(
            w, walk, sizes, sliding_window, BM, BN, BLOCK_SIZE, USE_WINDOW
        )
        fields = (head, seq_len, q_pos0, q_row, rows_left, t0, t_end, gl.where(w < sizes[0] * sizes[1], state, -1))
        _publish_item(item_smem, item_ready, item_free, fields, taken, ITEM_SLOTS)
        while w < sizes[0] * sizes[1]:
            if state == 2:
                qs = items % Q_SLOTS
                mbarrier.wait(q_free.index(qs), ((items // Q_SLOTS) & 1) ^ 1)
                mbarrier.expect(q_ready.index(qs), q_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(q_desc, [q_row, head * stride_q_head], q_ready.index(qs),
                                                q_smem.index(qs))  # fmt: skip
                k_col = (head // GROUP) * stride_k_head
                v_col = (head // GROUP) * stride_v_head
                for j in range(t_end - t0):  # tile t0 + j, the ring's tile done + j
                    st = (done + j) % STAGES
                    phase = ((done + j) // STAGES) & 1
                    mbarrier.wait(k_free.index(st), phase ^ 1)
                    mbarrier.expect(k_ready.index(st), BOXES * k_desc.block_type.nbytes)
                    for i in gl.static_range(BOXES):
                        row = _box_row(bt_row, (t0 + j) * BN + i * BOX, seq_len, t0 * BN, BLOCK_SIZE)
                        tma.async_copy_global_to_shared(k_desc, [row, k_col], k_ready.index(st),
                                                        k_smem.index(st).slice(i * BOX, BOX))  # fmt: skip
                    mbarrier.wait(v_free.index(st), phase ^ 1)
                    mbarrier.expect(v_ready.index(st), BOXES * v_desc.block_type.nbytes)
                    for i in gl.static_range(BOXES):
                        row = _box_row(bt_row, (t0 + j) * BN + i * BOX, seq_len, t0 * BN, BLOCK_SIZE)
                        tma.async_copy_global_to_shared(v_desc, [row, v_col], v_ready.index(st),
                                                        v_smem.index(st).slice(i * BOX, BOX))  # fmt: skip
                done += t_end - t0
                items += 1
            w = gl.num_programs(0) + gl.atomic_add(item_counter_ptr, 1, sem="relaxed")  # no data rides on it
            taken += 1
            head, bt_row, seq_len, q_pos0, q_row, rows_left, t0, t_end, state = _work_item(
                w, walk, sizes, sliding_window, BM, BN, BLOCK_SIZE, USE_WINDOW
            )
            fields = (head, seq_len, q_pos0, q_row, rows_left, t0, t_end, gl.where(w < sizes[0] * sizes[1], state, -1))
            _publish_item(item_smem, item_ready, item_free, fields, taken, ITEM_SLOTS)

    @gluon.jit
    def _softmax_step(s, m_i, l_i, key0, q_pos, last_key, masked, qk_scale, sliding_window, BN: gl.constexpr,
                      USE_WINDOW: gl.constexpr, s_layout: gl.constexpr):  # fmt: skip
        """One tile's online-softmax update (kernels.triton_paged._attend_tiles' fp16 / bf16 form): s [ROWS, BN]
        unscaled logits of keys key0.., masked to k_pos <= min(q_pos, last_key) where ``masked`` (and, with the
        window, to k_pos > q_pos - sliding_window)."""
        if masked:
            cols = gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
            bound = gl.minimum(q_pos, last_key) - key0
            visible = cols[None, :] <= bound[:, None]
            if USE_WINDOW:
                visible = visible & ((key0 + cols)[None, :] - q_pos[:, None] > -sliding_window)
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
    def _attend(q_smem, k_smem, v_smem, q_ready, q_free, k_ready, v_ready, k_free, v_free, turn, out_ptr, t0, t_end,
                q_pos0, seq_len, o_row0, rows_left, head, stride_o_token, stride_o_head, qk_scale, sliding_window,
                done, items, turns, ROWS: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr,
                W: gl.constexpr, USE_WINDOW: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
        """Warpgroup W (0 or 1) on one work item: query rows q_pos0.. (``rows_left`` of them real) over key tiles
        t0..t_end - 1, Q K^T of tile t issued with P V of tile t - 1 and tile t's softmax run under it; then the
        normalised rows stored. The item's tiles are the ring's tiles done.., its Q the items-th. Its issues are
        its turns: turn i waits for the other warpgroup's turn i - 1 (``turn.index(W)``, warpgroup 0 first) and
        hands over when its wgmma are issued; both take t_end - t0 + 1 turns an item, counted from ``turns``."""
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                           instr_shape=[16, BN, 16])  # fmt: skip
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                           instr_shape=[16, D, 16])  # fmt: skip
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        dtype: gl.constexpr = q_smem.dtype
        qs = items % Q_SLOTS
        q_rows = q_smem.index(qs).slice(W * ROWS, ROWS)
        q_pos = q_pos0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
        # tiles before it lie wholly below every row's diagonal and before seq_len; the window masks every tile
        unmasked = gl.where(USE_WINDOW, 0, (q_pos0 + 1) // BN)
        last_key = seq_len - 1
        m_i = gl.full([ROWS], -float("inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, s_layout))
        acc = gl.zeros([ROWS, D], gl.float32, layout=o_layout)
        s_zero = gl.zeros([ROWS, BN], gl.float32, layout=s_layout)
        mbarrier.wait(q_ready.index(qs), (items // Q_SLOTS) & 1)
        mbarrier.wait(k_ready.index(done % STAGES), (done // STAGES) & 1)
        mbarrier.wait(turn.index(W), (turns + 1 - W) & 1)
        s = warpgroup_mma(q_rows, k_smem.index(done % STAGES).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        mbarrier.arrive(turn.index(1 - W), count=1)
        s = warpgroup_mma_wait(0, deps=(s,))
        mbarrier.arrive(k_free.index(done % STAGES), count=1)
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, t0 * BN, q_pos, last_key, t0 >= unmasked, qk_scale,
                                           sliding_window, BN, USE_WINDOW, s_layout)  # fmt: skip
        for j in range(1, t_end - t0):  # tile t0 + j, the ring's tile done + j
            st = (done + j) % STAGES
            prev = (done + j - 1) % STAGES
            mbarrier.wait(k_ready.index(st), ((done + j) // STAGES) & 1)
            mbarrier.wait(v_ready.index(prev), ((done + j - 1) // STAGES) & 1)
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            mbarrier.wait(turn.index(W), (turns + j + 1 - W) & 1)
            s = warpgroup_mma(q_rows, k_smem.index(st).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
            mbarrier.arrive(turn.index(1 - W), count=1)
            s = warpgroup_mma_wait(1, deps=(s,))
            mbarrier.arrive(k_free.index(st), count=1)
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, (t0 + j) * BN, q_pos, last_key, t0 + j >= unmasked,
                                               qk_scale, sliding_window, BN, USE_WINDOW, s_layout)  # fmt: skip
            acc = warpgroup_mma_wait(0, deps=(acc,))
            mbarrier.arrive(v_free.index(prev), count=1)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        mbarrier.arrive(q_free.index(qs), count=1)  # every Q K^T is done: the producer may copy a Q into it
        last = done + t_end - t0 - 1
        mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
        if t_end * BN > seq_len:
            _zero_past_end(v_smem.index(last % STAGES), seq_len - (t_end - 1) * BN, BN, D, num_warps)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        mbarrier.wait(turn.index(W), (turns + t_end - t0 + 1 - W) & 1)
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
    def _consumer(q_smem, k_smem, v_smem, q_ready, q_free, k_ready, v_ready, k_free, v_free, turn, item_smem,
                  item_ready, item_free, out_ptr, sliding_window, stride_o_token, stride_o_head, qk_scale,
                  ROWS: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, W: gl.constexpr,
                  USE_WINDOW: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
        """Warpgroup W's walk over the program's work items: rows W * ROWS.. of each tile attended
        (:func:`_attend`) or set to NaN, in the order the producer hands them over; the ring's tiles, Q's and the
        turns counted as the producer counts them."""
        done = 0
        items = 0
        turns = 0
        taken = 0
        head, seq_len, q_pos0, o_row0, rows_left, t0, t_end, state = _next_item(
            item_smem, item_ready, item_free, taken, ITEM_SLOTS, num_warps
        )
        while state >= 0:
            if state == 2:
                _attend(q_smem, k_smem, v_smem, q_ready, q_free, k_ready, v_ready, k_free, v_free, turn, out_ptr, t0,
                        t_end, q_pos0 + W * ROWS, seq_len, o_row0 + W * ROWS, rows_left - W * ROWS, head,
                        stride_o_token, stride_o_head, qk_scale, sliding_window, done, items, turns, ROWS, BN, D,
                        STAGES, W, USE_WINDOW, num_warps)  # fmt: skip
                done += t_end - t0
                items += 1
                turns += t_end - t0 + 1
            elif state == 1:
                _store_nan_rows(out_ptr, o_row0 + W * ROWS, rows_left - W * ROWS, head, stride_o_token,
                                stride_o_head, ROWS, D, num_warps)  # fmt: skip
            taken += 1
            head, seq_len, q_pos0, o_row0, rows_left, t0, t_end, state = _next_item(
                item_smem, item_ready, item_free, taken, ITEM_SLOTS, num_warps
            )

    @gluon.jit
    def prefill_kernel(
        q_desc,  # q [num_tokens, num_q_heads, head_dim] as rows of q.stride(0) elements, boxes [128, D]
        k_desc,  # k_cache [num_blocks, block_size, num_kv_heads, D] as rows of a slot, boxes [BOX, D]
        v_desc,  # v_cache, the same
        out_ptr,  # [num_tokens, num_q_heads, D]
        block_table_ptr,  # [num_seqs, max_blocks_per_seq] int32
        seq_lens_ptr,  # [num_seqs] int32
        query_start_loc_ptr,  # [num_seqs + 1] int32
        item_counter_ptr,  # [1] int32, 0 at launch: work items taken past the first one of each program
        stride_q_head, stride_k_head, stride_v_head, stride_o_token, stride_o_head, stride_bt_seq,
        num_q_tiles, num_q_heads, num_tokens, num_seqs, num_blocks, max_blocks_per_seq,
        qk_scale,  # softmax scale * log2(e)
        sliding_window,  # W (read when USE_WINDOW)
        GROUP: gl.constexpr,  # query heads a KV head
        D: gl.constexpr,  # head_dim (64 or 128)
        BN: gl.constexpr,  # keys a tile (kernels.tiling's TILE_N)
        BLOCK_SIZE: gl.constexpr,
        BOX: gl.constexpr,  # rows a TMA box: min(BLOCK_SIZE, BN)
        STAGES: gl.constexpr,
        BM: gl.constexpr,  # query tokens a work item (BLOCK_M)
        USE_WINDOW: gl.constexpr,  # a query at position p sees keys p - W + 1 .. p
        num_warps: gl.constexpr,  # each consumer partition's (NUM_WARPS)
    ):  # fmt: skip
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [Q_SLOTS, BM, D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BN, D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BN, D], v_desc.layout)
        q_ready = gl.allocate_shared_memory(gl.int64, [Q_SLOTS, 1], mbarrier.MBarrierLayout())
        q_free = gl.allocate_shared_memory(gl.int64, [Q_SLOTS, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        item_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        item_smem = gl.allocate_shared_memory(gl.int32, [ITEM_SLOTS, ITEM_FIELDS], item_layout)
        item_ready = gl.allocate_shared_memory(gl.int64, [ITEM_SLOTS, 1], mbarrier.MBarrierLayout())
        item_free = gl.allocate_shared_memory(gl.int64, [ITEM_SLOTS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(Q_SLOTS):
            mbarrier.init(q_ready.index(i), count=1)
            mbarrier.init(q_free.index(i), count=2)  # one arrival a consumer partition, as the free barriers below
        mbarrier.init(turn.index(0), count=1)
        mbarrier.init(turn.index(1), count=1)
        for i in gl.static_range(ITEM_SLOTS):
            mbarrier.init(item_ready.index(i), count=1)
            mbarrier.init(item_free.index(i), count=2)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_free.index(i), count=2)
            mbarrier.init(v_free.index(i), count=2)
        HALF: gl.constexpr = BM // 2
        walk = (query_start_loc_ptr, seq_lens_ptr, block_table_ptr, stride_bt_seq)
        sizes = (num_q_tiles, num_q_heads, num_tokens, num_seqs, num_blocks, max_blocks_per_seq)
        gl.warp_specialize(
            [
                (_consumer, (q_smem, k_smem, v_smem, q_ready, q_free, k_ready, v_ready, k_free, v_free,
                             turn, item_smem, item_ready, item_free, out_ptr, sliding_window,
                             stride_o_token, stride_o_head, qk_scale, HALF, BN, D, STAGES, 0, USE_WINDOW, num_warps)),
                (_consumer, (q_smem, k_smem, v_smem, q_ready, q_free, k_ready, v_ready, k_free, v_free,
                             turn, item_smem, item_ready, item_free, out_ptr, sliding_window,
                             stride_o_token, stride_o_head, qk_scale, HALF, BN, D, STAGES, 1, USE_WINDOW, num_warps)),
                (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_free, k_ready, v_ready, k_free,
                             v_free, item_counter_ptr, item_smem, item_ready, item_free, walk, sizes, sliding_window,
                             stride_q_head, stride_k_head, stride_v_head, GROUP,
                             BM, BN, BLOCK_SIZE, BOX, STAGES, USE_WINDOW)),
            ],
            [num_warps, 1],
            [232, 24],
        )  # fmt: skip
