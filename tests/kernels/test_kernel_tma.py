"""The unmasked tiles' K and V by tensor descriptor (the kernel's KV_TMA, decode launches): where it is taken,
and that it gives the pointer loads' output bit for bit, graded against the oracle, around the tile and block
edges.

The inputs hold NaN in every slot no sequence owns (harness.cases.inputs), so a descriptor load in a tile
with keys past seq_len, or a box one row off, turns rows NaN or moves them outside the tolerance.
At fp32, head_dim 32 the kernel walks 64-key tiles (tests/kernels/test_kernel_edges.py pins it).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import kernels.triton_paged as triton_paged
from harness.cases.inputs import make_inputs
from harness.run.oracle import paged_attention_oracle
from kernels.contract import prepare_call
from kernels.launch_plan import clear_plans
from kernels.tiling import tiling_for
from tests.kernels.kernel_cases import DEVICES, assert_passes, backend_fn, needs_triton

FP32 = (1e-5, 1e-4)
BASE = dict(num_q_heads=4, num_kv_heads=2, head_dim=32, block_size=64, dtype="float32", layout="shuffled", seed=5)
# decode lengths around the tile (= block) edges; name -> (make_inputs keywords, call keywords)
CASES = {
    "decode_tile_edges": (dict(seq_lens=[63, 64, 65, 128, 129, 200], q_lens=[1] * 6), {}),
    "block128_two_tiles_a_block": (dict(block_size=128, seq_lens=[127, 255, 300], q_lens=[1, 1, 1]), {}),
    "head_dim_v_apart": (dict(head_dim_v=16, seq_lens=[65, 190], q_lens=[1, 1]), {}),
    "mqa_window": (dict(num_kv_heads=1, seq_lens=[250, 129], q_lens=[1, 1]), {"sliding_window": 70}),
    "kv_split": (dict(num_q_heads=4, num_kv_heads=1, seq_lens=[1152, 577, 1], q_lens=[1, 1, 1]), {"max_seq_len": 1152}),
    "k_past_256_dims": (
        dict(num_q_heads=2, num_kv_heads=1, head_dim=320, head_dim_v=256, seq_lens=[129, 64], q_lens=[1, 1]),
        {},
    ),
}


def _kernel(device: str):
    if device == "cpu":
        return backend_fn("triton")
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("tensor descriptors need sm_90 or newer")
    return triton_paged.paged_attention_triton


def _run(keywords: dict, call: dict, tma: bool, device: str, monkeypatch) -> tuple:
    monkeypatch.setattr(triton_paged, "KV_TMA", tma)
    clear_plans()  # the plan key does not hold KV_TMA
    inputs = make_inputs(**{**BASE, **keywords}, device=device)
    out = inputs.new_out()
    kernel = _kernel(device)
    taken = []
    spy = triton_paged._kv_tma
    monkeypatch.setattr(triton_paged, "_kv_tma", lambda *a: taken.append(spy(*a)) or taken[-1])
    kernel(*inputs.args(), out=out, **call)
    assert taken == [tma], f"KV_TMA {tma}: the launcher chose {taken}"
    return inputs, out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", CASES)
def test_descriptor_loads_match_pointer_loads_bit_for_bit_and_the_oracle(name, device, monkeypatch):
    keywords, call = CASES[name]
    inputs, by_descriptor = _run(keywords, call, True, device, monkeypatch)
    _, by_pointer = _run(keywords, call, False, device, monkeypatch)
    clear_plans()
    assert torch.equal(by_descriptor, by_pointer), "a load is a load: the outputs must be the same bits"
    variants = {key: value for key, value in call.items() if key != "max_seq_len"}
    assert_passes(by_descriptor, paged_attention_oracle(*inputs.args(), **variants), FP32, name)


@pytest.mark.parametrize("device", DEVICES)
def test_a_bad_block_in_an_unmasked_tile_turns_its_rows_nan_and_no_others(device, monkeypatch):
    """A block id of num_blocks in a sequence's first (whole, unmasked) tile: the box lies past the pool."""
    inputs = make_inputs(**{**BASE, "seq_lens": [130, 129], "q_lens": [1, 1]}, device=device)
    table = inputs.block_table.clone()
    table[0, 0] = inputs.k_cache.shape[0]
    inputs = replace(inputs, block_table=table)
    monkeypatch.setattr(triton_paged, "KV_TMA", True)
    clear_plans()
    got = _kernel(device)(*inputs.args(), out=inputs.new_out(), check=False)
    clear_plans()
    assert bool(got[0].isnan().all()), "the sequence with the bad block: every row NaN"
    assert not bool(got[1].isnan().any())


@pytest.mark.parametrize(
    ("change", "taken"),
    [
        pytest.param({}, True, id="block_a_multiple_of_the_tile"),
        pytest.param({"block_size": 16}, False, id="tiles_across_blocks"),
        pytest.param({"seq_lens": [130], "q_lens": [67]}, False, id="prefill"),
        pytest.param({"head_dim": 48}, False, id="padded_head_dim"),
        pytest.param({"head_dim_v": 24}, False, id="padded_v_head_dim"),
        pytest.param({"layout": "head_major"}, False, id="pool_rows_not_one_tensor"),
    ],
)
def test_the_descriptor_path_is_taken_only_where_a_tile_is_one_box_of_whole_rows(change, taken):
    needs_triton()
    fields = {key: value for key, value in change.items() if key != "layout"}
    inputs = make_inputs(**{**BASE, "seq_lens": [65], "q_lens": [1], **fields})
    if change.get("layout") == "head_major":  # [num_blocks, num_kv_heads, block_size, head_dim] seen through a permute
        k, v = (t.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3) for t in (inputs.k_cache, inputs.v_cache))
        inputs = replace(inputs, k_cache=k, v_cache=v)
    call = prepare_call(*inputs.args())
    tiling = tiling_for(call)
    strides = (call.k_cache.stride(), call.v_cache.stride())
    assert triton_paged._kv_tma(call, tiling, strides, (False, False), 1) is taken
