"""The engine path at the floor: a device-resident block table, one StepMetadata a step,
and reads through it that make no host sync (and capture in one CUDA graph on a GPU)."""

from __future__ import annotations

import pytest
import torch

import kernels
from harness.cases.vocab import DEFAULT_TOLERANCES
from harness.run.grading import grade
from harness.run.oracle import paged_attention_oracle

NUM_LAYERS, NUM_KV_HEADS, HEAD_DIM, NUM_Q_HEADS = 3, 2, 32, 4
CUDA = torch.cuda.is_available()


def _assert_matches_the_oracle(cache, seq_ids, layer: int, q, out, starts=None):
    table, lens = cache.block_table(seq_ids), cache.seq_lens(seq_ids)
    expected = paged_attention_oracle(q, cache.k_caches[layer], cache.v_caches[layer], table, lens, starts)
    tolerance = DEFAULT_TOLERANCES[str(q.dtype).removeprefix("torch.")]
    assert grade(out, expected, *tolerance).passed, f"layer {layer}"


def busy_cache(device="cpu", backend=None, dtype=torch.float32, **table_size) -> tuple[kernels.PagedKVCache, list[int]]:
    """A cache after an engine's churn: interleaved appends, so the sequences' blocks interleave in the pool, a
    reused freed row, every layer written."""
    cache = kernels.PagedKVCache(
        NUM_LAYERS, num_blocks=40, block_size=4, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM,
        dtype=dtype, device=device, backend=backend, **table_size,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(5)

    def grow(seq_id, n):
        slots = cache.append(seq_id, n)
        for layer in range(NUM_LAYERS):
            kv = torch.randn(2, n, NUM_KV_HEADS, HEAD_DIM, generator=gen)
            cache.write(layer, slots, kv[0].to(device), kv[1].to(device))

    for seq_id in range(10):
        cache.allocate(seq_id)
    for step in range(3):
        for seq_id in range(10):
            grow(seq_id, 1 + (seq_id + step) % 3)
    cache.free(3)
    cache.allocate(42)
    grow(42, 9)
    grow(7, 6)
    return cache, [7, 0, 42, 9, 5]


def test_metadata_equals_the_host_built_tables():
    cache, seq_ids = busy_cache()
    meta = cache.step_metadata(seq_ids)
    host_table = cache.block_table(seq_ids)
    width = host_table.shape[1]
    assert torch.equal(meta.block_table[:, :width], host_table)
    assert bool((meta.block_table[:, width:] == -1).all())
    assert torch.equal(meta.seq_lens, cache.seq_lens(seq_ids))
    assert meta.query_start_loc is None and meta.max_q_len == 1
    assert meta.max_seq_len == int(cache.seq_lens(seq_ids).max())
    assert meta.block_table.dtype == meta.seq_lens.dtype == torch.int32
    cache.free(42)  # the freed row is cleared for its next sequence
    cache.allocate(43)
    meta = cache.step_metadata([43])
    assert meta.seq_lens.tolist() == [0] and bool((meta.block_table == -1).all())


def test_metadata_takes_host_offsets_and_knows_their_longest_query():
    cache, seq_ids = busy_cache()
    starts = torch.tensor([0, 2, 2, 5, 6, 7], dtype=torch.int32)
    meta = cache.step_metadata(seq_ids, starts)
    assert meta.max_q_len == 3 and torch.equal(meta.query_start_loc, starts)
    with pytest.raises(ValueError, match="query_start_loc must be int32"):
        cache.step_metadata(seq_ids, starts[:-1])
    with pytest.raises(ValueError, match="part of the StepMetadata"):  # and none is taken beside the metadata
        cache.paged_attention(0, torch.randn(7, NUM_Q_HEADS, HEAD_DIM), meta, starts)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("query_start_loc", [None, [0, 2, 2, 5, 6, 7]], ids=["decode", "ragged"])
def test_reads_through_metadata_equal_reads_through_seq_ids_for_every_layer(query_start_loc, dtype):
    cache, seq_ids = busy_cache(dtype=dtype)
    starts = None if query_start_loc is None else torch.tensor(query_start_loc, dtype=torch.int32)
    num_tokens = len(seq_ids) if starts is None else int(starts[-1])
    meta = cache.step_metadata(seq_ids, starts)
    for layer in range(NUM_LAYERS):
        q = torch.randn(num_tokens, NUM_Q_HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(layer)).to(dtype)
        through_meta = cache.paged_attention(layer, q, meta)
        through_ids = cache.paged_attention(layer, q, seq_ids, starts)
        assert torch.equal(through_meta, through_ids), f"layer {layer}"
        _assert_matches_the_oracle(cache, seq_ids, layer, q, through_meta, starts)


def test_read_with_metadata_reads_no_tensor_value_unless_checked(triton_launches, value_reads):
    cache, seq_ids = busy_cache(backend="triton")
    meta = cache.step_metadata(seq_ids)
    q = torch.randn(len(seq_ids), NUM_Q_HEADS, HEAD_DIM)
    with value_reads.forbidden():
        outs = [cache.paged_attention(layer, q, meta) for layer in range(NUM_LAYERS)]
    assert len(triton_launches.grids) == NUM_LAYERS
    for layer, out in enumerate(outs):
        assert torch.equal(out, cache.paged_attention(layer, q, seq_ids, check=True)), f"layer {layer}"
    with value_reads.forbidden(), pytest.raises(AssertionError, match="read a tensor value"):
        cache.paged_attention(0, q, meta, check=True)  # the guard sees a checked read: the reads above can fail


def test_next_step_refills_the_same_metadata_tensors():
    """What a CUDA-graph engine does between replays: same buffers, the new step's contents."""
    cache, seq_ids = busy_cache(max_seqs=16, max_blocks_per_seq=16)
    first = cache.step_metadata(seq_ids)
    for seq_id in seq_ids:
        cache.write(
            0, cache.append(seq_id, 5), torch.zeros(5, NUM_KV_HEADS, HEAD_DIM), torch.zeros(5, NUM_KV_HEADS, HEAD_DIM)
        )
    refilled = cache.step_metadata(seq_ids, into=first)
    fresh = cache.step_metadata(seq_ids)
    assert refilled.block_table is first.block_table and refilled.seq_lens is first.seq_lens
    assert torch.equal(refilled.block_table, fresh.block_table) and torch.equal(refilled.seq_lens, fresh.seq_lens)
    assert refilled.max_seq_len == fresh.max_seq_len > first.max_seq_len == refilled.max_seq_len - 5
    with pytest.raises(ValueError, match="into holds"):
        cache.step_metadata(seq_ids[:2], into=first)


# --- on a GPU --------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device (CUDA graphs, sync debug mode)")
def test_whole_decode_steps_replay_from_one_cuda_graph(monkeypatch):
    monkeypatch.delenv(kernels.CHECK_ENV, raising=False)
    cache, seq_ids = busy_cache("cuda", max_seqs=16, max_blocks_per_seq=16)
    q = torch.randn(NUM_LAYERS, len(seq_ids), NUM_Q_HEADS, HEAD_DIM, device="cuda")
    out = torch.full_like(q, float("nan"))
    for layer in range(NUM_LAYERS):  # compile outside the capture
        cache.paged_attention(layer, q[layer], seq_ids, out=out[layer])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        meta = cache.step_metadata(seq_ids)
        for layer in range(NUM_LAYERS):
            cache.paged_attention(layer, q[layer], meta, out=out[layer])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for layer in range(NUM_LAYERS):
            cache.paged_attention(layer, q[layer], meta, out=out[layer])
    for step in range(2):  # this step, then the next: one more token a sequence, metadata refilled in place
        if step:
            for seq_id in seq_ids:
                slots = cache.append(seq_id, 1)
                for layer in range(NUM_LAYERS):
                    kv = torch.randn(2, 1, NUM_KV_HEADS, HEAD_DIM, device="cuda")
                    cache.write(layer, slots, kv[0], kv[1])
            cache.step_metadata(seq_ids, into=meta)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for layer in range(NUM_LAYERS):
            _assert_matches_the_oracle(cache, seq_ids, layer, q[layer], out[layer])
