"""PagedKVCache: allocator bookkeeping, slot-mapping writes, and a read that dispatches."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels import cache as cache_module


def make_cache(num_blocks=6, block_size=4, dtype=torch.float32):
    return kernels.PagedKVCache(
        num_layers=2, num_blocks=num_blocks, block_size=block_size, num_kv_heads=2, head_dim=32, dtype=dtype
    )


def test_append_maps_tokens_to_slots_of_allocated_blocks():
    cache = make_cache()
    cache.allocate(7)
    slots = cache.append(7, 6)  # blocks 0 and 1: slots 0..5
    assert slots.tolist() == [0, 1, 2, 3, 4, 5]
    cache.allocate(8)
    assert cache.append(8, 1).tolist() == [8]  # block 2, offset 0
    assert cache.append(7, 3).tolist() == [6, 7, 12]  # fills block 1, then block 3
    assert cache.block_table([7, 8]).tolist() == [[0, 1, 3], [2, -1, -1]]
    assert cache.seq_lens([7, 8]).tolist() == [9, 1]


def test_free_returns_blocks_and_poisons_them():
    cache = make_cache()
    cache.allocate(1)
    slots = cache.append(1, 4)
    cache.write(0, slots, torch.ones(4, 2, 32), torch.ones(4, 2, 32))
    assert not cache.k_caches[0][0].isnan().any()
    cache.free(1)
    assert cache.num_free_blocks == 6
    assert cache.k_caches[0][0].isnan().all(), "a freed block must read as NaN"
    with pytest.raises(ValueError, match="which no live sequence owns"):  # the freed sequence's slots
        cache.write(0, slots, torch.zeros(4, 2, 32), torch.zeros(4, 2, 32))
    cache.allocate(2)
    assert cache.append(2, 1).tolist() == [0], "the freed block is reused"


def test_read_calls_dispatcher_once_with_this_layers_pools(monkeypatch):
    cache = make_cache()
    cache.allocate(0)
    cache.write(1, cache.append(0, 5), torch.randn(5, 2, 32), torch.randn(5, 2, 32))
    calls = []

    def fake_dispatch(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, out, backend, **hints):
        calls.append((k_cache, v_cache, block_table[:, :2].tolist(), seq_lens.tolist(), backend))
        assert (block_table[:, 2:] == -1).all(), "the device table's spare columns hold -1"
        return q

    monkeypatch.setattr(cache_module, "paged_attention_dispatch", fake_dispatch)
    cache.paged_attention(1, torch.randn(1, 4, 32), [0])
    assert len(calls) == 1
    k_pool, v_pool, table, lens, backend = calls[0]
    assert k_pool is cache.k_caches[1] and v_pool is cache.v_caches[1]
    assert table == [[0, 1]] and lens == [5] and backend is None
    with pytest.raises(ValueError, match="layer must be an int"):
        cache.paged_attention(-1, torch.randn(1, 4, 32), [0])


# --- refusals: each before anything changes -------------------------------------------------


BAD_COUNT = (ValueError, "num_tokens must be a non-negative int")


@pytest.mark.parametrize(
    ("count", "refusal"),
    [(-3, BAD_COUNT), (2.0, BAD_COUNT), (True, BAD_COUNT), (torch.tensor(2), BAD_COUNT),
     (4, (kernels.CacheFullError, "needs 1 more blocks for 4 tokens but only 0 of 2 are free"))],
    ids=["negative", "float", "bool", "tensor", "out_of_blocks"],
)  # fmt: skip
def test_append_refuses_a_bad_count_or_a_full_pool_before_changing_anything(count, refusal):
    cache = make_cache(num_blocks=2)
    cache.allocate(1)
    cache.append(1, 5)  # blocks 0 and 1, three slots of block 1 free
    with pytest.raises(refusal[0], match=refusal[1]):
        cache.append(1, count)
    assert cache.seq_lens([1]).tolist() == [5] and cache.block_table([1]).tolist() == [[0, 1]]
    assert cache.num_free_blocks == 0
    assert cache.append(1, 0).tolist() == [], "zero tokens is a valid no-op"


def _written_cache():
    cache = make_cache()
    cache.allocate(1)
    slots = cache.append(1, 3)  # block 0, slots 0..2
    cache.write(0, slots, torch.ones(3, 2, 32), torch.ones(3, 2, 32))
    return cache


BAD_WRITES = {
    "slot_minus_one": (dict(slots=torch.tensor([0, -1])), "slot_mapping holds slot -1, outside"),
    "slot_past_pool": (dict(slots=torch.tensor([24])), "slot_mapping holds slot 24, outside"),
    "slot_of_unowned_block": (dict(slots=torch.tensor([5])), "slot 5 of block 1, which no live sequence owns"),
    "float_slots": (dict(slots=torch.tensor([1.0])), "slot_mapping must be a 1-d integer tensor"),
    "layer_minus_one": (dict(layer=-1), "layer must be an int in \\[0, 2\\)"),
    "layer_past_last": (dict(layer=2), "layer must be an int in \\[0, 2\\)"),
    "key_wrong_shape": (dict(key=torch.zeros(1, 2, 16)), "key must be \\[num_tokens, num_kv_heads, head_dim\\]"),
}


@pytest.mark.parametrize("name", BAD_WRITES)
def test_write_refuses_a_bad_argument_and_writes_nothing(name):
    cache = _written_cache()
    changes, message = BAD_WRITES[name]
    slots = changes.get("slots", torch.tensor([1]))
    call = dict(layer=0, key=torch.zeros(len(slots), 2, 32), value=torch.zeros(len(slots), 2, 32))
    call.update({k: v for k, v in changes.items() if k != "slots"})
    pools_before = [p.clone() for p in (*cache.k_caches, *cache.v_caches)]
    with pytest.raises(ValueError, match=message):
        cache.write(call["layer"], slots, call["key"], call["value"])
    for before, after in zip(pools_before, (*cache.k_caches, *cache.v_caches), strict=True):
        assert torch.equal(before.nan_to_num(7.0), after.nan_to_num(7.0)), "nothing may be written"
