"""Shapes at the edges of every range and rule the contract declares, generated from its constants.

:func:`contract_edges` derives them from ``kernels.contract`` / ``kernels.tiling`` / ``kernels.fp8``, so a
range that moves takes its edges with it: K head dims on each piece boundary and tails that are no power
of two, V narrower and wider than K, block sizes no power of two (split and not), every fp8 format under
every q dtype, a long block_size 1 walk with bad indices, and the engine's fixed-size table and dispatch
overrides. Each case runs through reference, tlsim and the interpreted kernel against the oracle."""

from __future__ import annotations

import pytest
import torch

import kernels
from harness.cases.vocab import DEFAULT_TOLERANCES
from harness.run.grading import grade
from harness.run.oracle import paged_attention_oracle
from kernels import dispatch
from kernels.cache import CacheFullError, PagedKVCache
from kernels.contract import MAX_HEAD_DIM, MIN_HEAD_DIM, prepare_call
from kernels.dispatch import DISPATCH_BACKENDS
from kernels.fp8 import FP8_DTYPES
from kernels.tiling import SINGLE_DOT_HEAD_DIM, V_PART_DIM, choose_tiling, head_dim_pieces, v_parts
from tests.kernels.kernel_cases import Edge as Case
from tests.kernels.kernel_cases import Edges, assert_passes, backend_fn, call_hints, needs_triton, strided

BACKENDS = ("triton", "tlsim", "reference")
BASE = dict(num_q_heads=2, num_kv_heads=1, head_dim=64, block_size=16, dtype="float32", layout="shuffled", seed=5)
SHORT = ((1, 37), (1, 3))  # a decode row and a short prefill: (seq_lens, q_lens)
COUNT_CHUNK = 128  # the block-table columns _count_bad_blocks reads at a time (kernels/triton_paged.py)


def head_dim_edges() -> list[int]:
    """K head dims on every edge of [MIN_HEAD_DIM, MAX_HEAD_DIM] and of the pieces K is loaded in."""
    dims = {MIN_HEAD_DIM, MIN_HEAD_DIM + 1, MAX_HEAD_DIM - 1, MAX_HEAD_DIM}
    boundary = MIN_HEAD_DIM
    while boundary <= MAX_HEAD_DIM:
        dims |= {boundary - 1, boundary, boundary + 1}
        if boundary >= SINGLE_DOT_HEAD_DIM:  # a main piece and a tail that is no power of two
            dims.add(boundary + 44)
        boundary *= 2
    return sorted(d for d in dims if MIN_HEAD_DIM <= d <= MAX_HEAD_DIM)


def contract_edges() -> list[Case]:
    """The generated cases (see the module docstring)."""
    cases = [Case(f"k{d}", *SHORT, {"head_dim": d}) for d in head_dim_edges()]
    # V narrower and wider than K: fp32 (one V piece, 16-head tiling) and bf16 (the wide tiling).
    for k, v in ((64, 33), (64, 129), (300, 64), (MAX_HEAD_DIM, MIN_HEAD_DIM)):
        cases.append(Case(f"k{k}_v{v}", *SHORT, {"head_dim": k, "head_dim_v": v}))
    narrow_v = V_PART_DIM // 2 - 28  # 100: a wide tiling whose V fills less than one V part
    for k, v in ((SINGLE_DOT_HEAD_DIM + 32, narrow_v), (64, V_PART_DIM + 1), (MAX_HEAD_DIM, 2 * V_PART_DIM)):
        fields = {"head_dim": k, "head_dim_v": v, "dtype": "bfloat16", "num_q_heads": 4}
        cases.append(Case(f"wide_k{k}_v{v}", *SHORT, fields))
    # Block sizes that are no power of two: a tile spans a partial block. Split (the hint allows
    # two splits of 576) and unsplit (a hint of one split's worth: the one split runs to the end).
    for bs in (3, 100):
        for hint, tag in ((1152, "split"), (576, "unsplit")):
            cases.append(Case(f"block{bs}_{tag}", (1100, 577, 5), (1, 1, 1), {"block_size": bs}, {"max_seq_len": hint}))
    # Every fp8 format under every q dtype; decode launches (bf16 q: fp16 dots, V as uint16 pairs) and prefill.
    for fp8 in FP8_DTYPES:
        fmt = str(fp8).removeprefix("torch.float8_")
        for dtype in ("float32", "float16", "bfloat16"):
            fields = {"dtype": dtype, "kv_dtype": f"float8_{fmt}", "kv_scale": "amax_per_head"}
            cases.append(Case(f"fp8_{fmt}_{dtype}_decode", (40, 1, 66), (1, 1, 1), fields))
            cases.append(Case(f"fp8_{fmt}_{dtype}_prefill", (40, 9), (5, 9), {**fields, "input_scale": 2.0}))
        # K past the single dot: its tail piece widened from fp8, and bf16 q's tail scaled into fp16 with q.
        fields = {"dtype": "bfloat16", "kv_dtype": f"float8_{fmt}", "head_dim": SINGLE_DOT_HEAD_DIM + 44}
        cases.append(Case(f"fp8_{fmt}_k{SINGLE_DOT_HEAD_DIM + 44}_bfloat16_decode", (40, 1, 66), (1, 1, 1), fields))
    # Past the single dot under fp32 a group of more than 16 heads is tiled 16 a program; MLA's latent
    # cache (V a view of K's first columns) under the wide tiling reads V from the K tile.
    cases.append(Case("k300_group32", *SHORT, {"head_dim": 300, "num_q_heads": 32}))
    cases.append(Case("latent_k576_v512", *SHORT, {"head_dim": 576, "head_dim_v": 512, "dtype": "bfloat16",
                                                   "num_q_heads": 4, "latent_kv": True}))  # fmt: skip
    # A long walk at block_size 1: 300 columns, three chunks of the bad-index count.
    cases.append(Case("block1_long_walk", (300, 2), (1, 1), {"block_size": 1}))
    return cases


CASES = contract_edges()
EDGES = Edges(BASE, CASES)
BY_NAME, _inputs, _expected, _tiling = EDGES.by_name, EDGES.inputs, EDGES.expected, EDGES.tiling


def test_the_generated_cases_reach_every_rule_they_name():
    """The edges mean what their names say: tails, V parts, split and unsplit, fp16 dots, a long walk."""
    dims = head_dim_edges()
    assert {MIN_HEAD_DIM, SINGLE_DOT_HEAD_DIM + 1, SINGLE_DOT_HEAD_DIM + 44, MAX_HEAD_DIM} <= set(dims)
    assert head_dim_pieces(SINGLE_DOT_HEAD_DIM + 44) == (SINGLE_DOT_HEAD_DIM, 64), "a tail padded past the head dim"
    for name, parts in (("wide_k288_v100", 1), ("wide_k64_v257", 2), ("wide_k576_v512", 2)):
        assert v_parts(prepare_call(*_inputs(name).args())) == parts, name
    for bs in (3, 100):
        assert _tiling(f"block{bs}_split").NUM_SPLITS == 2 and _tiling(f"block{bs}_unsplit").NUM_SPLITS == 1
    assert _tiling("fp8_e5m2_bfloat16_decode").FP8_DOTS_FP16 and not _tiling("fp8_e5m2_bfloat16_prefill").FP8_DOTS_FP16
    assert max(BY_NAME["block1_long_walk"].seq_lens) > 2 * COUNT_CHUNK


@pytest.mark.parametrize(("case", "backend"), [(c, b) for c in CASES for b in BACKENDS], ids=str)
def test_contract_edge_matches_the_oracle(case: Case, backend: str):
    EDGES.assert_matches_oracle(backend, case)


# --- bad indices planted along a long walk at block_size 1 -------------------------------------------


WALK = BY_NAME["block1_long_walk"]
PLACES = {"start": 0, "middle": WALK.seq_lens[0] // 2, "end": WALK.seq_lens[0] - 1}


def _walk_with_bad(column: int) -> list[torch.Tensor]:
    args = [t.clone() for t in _inputs(WALK.name).args()]
    args[3][0, column] = args[1].shape[0]  # block id num_blocks: outside the pool
    return args


@pytest.mark.parametrize("backend", ["triton", "tlsim"])
@pytest.mark.parametrize("place", PLACES)
def test_a_bad_index_anywhere_in_a_long_walk_makes_its_rows_nan(place: str, backend: str):
    """Value checks off: that sequence's rows are NaN and the other's untouched; on: refused, naming the entry."""
    column = PLACES[place]
    got = backend_fn(backend)(*_walk_with_bad(column), check=False, **call_hints(WALK))
    assert bool(got[0].isnan().all()), f"a bad block id at column {column} of {WALK.seq_lens[0]}"
    assert not bool(got[1].isnan().any()), "the other sequence is untouched"
    with pytest.raises(ValueError, match=rf"block_table\[0, {column}\]"):
        prepare_call(*_walk_with_bad(column), check=True)


# --- the engine's path: a fixed-size table in PagedKVCache, every dispatch override ----------------------


def _filled_cache(backend: str | None, dtype=torch.float32, **fixed) -> PagedKVCache:
    """Two sequences of 9 and 7 keys in blocks of 3 (K 33 dims, V 40), the first filling a row of 3 blocks."""
    scales = {"k_scale": 0.02, "v_scale": 0.03} if dtype in FP8_DTYPES else {}
    cache = PagedKVCache(1, 8, 3, 1, 33, dtype=dtype, backend=backend, head_dim_v=40, **scales, **fixed)
    draw = torch.Generator().manual_seed(0)
    for seq, length in ((0, 9), (1, 7)):
        cache.allocate(seq)
        slots = cache.append(seq, length)
        cache.write(0, slots, torch.randn(length, 1, 33, generator=draw), torch.randn(length, 1, 40, generator=draw))
    return cache


@pytest.mark.parametrize("dtype", [torch.float32, *FP8_DTYPES], ids=str)
@pytest.mark.parametrize("backend", DISPATCH_BACKENDS)
def test_a_fixed_size_table_reads_the_oracle_at_its_capacity_and_refuses_past_it(backend: str, dtype):
    if backend == "triton":
        needs_triton()
    cache = _filled_cache(backend, dtype, max_seqs=2, max_blocks_per_seq=3)
    table, storage = cache._table, cache._table.data_ptr()
    q = torch.randn(3, 2, 33, generator=torch.Generator().manual_seed(1))
    starts = torch.tensor([0, 2, 3], dtype=torch.int32)  # seq 0: two queries, seq 1: one
    meta = cache.step_metadata([0, 1], starts)
    assert meta.block_table.shape == (2, 3)
    scales = {} if cache.k_scale is None else {"k_scale": cache.k_scale, "v_scale": cache.v_scale}
    expected = paged_attention_oracle(q, cache.k_caches[0], cache.v_caches[0], meta.block_table, meta.seq_lens,
                                      starts, **scales)  # fmt: skip
    assert_passes(cache.paged_attention(0, q, meta), expected, DEFAULT_TOLERANCES["float32"], backend)
    with pytest.raises(CacheFullError, match="fixed at max_seqs=2, max_blocks_per_seq=3"):
        cache.append(0, 1)  # a fourth block for a row of three
    with pytest.raises(CacheFullError, match="fixed"):
        cache.allocate(2)  # a third row
    assert cache._table is table and cache.seq_lens([0, 1]).tolist() == [9, 7], "nothing changed"
    cache.free(1)
    cache.allocate(2)  # the freed row is taken again, in place
    assert cache._table is table and table.data_ptr() == storage


@pytest.mark.parametrize(
    "fixed", [{}, {"max_seqs": 2}, {"max_blocks_per_seq": 3}], ids=["free", "rows_fixed", "width_fixed"]
)
def test_a_table_grows_where_its_size_is_not_fixed(fixed: dict):
    """Each dimension of the table that was not fixed grows; a fixed one refuses (above)."""
    cache = _filled_cache("tlsim", **fixed)  # 4 columns at first (3 when fixed): seq 0's 9 keys take 3
    if "max_blocks_per_seq" not in fixed:
        cache.append(0, 6)  # 5 blocks
        assert cache.block_table([0]).shape[1] == 5 and cache._table.shape[1] >= 5
    if "max_seqs" not in fixed:
        for seq in range(2, 16):  # past the first 8 rows: the table doubles once, and every new row is handed out
            cache.allocate(seq)
        assert cache._table.shape[0] == 16 and sorted(cache._rows.values()) == list(range(16))


@pytest.mark.parametrize("how", ["argument", "environment"])
@pytest.mark.parametrize("backend", DISPATCH_BACKENDS)
def test_every_dispatch_override_serves_the_backend_it_names(backend: str, how: str, monkeypatch):
    if backend == "triton":
        needs_triton()
    inputs = _inputs("k300")
    called = []
    real = dispatch._backend_fn
    monkeypatch.setattr(dispatch, "_backend_fn", lambda name: called.append(name) or real(name))
    if how == "environment":
        monkeypatch.setenv(dispatch.BACKEND_ENV, backend)
    got = kernels.paged_attention_dispatch(*inputs.args(), **({"backend": backend} if how == "argument" else {}))
    assert called == [backend]
    assert grade(got, _expected("k300"), *DEFAULT_TOLERANCES["float32"]).passed
    assert torch.equal(got, real(backend)(*inputs.args())), "the named backend's own answer, bit for bit"


@pytest.mark.parametrize("backend", BACKENDS)
def test_head_dim_strides_other_than_one_and_a_call_without_tokens(backend: str):
    """Every other element of the last dim for q, caches and out; a call with no sequence returns its empty out."""
    inputs = _inputs("k64_v33")
    q, k, v, table, lens, starts = inputs.args()
    out = strided(inputs.new_out())
    got = backend_fn(backend)(
        strided(q), strided(k), strided(v), table, lens, starts, out=out, **call_hints(BY_NAME["k64_v33"])
    )
    assert got is out and grade(out, _expected("k64_v33"), *DEFAULT_TOLERANCES["float32"]).passed
    empty = backend_fn(backend)(q[:0], k, v, table[:0], lens[:0], starts[:1], check=True)
    assert empty.shape == (0, *q.shape[1:2], v.shape[-1])


@pytest.mark.parametrize("backend", ["triton", "tlsim"])
def test_a_decode_given_without_query_start_loc_matches_the_oracle(backend: str):
    name = "fp8_e5m2_bfloat16_decode"
    inputs = _inputs(name)
    got = backend_fn(backend)(*inputs.args()[:5], **inputs.options)  # one query a sequence, no hints
    assert grade(got, _expected(name), *DEFAULT_TOLERANCES["bfloat16"]).passed


def test_a_group_past_the_kernels_limit_is_refused():
    with pytest.raises(ValueError, match="limit of 128"):
        choose_tiling(64, 129, 1)
