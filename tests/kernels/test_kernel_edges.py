"""Every edge on every boundary, through reference, tlsim and the Triton kernel, graded against the oracle.

The quick tests scripts/mutants.py runs against each planted slip (docs/mutants.md): each case puts
something on a boundary and one key off it, at TILE_N 64 and BLOCK_Q 8 (pinned below): window starts
on tile and block edges, prefill programs' first keys, KV splits of 576 keys with sinks, lse and ALiBi,
lengths on block edges, each variant once, bad indices, and the interpreter's bf16 rounding on ties."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import kernels
from harness.cases.inputs import make_inputs
from harness.cases.loading import load_cases
from harness.run.grading import grade
from harness.run.oracle import paged_attention_oracle
from kernels.contract import prepare_call
from kernels.tiling import tiling_for
from tests.kernels.kernel_cases import Edge, Edges, backend_fn, needs_triton

BACKENDS = ("triton", "tlsim", "reference")
BASE = dict(num_q_heads=4, num_kv_heads=2, head_dim=32, block_size=16, dtype="float32", layout="shuffled", seed=3)
TILE_N, BLOCK_Q, SPLIT = 64, 8, 576  # what the tiling gives these shapes (pinned below)


def _decode(*lens: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return lens, (1,) * len(lens)


# Decode: first visible key = seq_len - W. With W 36 these lengths put it at 47/48/49 (a block
# boundary inside a tile), 63/64/65 and 127/128/129 (tile boundaries); 64/65/66 put the last
# visible key (the query) at 63/64/65.
WINDOW_DECODE_LENS = (64, 65, 66, 83, 84, 85, 99, 100, 101, 163, 164, 165)
# The split boundary at 576 (a tile boundary): one short, on it, one past.
SPLIT_LENS = (1152, SPLIT - 1, SPLIT, SPLIT + 1, 1)

# The wide tiling (kernels.tiling.WIDE_HEADS): 72 heads over one KV head in 2 head tiles of 64 (the
# second 8 valid), V's 300 dims in 2 parts of 256 (the second 44 valid), split KV, sinks, lse.
WIDE = dict(dtype="bfloat16", num_q_heads=72, num_kv_heads=1, head_dim=288, head_dim_v=300, return_lse=True,
            sinks=tuple(float(x) for x in torch.linspace(-2, 6, 72)))  # fmt: skip

CASES: list[Edge] = [
    Edge("window36_decode_first_key_on_tile_edges", *_decode(*WINDOW_DECODE_LENS), {"sliding_window": 36}),
    Edge("window64_decode_first_key_on_tile_edges", *_decode(127, 128, 129, 191, 192, 193), {"sliding_window": 64}),
    Edge("window1_decode", *_decode(1, 63, 64, 65), {"sliding_window": 1}),
    # Programs' first queries at 60, 68, 76, ... (seq 0) and 62, 70, 78 (seqs 1, 2): with W 6 the
    # second program of seq 0 first sees key 63 (one before a tile), with W 5 key 64 (on it).
    Edge("window6_prefill_program_edges", (100, 80, 71), (40, 18, 9), {"sliding_window": 6}),
    Edge("window5_prefill_program_edges", (100, 80, 71), (40, 18, 9), {"sliding_window": 5}),
    # First queries at 62 (two before a tile boundary), 48, 0, 8; q_lens 16/17/9 (a query tile, one past).
    Edge("prefill_causal_tile_edges", (80, 64, 65, 16, 17, 71), (18, 16, 17, 16, 9, 9)),
    Edge("partial_query_tiles_many_seqs", (9, 5, 20, 8, 30, 3), (9, 0, 7, 8, 1, 3)),
    Edge(
        "split_decode_sinks_lse",
        *_decode(*SPLIT_LENS),
        {"num_kv_heads": 1, "sinks": (4.0, -3.0, 0.5, 100.0), "return_lse": True},
        {"max_seq_len": 1152},
    ),
    Edge("split_decode_alibi", *_decode(*SPLIT_LENS), {"num_kv_heads": 1, "alibi": True}, {"max_seq_len": 1152}),
    # A hint below the longest sequence: splits of 512, the last must still run to 1152.
    Edge("split_decode_short_hint", *_decode(*SPLIT_LENS), {"num_kv_heads": 1}, {"max_seq_len": 1024}),
    # Queries at 560..583 over splits [0, 576) and [576, ...): rows 560..575 see no key of the second.
    Edge("split_prefill_rows_before_the_split", (584, 1152), (24, 1), {"num_kv_heads": 1, "return_lse": True}),
    Edge("split_window_decode", *_decode(1152, 1100, 700), {"num_kv_heads": 1, "sliding_window": 1040}),
    Edge("block8_lengths_on_block_edges", (7, 8, 9, 63, 64, 65), (1, 1, 2, 1, 1, 3), {"block_size": 8}),
    Edge("block128_larger_than_a_tile", (127, 128, 129), (1, 2, 65), {"block_size": 128}),
    Edge("block16_lengths_on_block_edges", (15, 16, 17, 31, 32, 33), (1, 0, 2, 1, 16, 3), {"layout": "shared_prefix"}),
    Edge("softcap2_prefill", (70, 33, 1), (20, 33, 1), {"logit_softcap": 2.0, "input_scale": 2.0}),
    Edge("alibi_prefill", (70, 33, 1), (20, 33, 1), {"alibi": True}),
    Edge("sinks_lse_prefill", (40, 9, 66), (12, 1, 3), {"sinks": (2.0, -1.0, 8.0, 0.0), "return_lse": True}),
    Edge("float16_prefill", (70, 17, 64), (10, 1, 2), {"dtype": "float16", "input_scale": 2.0}),
    Edge(
        "fp8_per_head_scales",
        (40, 100, 64),
        (1, 3, 1),
        {"dtype": "bfloat16", "kv_dtype": "float8_e4m3fn", "kv_scale": "amax_per_head", "input_scale": 3.0},
    ),
    Edge("k288_tail_dims", (40, 5, 65), (3, 1, 1), {"head_dim": 288, "head_dim_v": 64}),
    Edge("wide_head_tiles_v_parts_split", (520, 70), (1, 1), WIDE),
]
EDGES = Edges(BASE, CASES)
BY_NAME, _inputs, _expected, _tiling = EDGES.by_name, EDGES.inputs, EDGES.expected, EDGES.tiling


def test_the_cases_sit_on_the_tilings_boundaries():
    """The tile, query-tile and split sizes the case names rely on."""
    decode, prefill = _tiling("window36_decode_first_key_on_tile_edges"), _tiling("prefill_causal_tile_edges")
    assert (decode.TILE_N, prefill.TILE_N, prefill.BLOCK_Q) == (TILE_N, TILE_N, BLOCK_Q)
    for name in ("split_decode_sinks_lse", "split_decode_alibi", "split_prefill_rows_before_the_split"):
        assert (_tiling(name).NUM_SPLITS, _tiling(name).SPLIT_SIZE) == (2, SPLIT), name
    assert (_tiling("split_decode_short_hint").NUM_SPLITS, _tiling("split_decode_short_hint").SPLIT_SIZE) == (2, 512)
    window_split = _tiling("split_window_decode")
    assert window_split.NUM_SPLITS == 2 and window_split.SPLIT_SIZE < 1040, "the window's keys span both splits"
    for name in ("window6_prefill_program_edges", "softcap2_prefill", "float16_prefill"):
        assert _tiling(name).NUM_SPLITS == 1, name


def test_value_checks_accept_the_tables_exact_capacity_and_refuse_a_bad_last_partial_block():
    args = _bad_args()
    capacity = args[3].shape[1] * args[1].shape[1]  # 176: 11 blocks of 16
    args[4][9] = capacity  # seq 9 fills its row: its table holds 11 real blocks
    args[3][9] = torch.arange(11, dtype=torch.int32)
    prepare_call(*args, check=True)
    bad = _bad_args(table={1: (4, -1)})  # 65 keys: column 4 holds the last one
    with pytest.raises(ValueError, match="block_table"):
        prepare_call(*bad, check=True)


@pytest.mark.parametrize(("case", "backend"), [(c, b) for c in CASES for b in BACKENDS], ids=lambda v: str(v))
def test_edge_matches_the_oracle(case: Edge, backend: str):
    EDGES.assert_matches_oracle(backend, case)


def test_a_second_call_with_another_window_is_not_served_the_first_calls_plan():
    """Same shapes, a different window: a launch plan keyed without the window would reuse the first (three of
    window36's decodes, whose first visible key each window moves)."""
    inputs = make_inputs(**{**BASE, "seq_lens": [64, 65, 66], "q_lens": [1, 1, 1]})
    for window in (36, 37):
        got = kernels.paged_attention_triton(*inputs.args(), sliding_window=window, max_q_len=1, max_seq_len=66)
        expected = paged_attention_oracle(*inputs.args(), sliding_window=window)
        assert grade(got, expected, 1e-5, 1e-4).passed, f"window {window}"


# --- bad indices (value checks off): NaN rows, never a stray read; the checks at the table's capacity ----


def _bad_args(table: dict | None = None):
    """window36's decode (a fresh copy), ``table``'s {seq: (column, block id)} written into its block table."""
    args = [t.clone() for t in _inputs("window36_decode_first_key_on_tile_edges").args()]
    for seq, (column, value) in (table or {}).items():
        args[3][seq, column] = value
    return args


@pytest.mark.parametrize("backend", ["triton", "tlsim"])
def test_a_block_id_equal_to_num_blocks_in_the_last_partial_block_is_nan(backend):
    args = _bad_args()
    num_blocks, seq = args[1].shape[0], 1  # seq 1: 65 keys, its last block (column 4) holds one
    args[3][seq, 4] = num_blocks
    got = backend_fn(backend)(*args, check=False, max_seq_len=165)
    assert bool(got[seq].isnan().all()), "the query sees that key: its rows are NaN"
    others = [s for s in range(len(got)) if s != seq]
    expected = paged_attention_oracle(*_bad_args())[others]
    assert grade(got[others], expected, 1e-5, 1e-4).passed, "the other sequences are untouched"


@pytest.mark.parametrize("backend", ["triton", "tlsim"])
@pytest.mark.parametrize("table", ["window36", "full_next_row_valid"])
def test_a_seq_len_one_key_past_the_table_is_nan(table, backend):
    """Sequence 0 one key past its table: its rows are NaN. full_next_row_valid: two full rows of a contiguous
    table, so the column past sequence 0's row is sequence 1's first block id: only the kernel's bound keeps it out."""
    args = _bad_args()
    if table == "full_next_row_valid":
        inputs = make_inputs(**{**BASE, "seq_lens": [64, 64], "q_lens": [1, 1], "layout": "contiguous"})
        args = [t.clone() for t in inputs.args()]
    capacity = args[3].shape[1] * args[1].shape[1]
    args[4][0] = capacity + 1
    got = backend_fn(backend)(*args, check=False, max_seq_len=capacity + 1)
    assert bool(got[0].isnan().all()), "a key past the table is a bad index: the query's rows are NaN"
    assert not bool(got[1:].isnan().any())


def test_the_smoke_suites_split_case_splits_the_kv_on_a_cpu():
    """cases/smoke.toml's split case is tagged small and, with the harness's hints, splits."""
    smoke = Path(__file__).resolve().parents[2] / "harness" / "cases" / "suites" / "smoke.toml"  # cases/ links there
    (case,) = [c for c in load_cases([smoke], device="cpu") if c.name == "split_kv_combine"]
    assert "small" in case.tags
    inputs = make_inputs(**{**BASE, "num_q_heads": 8, "num_kv_heads": 1, "head_dim": 64}, seq_lens=list(case.seq_lens),
                         q_lens=list(case.q_lens))  # fmt: skip
    tiling = tiling_for(prepare_call(*inputs.args()), max_q_len=max(case.q_lens), max_seq_len=case.max_seq_len)
    assert tiling.NUM_SPLITS == 2 and tiling.SPLIT_SIZE == SPLIT, tiling


if kernels.has_triton():  # without Triton the test below skips; the other backends' tests still run
    import triton
    import triton.language as tl

    from kernels.triton_paged import _bf16_rne

    @triton.jit
    def _round_to_bf16_kernel(x_ptr, y_ptr, N: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(y_ptr + offs, _bf16_rne(tl.load(x_ptr + offs)))


def test_the_interpreted_kernels_bf16_rounding_sends_ties_to_even():
    """The interpreter's hand-rounded fp32 -> bf16 (_bf16_rne) matches torch's bits; no tolerance sees a tie."""
    needs_triton()
    # 1.0 and the next bf16 above it (and their negatives), each with a tie (low 16 bits 0x8000),
    # half an ulp less one, half an ulp plus one, and nothing below.
    high = torch.tensor([0x3F80, 0x3F81, 0xBF80, 0xBF81], dtype=torch.int64)[:, None] << 16
    bits = (high + torch.tensor([0x8000, 0x7FFF, 0x8001, 0])).flatten()
    bits = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)
    x = torch.cat([bits.view(torch.float32), torch.randn(48, generator=torch.Generator().manual_seed(0))])
    y = torch.empty(64, dtype=torch.bfloat16)
    _round_to_bf16_kernel[(1,)](x, y, N=64)
    assert torch.equal(y.view(torch.int16), x.to(torch.bfloat16).view(torch.int16))
