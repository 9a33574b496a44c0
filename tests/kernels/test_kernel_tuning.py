"""The tuning table reaches the launch, and tlsim follows every tiling it picks."""

from __future__ import annotations

import itertools

import pytest
import torch
import triton
import triton.language as tl

import kernels
from harness.cases.packaged import packaged_suites
from harness.cases.spec import load_case_file
from kernels import tiling, tuning
from kernels.contract import prepare_call
from kernels.tiling import choose_tiling, tiling_for
from kernels.triton_paged import _device_piece, _program_order
from scripts.sass_census import Launch, plan_of
from tests.kernels.kernel_cases import KERNEL_CASES, KernelCase

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_the_untuned_rule_keeps_the_measured_shapes(monkeypatch):
    """Pins the defaults: 64-row half tiles of 16 tokens, 16-row fp32 tiles, 32 keys past head dim 128."""
    monkeypatch.setattr(tuning, "TUNED", {})
    assert choose_tiling(128, 4, 4096, 4, 8, 4096).BLOCK_M == 64
    assert choose_tiling(128, 4, 4096, 4, 8, 4096).BLOCK_Q == 16
    assert choose_tiling(128, 4, 4096, 4, 8, 4096, fp32=True).BLOCK_M == 16
    assert choose_tiling(256, 4, 1, 4, 8, 4096).TILE_N == 32
    assert choose_tiling(128, 32, 1, 4, 1, 4096).BLOCK_M == 32  # one token's 32 heads
    assert choose_tiling(128, 16, 4096, 4, 1, 4096).BLOCK_M == 16  # a group of 16 fills the dot's M: one token a tile
    assert choose_tiling(128, 4, 1, 4, 8, 4096).NUM_WARPS == 4


@pytest.mark.parametrize("q_class", ["decode", "verify", "prefill"])
def test_a_tuned_entry_changes_only_its_own_key(monkeypatch, q_class):
    monkeypatch.setattr(tuning, "TUNED", {})
    q_lens = {"decode": 1, "verify": 4, "prefill": 512}
    untuned = {name: choose_tiling(128, 4, length, 64, 8, 8192) for name, length in q_lens.items()}
    tuned = tuning.TileConfig(max_rows=128, max_tokens=32, tile_n=32, num_warps=8, num_stages=2)
    monkeypatch.setitem(tuning.TUNED, ("half", 128, q_class), tuned)
    for name, length in q_lens.items():
        chosen = choose_tiling(128, 4, length, 64, 8, 8192)
        if name == q_class:
            assert (chosen.TILE_N, chosen.NUM_WARPS, chosen.NUM_STAGES) == (32, 8, 2)
            assert min(128, max(16, 4 * min(length, 32))) == chosen.BLOCK_M
        else:
            assert chosen == untuned[name]
    assert choose_tiling(64, 4, q_lens[q_class], 8, 8, 8192).TILE_N == 64, "another head dim keeps the default"


@pytest.mark.parametrize("tile_n", [16, 32, 128])
def test_tlsim_follows_an_overridden_tiling(tile_n):
    """Under any config kernel and tlsim agree, and the override really moved the tiling. The case's 16-row fp32
    tiles hold 4 tokens whatever max_tokens says: the tile width is what a config changes here."""
    case = next(c for c in KERNEL_CASES if c.dtype == "float32" and max(c.q_lens) > 1)
    inputs = case.inputs(DEVICE)
    config = tuning.TileConfig(max_rows=16, max_tokens=4, tile_n=tile_n, num_warps=4, num_stages=2)
    with tuning.override(config):
        assert tile_n == tiling_for(prepare_call(*inputs.args(), check=False)).TILE_N
        sim = kernels.paged_attention_tlsim(*inputs.args())
        real = kernels.paged_attention_triton(*inputs.args())
    torch.testing.assert_close(real, sim, atol=1e-5, rtol=1e-4)


def test_a_decode_that_splits_takes_its_own_key(monkeypatch):
    """128-key tiles won on unsplit decodes and lost on split ones (kernels.tuning): the split keeps its own key."""
    monkeypatch.setitem(tuning.TUNED, ("half", 128, "decode"), tuning.TileConfig(16, 1, 128, 4, 3))
    monkeypatch.delitem(tuning.TUNED, ("half", 128, "decode_split"), raising=False)
    unsplit = choose_tiling(128, 4, 1, 32, 8, 4096)  # 256 programs: no split
    split = choose_tiling(128, 8, 1, 32, 1, 4096)  # 32 programs: split
    assert unsplit.NUM_SPLITS == 1 and unsplit.TILE_N == 128
    assert split.NUM_SPLITS > 1 and tuning.default_config("half", 128, "decode_split").tile_n == split.TILE_N


def test_the_tuner_offers_256_key_tiles_to_head_dim_64_only():
    """kernels.tuning's head_dim 64 decode entry (256-key tiles) is one the tuner can find again on a new GPU."""
    from scripts.tune_tiles import candidates

    assert tuning.TUNED[("half", 64, "decode")] in candidates(("half", 64, "decode"))
    assert all(c.tile_n <= 128 for c in candidates(("half", 128, "decode")))


def test_an_fp8_cache_takes_its_own_key_and_else_the_half_entry(monkeypatch):
    """An fp8 cache under half q looks up "half_fp8" first (its split decode has its own entry), then "half"."""
    fp8_split = tuning.TileConfig(16, 1, 128, 4, 3)
    half_split = tuning.TileConfig(16, 1, 32, 4, 3)
    monkeypatch.setitem(tuning.TUNED, ("half_fp8", 128, "decode_split"), fp8_split)
    monkeypatch.setitem(tuning.TUNED, ("half", 128, "decode_split"), half_split)
    monkeypatch.delitem(tuning.TUNED, ("half_fp8", 128, "decode"), raising=False)
    split_fp8 = choose_tiling(128, 4, 1, 8, 8, 8192, kv_fp8=True)  # 64 programs: 8 splits of 1024 keys
    split_half = choose_tiling(128, 4, 1, 8, 8, 8192)
    assert split_fp8.TUNING_KEY == ("half_fp8", 128, "decode_split") and split_fp8.TILE_N == 128
    assert split_half.TILE_N == 32
    unsplit_fp8 = choose_tiling(128, 4, 1, 32, 8, 16384, kv_fp8=True)
    assert unsplit_fp8.TILE_N == choose_tiling(128, 4, 1, 32, 8, 16384).TILE_N  # no fp8 entry: the half one
    assert choose_tiling(128, 4, 1, 8, 8, 32768, fp32=True, kv_fp8=True).TUNING_KEY[0] == "fp32"


def test_a_split_of_more_than_1024_keys_takes_the_long_split_key_and_keeps_its_split_count(monkeypatch):
    """Long splits re-cut in their own key's tiles: the number of splits is the short key's, each range whole tiles."""
    monkeypatch.setitem(tuning.TUNED, ("half", 128, "decode_split"), tuning.TileConfig(16, 1, 32, 4, 3))
    monkeypatch.setitem(tuning.TUNED, ("half", 128, "decode_split_long"), tuning.TileConfig(16, 1, 128, 4, 3))
    short = choose_tiling(128, 4, 1, 4, 8, 16384)  # 32 programs: 16 splits of 1024 keys
    assert (short.TUNING_KEY[2], short.NUM_SPLITS, short.SPLIT_SIZE, short.TILE_N) == ("decode_split", 16, 1024, 32)
    long = choose_tiling(128, 4, 1, 8, 8, 32768)  # 64 programs: 8 splits of 4096 keys
    assert (long.TUNING_KEY[2], long.NUM_SPLITS, long.SPLIT_SIZE, long.TILE_N) == ("decode_split_long", 8, 4096, 128)
    ragged = choose_tiling(128, 8, 1, 64, 1, 16000)  # 8 splits of 2000 keys, re-cut in 128-key tiles
    assert ragged.TUNING_KEY[2] == "decode_split_long" and ragged.SPLIT_SIZE == 2048 and ragged.NUM_SPLITS == 8
    full = choose_tiling(128, 4, 1, 32, 8, 32768)  # 256 programs: the device split's, not the split key
    assert full.TUNING_KEY[2] == "decode" and full.DEVICE_SPLIT is not None and full.SPLIT_SIZE == 0


def test_tlsim_follows_a_long_split_re_cut_in_its_own_tiles(monkeypatch):
    """Past LONG_SPLIT_KEYS (lowered) the long key's tiles run; kernel and tlsim agree."""
    monkeypatch.setattr(tiling, "LONG_SPLIT_KEYS", 64)
    monkeypatch.setitem(tuning.TUNED, ("fp32", 64, "decode_split"), tuning.TileConfig(16, 1, 16, 4, 2))
    monkeypatch.setitem(tuning.TUNED, ("fp32", 64, "decode_split_long"), tuning.TileConfig(16, 1, 64, 4, 2))
    case = KernelCase("long_split", num_q_heads=4, num_kv_heads=1, seq_lens=(700, 333), q_lens=(1, 1))
    inputs = case.inputs(DEVICE)
    chosen = tiling_for(prepare_call(*inputs.args(), check=False), max_q_len=1, max_seq_len=700)
    assert chosen.TUNING_KEY[2] == "decode_split_long" and chosen.TILE_N == 64 and chosen.NUM_SPLITS > 1
    assert chosen.SPLIT_SIZE % 64 == 0 and chosen.SPLIT_SIZE * chosen.NUM_SPLITS >= 700
    sim = kernels.paged_attention_tlsim(*inputs.args(), max_q_len=1, max_seq_len=700)
    real = kernels.paged_attention_triton(*inputs.args(), max_q_len=1, max_seq_len=700)
    torch.testing.assert_close(real, sim, atol=1e-5, rtol=1e-4)


def test_an_fp8_decode_runs_its_fp16_dots_on_every_decode_key_and_never_on_prefill():
    """The fp16-dot path (FP8_DOTS_FP16) belongs to every decode query class, the long split's included."""
    decodes = [  # unsplit, split, long split
        choose_tiling(128, 4, 1, s, h, n, kv_fp8=True) for s, h, n in ((32, 8, 16384), (4, 8, 16384), (8, 8, 32768))
    ]
    assert all(t.FP8_DOTS_FP16 for t in decodes), [t.TUNING_KEY for t in decodes]
    assert {t.TUNING_KEY[2] for t in decodes} == {"decode", "decode_split", "decode_split_long"}
    assert not choose_tiling(128, 4, 512, 4, 8, 4096, kv_fp8=True).FP8_DOTS_FP16  # prefill keeps its path
    assert not choose_tiling(128, 4, 1, 8, 8, 32768).FP8_DOTS_FP16  # no fp8 cache


def _gpu_case_lengths(name: str) -> tuple[int, ...]:
    cases = [c for suite in ("gpu", "gpu_peers", "gpu_long") for c in load_case_file(packaged_suites()[suite])]
    return next(c for c in cases if c.name == name).seq_lens


def test_the_device_split_leaves_a_full_uniform_batch_whole_and_cuts_the_8b_batch_longest():
    """kernels.tiling.device_splits: full uniform batches whole, llama3_8b_decode_fp8's longest cut, the rest kept."""
    assert tiling.DEVICE_SPLIT is True

    def splits_of(lens, kv_fp8=True, num_kv_heads=8):
        chosen = choose_tiling(128, 4, 1, len(lens), num_kv_heads, max(lens), kv_fp8=kv_fp8)
        assert chosen.DEVICE_SPLIT is not None and 1 < chosen.NUM_SPLITS <= tiling.DEVICE_SPLIT_MAX_SPLITS
        lens_t = torch.tensor(lens, dtype=torch.int32)
        splits, size = tiling.device_splits(lens_t, chosen.NUM_SPLITS, chosen.TILE_N, *chosen.DEVICE_SPLIT)
        assert bool((size % chosen.TILE_N == 0).all()) and bool((splits * size >= lens_t).all())
        assert bool(((splits - 1) * size < lens_t).all()), "an empty split"
        return splits.tolist()

    for lens in ([16384] * 32, [32768] * 64, [8192] * 64, [4097] * 64, [131072] * 28):  # 224+ programs of 8 KV heads
        for kv_fp8 in (True, False):
            assert splits_of(lens, kv_fp8) == [1] * len(lens), (len(lens), lens[0])
    # 136-192 programs, which the slack alone would cut in two (slower): twice the mean keeps them whole
    for lens in ([8192] * 24, [16384] * 20, [8192] * 17, [8000] * 16 + [8192] * 8):
        assert splits_of(lens) == [1] * len(lens), (len(lens), lens[0])
    assert splits_of([4000] * 16 + [12000] * 2) == [1] * 16 + [2] * 2  # past twice the mean (9778 keys): cut
    llama = _gpu_case_lengths("llama3_8b_decode_fp8")
    assert (len(llama), min(llama), max(llama)) == (64, 1000, 31024)
    for kv_fp8 in (True, False):
        by_length = dict(zip(llama, splits_of(llama, kv_fp8), strict=True))
        assert by_length[max(llama)] > 1 and by_length[min(llama)] == 1
        assert [n for n, s in sorted(by_length.items()) if s > 1] == sorted(llama)[-6:]  # piece 20914 keys
    ragged = _gpu_case_lengths("decode_ragged_64x1k_8k")  # 1105-8155: pieces of 11175 keys, none cut
    assert splits_of(ragged) == [1] * 64
    assert choose_tiling(128, 4, 1, 64, 8, 4096).DEVICE_SPLIT is None  # a bound at DEVICE_SPLIT_MIN_KEYS or under
    assert choose_tiling(128, 4, 1, 64, 8, 31024, windowed=True).DEVICE_SPLIT is None
    assert choose_tiling(128, 4, 512, 64, 8, 31024).DEVICE_SPLIT is None  # prefill
    assert choose_tiling(128, 4, 1, 64, 8, 31024, num_tokens=65).DEVICE_SPLIT is None  # a max_q_len hint of 1 too low
    assert choose_tiling(128, 4, 1, 2048, 8, 31024).DEVICE_SPLIT is None  # past DEVICE_SPLIT_MAX_SEQS
    few = choose_tiling(128, 4, 1, 4, 8, 31024)  # 32 programs: the host's split
    assert few.DEVICE_SPLIT is None and few.NUM_SPLITS > 1 and few.SPLIT_SIZE > 0


@pytest.mark.parametrize("q_len, causal_only", [(1, False), (4, True), (8, True), (64, False)])
def test_only_verify_launches_take_the_causal_only_mask(q_len, causal_only):
    """CAUSAL_ONLY_MASK changes no value, so its scope is pinned here: verify launches (2-8 queries) only."""
    plan = plan_of(Launch(32, 8, 128, 16, [4096] * 4, q_lens=[q_len] * 4))
    assert plan.main.constexprs["CAUSAL_ONLY_MASK"] is causal_only


@triton.jit
def _order_probe(seq_lens_ptr, starts_ptr, out_ptr, num_seqs, ONE_QUERY_PER_SEQ: tl.constexpr,
                 NUM_SPLITS: tl.constexpr, TILE_N: tl.constexpr, SEQS_PADDED: tl.constexpr,
                 PIECE_MUL: tl.constexpr, PIECE_DIV: tl.constexpr, PIECE_MIN: tl.constexpr,
                 PIECE_MEAN: tl.constexpr):  # fmt: skip
    """The kernel's _program_order alone: out[slot] = (tile, KV head, split) of the program at dispatch slot slot."""
    lens, piece = _device_piece(seq_lens_ptr, num_seqs, SEQS_PADDED, PIECE_MUL, PIECE_DIV, PIECE_MIN, PIECE_MEAN)
    tile, head, split = _program_order(lens, piece, starts_ptr, num_seqs, ONE_QUERY_PER_SEQ, True, NUM_SPLITS,
                                       TILE_N, SEQS_PADDED)  # fmt: skip
    slot = tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + tl.num_programs(1) * tl.program_id(2))
    tl.store(out_ptr + slot * 3, tile)
    tl.store(out_ptr + slot * 3 + 1, head)
    tl.store(out_ptr + slot * 3 + 2, split)


@pytest.mark.parametrize("offsets", [None, "one_each", "a_query_less_sequence", "as_many_tiles_not_one_each"])
def test_the_device_split_dispatches_its_sequences_longest_piece_first(offsets):
    """_program_order alone: slot k takes the k // (heads * splits)-th longest piece's sequence, each once."""
    lens = [600, 3000, 33, 2000, 1500, 3000]  # 1500 and two halves of 3000: 1504 keys each, ties to the lower index
    q_lens = {None: [1] * 6, "one_each": [1] * 6, "a_query_less_sequence": [1, 1, 0, 1, 1, 1],
              "as_many_tiles_not_one_each": [1, 0, 2, 1, 1, 1]}[offsets]  # fmt: skip
    heads, num_splits, tile_n, mul, div, floor = 2, 4, 32, 10, 64, 64  # C 5/4 over 2 KV heads, 16 program slots
    mean = 0  # the slack alone (twice the mean, 3378 keys, would leave the 3000s whole)
    splits, size = tiling.device_splits(torch.tensor(lens), num_splits, tile_n, mul, div, floor, mean)
    assert splits.tolist() == [1, 2, 1, 2, 1, 2]
    tiles = sum(q_lens)  # tiles of BLOCK_Q 1
    starts = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32, device=DEVICE)
    out = torch.full((tiles * heads * num_splits, 3), -1, dtype=torch.int32, device=DEVICE)
    _order_probe[(tiles, heads, num_splits)](
        torch.tensor(lens, dtype=torch.int32, device=DEVICE), starts, out, len(lens), offsets is None, num_splits,
        tile_n, 8, mul, div, floor, mean,
    )  # fmt: skip
    if offsets in ("a_query_less_sequence", "as_many_tiles_not_one_each"):
        order = list(range(tiles))
    else:
        order = sorted(range(len(lens)), key=lambda s: (-int(size[s]), s))
        assert order == [1, 4, 5, 3, 0, 2]
    expected = [(order[k // (heads * num_splits)], k % heads, k // heads % num_splits) for k in range(len(out))]
    assert [tuple(r) for r in out.tolist()] == expected
    assert sorted(expected) == sorted(itertools.product(range(tiles), range(heads), range(num_splits)))


def test_the_longest_first_order_is_taken_up_to_its_batch_bound():
    """The launcher sorts device-split batches of at most LONGEST_FIRST_MAX_SEQS sequences, not more."""

    def taken(num_seqs):
        plan = plan_of(Launch(32, 8, 128, 16, [1000, 32000] + [4000] * (num_seqs - 2)))
        assert plan.tiling.DEVICE_SPLIT is not None
        return plan.main.constexprs["LONGEST_FIRST"]

    bound = tiling.LONGEST_FIRST_MAX_SEQS
    assert taken(64) and taken(bound) and not taken(bound + 1)
