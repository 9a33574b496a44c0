"""A case's inputs are the same tensors on every build, thread count and device (small chunks patched in)."""

from __future__ import annotations

import pytest
import torch

from harness.cases import inputs as inputs_module
from harness.cases.inputs import PagedInputs, make_inputs, shared_prefix_blocks, token_slots
from harness.cases.vocab import LAYOUTS

CASE = dict(num_q_heads=8, num_kv_heads=2, head_dim=32, block_size=16, seq_lens=[300, 77, 1000, 33],
            q_lens=[4, 1, 7, 1], dtype="bfloat16", input_scale=2.0, seed=5)  # fmt: skip


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(inputs_module, "CHUNK_VALUES", 2**10)  # 16 rows of 64 values: about 90 chunks of K


def tensors(inputs: PagedInputs) -> dict[str, torch.Tensor]:
    named = dict(
        zip(("q", "k_cache", "v_cache", "block_table", "seq_lens", "query_start_loc"), inputs.args(), strict=True)
    )
    named.update({f"keys[{i}]": k for i, k in enumerate(inputs.keys)})
    named.update({f"values[{i}]": v for i, v in enumerate(inputs.values)})
    return named


def differing(a: PagedInputs, b: PagedInputs) -> list[str]:
    """Names of the tensors whose bytes differ (NaN payloads included), after moving both to the CPU."""
    bits = lambda t: t.detach().cpu().contiguous().view(torch.uint8)  # noqa: E731
    first, second = tensors(a), tensors(b)
    assert first.keys() == second.keys()
    return [name for name in first if first[name].shape != second[name].shape
            or not torch.equal(bits(first[name]), bits(second[name]))]  # fmt: skip


@pytest.mark.parametrize(("torch_threads", "draw_threads"), [(1, 4), (2, 1), (2, 4)])
def test_values_do_not_depend_on_torch_threads_or_the_draw_pool(torch_threads, draw_threads):
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = make_inputs(**CASE, layout="shared_prefix", draw_threads=1)
        torch.set_num_threads(torch_threads)
        pooled = make_inputs(**CASE, layout="shared_prefix", draw_threads=draw_threads)
    finally:
        torch.set_num_threads(saved)
    assert differing(alone, pooled) == []


def test_a_different_seed_draws_different_values():
    other = make_inputs(**{**CASE, "seed": 6})
    changed = differing(make_inputs(**CASE), other)
    assert {"q", "k_cache", "v_cache"} <= set(changed)
    assert all(f"keys[{i}]" in changed and f"values[{i}]" in changed for i in range(len(CASE["seq_lens"])))


def test_q_k_and_v_are_different_draws():
    inputs = make_inputs(**{**CASE, "input_scale": 1.0, "head_dim": 8, "num_q_heads": 2})
    k, v = inputs.keys[0].float(), inputs.values[0].float()
    assert not torch.equal(k, v) and not torch.equal(inputs.q[:1].float(), k[:1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cpu_and_cuda_inputs_hold_the_same_values():
    on_cuda = make_inputs(**CASE, layout="shared_prefix", device="cuda")
    assert on_cuda.k_cache.device.type == "cuda" and on_cuda.keys[0].device.type == "cuda"
    assert differing(make_inputs(**CASE, layout="shared_prefix"), on_cuda) == []


def test_shared_prefix_blocks_hold_the_first_sequences_values_in_every_sequence():
    inputs = make_inputs(**CASE, layout="shared_prefix")
    shared = shared_prefix_blocks(CASE["seq_lens"], CASE["block_size"], "shared_prefix")
    assert shared == 2
    table = inputs.block_table
    assert (table[:, :shared] == table[0, :shared]).all(), "every row starts with the same physical blocks"
    assert len(set(table[:, shared:].flatten().tolist()) - {-1}) == int((table[:, shared:] >= 0).sum())
    prefix = shared * CASE["block_size"]
    for i, (k, v) in enumerate(zip(inputs.keys, inputs.values, strict=True)):
        assert torch.equal(k[:prefix], inputs.keys[0][:prefix]) and torch.equal(v[:prefix], inputs.values[0][:prefix])
        assert not torch.isnan(k).any() and not torch.isnan(v).any(), f"sequence {i} reads a NaN slot"
    alone = make_inputs(**{**CASE, "seq_lens": CASE["seq_lens"][:1], "q_lens": [4]}, layout="contiguous")
    assert torch.equal(inputs.keys[0], alone.keys[0]), "the first sequence's own draw fills the prefix"


def test_every_layout_attends_over_the_same_sequences_unless_it_shares_a_prefix():
    shuffled, contiguous = make_inputs(**CASE, layout="shuffled"), make_inputs(**CASE, layout="contiguous")
    assert not torch.equal(shuffled.block_table, contiguous.block_table)
    assert all(torch.equal(a, b) for a, b in zip(shuffled.keys, contiguous.keys, strict=True))
    shared = make_inputs(**CASE, layout="shared_prefix")
    assert not torch.equal(shared.keys[1], shuffled.keys[1]), "a later sequence's prefix is the first one's"


@pytest.mark.parametrize("layout", LAYOUTS)  # every layout a case may name
def test_the_same_case_built_twice_is_bitwise_equal_and_exactly_its_unowned_slots_are_nan(layout):
    inputs = make_inputs(**CASE, layout=layout)
    assert differing(inputs, make_inputs(**CASE, layout=layout)) == []
    num_blocks, block_size, num_kv_heads, head_dim = inputs.k_cache.shape
    assert inputs.q.shape == (sum(CASE["q_lens"]), 8, 32) and inputs.q.dtype == torch.bfloat16
    assert (num_kv_heads, head_dim, block_size) == (2, 32, 16) and inputs.v_cache.shape == inputs.k_cache.shape
    owned = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    owned[token_slots(inputs.block_table, CASE["seq_lens"], block_size)] = True
    assert (~owned).sum() >= block_size, "a spare block and the tails stay unowned"
    for pool in (inputs.k_cache, inputs.v_cache):
        nan = torch.isnan(pool.reshape(num_blocks * block_size, -1).float())
        assert nan[~owned].all() and not nan[owned].any()
    assert (inputs.block_table[1, -(-77 // 16) :] == -1).all()


def test_keys_are_a_fresh_gather_a_change_to_them_changes_nothing_else():
    inputs = make_inputs(**CASE)
    before = inputs.k_cache.clone()
    inputs.keys[0].zero_()
    assert torch.equal(inputs.k_cache.view(torch.int16), before.view(torch.int16))
    assert not (inputs.keys[0] == 0).all()
    assert [k.shape for k in inputs.keys] == [(n, 2, 32) for n in CASE["seq_lens"]]


def test_an_fp8_cases_keys_are_its_values_before_quantizing():
    inputs = make_inputs(**{**CASE, "dtype": "float16"}, kv_dtype="float8_e4m3fn")
    plain = make_inputs(**{**CASE, "dtype": "float16"})
    assert inputs.k_cache.dtype == torch.float8_e4m3fn and inputs.keys[0].dtype == torch.float16
    assert all(torch.equal(a, b) for a, b in zip(inputs.keys, plain.keys, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(inputs.values, plain.values, strict=True))
