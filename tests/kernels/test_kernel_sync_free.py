"""The default call reads no tensor value on the host: no device sync, CUDA-graph capturable.

On the CPU a Python-level value read raises during the call (conftest's ValueReadGuard; the
interpreted launch itself is let through); on a GPU the call is captured in a CUDA graph under
``torch.cuda.set_sync_debug_mode("error")``."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import kernels
from harness.cases.vocab import DEFAULT_TOLERANCES
from harness.run.oracle import paged_attention_oracle
from kernels import tiling, tuning
from kernels.contract import prepare_call
from kernels.tiling import tiling_for
from tests.kernels.kernel_cases import BASE, CASES_BY_NAME, ON_CUDA, assert_passes, backend_fn, needs_triton

DECODE = replace(BASE, name="decode", q_lens=(1, 1, 1, 1, 1))
SYNC_FREE_CASES = [BASE, DECODE, CASES_BY_NAME["prefill_full"], CASES_BY_NAME["split_kv_decode"]]


def _args(case, device="cpu"):
    """The case's call; the decodes pass query_start_loc=None (one query per sequence)."""
    args = list(case.inputs(device).args())
    if case.name in ("decode", "device_split_decode"):
        args[5] = None
    return args


def _assert_matches_oracle(got, args, case):
    assert_passes(got, paged_attention_oracle(*args), DEFAULT_TOLERANCES[case.dtype], case.name)


@pytest.mark.parametrize(
    ("case", "entry"), [*((case, "triton") for case in SYNC_FREE_CASES), (BASE, "dispatch")], ids=str
)
def test_default_triton_call_reads_no_tensor_value_unless_checked(case, entry, triton_launches, value_reads):
    fn, args = getattr(kernels, f"paged_attention_{entry}"), _args(case)
    dispatched = {"backend": "triton"} if entry == "dispatch" else {}
    with value_reads.forbidden():
        got = fn(*args, **dispatched)
    assert not value_reads.reads and triton_launches.grids
    _assert_matches_oracle(got, args, case)
    # the same call with value checks on trips the guard: the reads above can fail
    with value_reads.forbidden(), pytest.raises(AssertionError, match="read a tensor value"):
        fn(*args, **dispatched, check=True)


@pytest.mark.parametrize("as_offsets", [False, True], ids=["query_start_loc_none", "query_start_loc_ones"])
def test_decode_launches_one_program_per_sequence_and_kv_head(as_offsets, recorded):
    args = _args(DECODE)
    if as_offsets:  # all q_len 1 through offsets: the tile numbering is still exact
        args[5] = torch.arange(len(DECODE.seq_lens) + 1, dtype=torch.int32)
    kernels.paged_attention_triton(*args)
    assert recorded.grids[0][:2] == (len(DECODE.seq_lens), DECODE.num_kv_heads)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_decode_through_offsets_gets_the_decode_tiling(dtype):
    """query_start_loc of all-ones is decode too: without reading it, the same tile height and split."""
    num_seqs, heads, head_dim = 64, (32, 8), 128
    q = torch.empty(num_seqs, heads[0], head_dim, dtype=dtype)
    pool = torch.empty(4, 16, heads[1], head_dim, dtype=dtype)
    table, lens = torch.zeros(num_seqs, 8, dtype=torch.int32), torch.ones(num_seqs, dtype=torch.int32)
    ones = torch.arange(num_seqs + 1, dtype=torch.int32)
    as_decode = tiling_for(prepare_call(q, pool, pool, table, lens, None, check=False))
    assert tiling_for(prepare_call(q, pool, pool, table, lens, ones, check=False)) == as_decode


def test_prefill_launches_about_num_tokens_over_block_q_tiles(recorded):
    case = replace(BASE, name="ragged_prefill", seq_lens=(70, 5, 33, 64), q_lens=(70, 0, 9, 64))
    args = _args(case)
    kernels.paged_attention_triton(*args)
    block_q = tiling_for(prepare_call(*args)).BLOCK_Q
    num_tokens, num_seqs = sum(case.q_lens), len(case.q_lens)
    assert recorded.grids[0][0] <= num_tokens // block_q + num_seqs
    assert recorded.grids[0][0] < num_tokens, "prefill tiles must hold several tokens each"


@pytest.mark.parametrize("backend", ["triton", "tlsim"])
def test_wrong_launch_hints_change_speed_not_the_result(backend):
    """max_q_len only picks the tile height; a short max_seq_len still covers every key."""
    fn = backend_fn(backend)
    case = CASES_BY_NAME["split_kv_decode"]
    args = _args(case)
    assert tiling_for(prepare_call(*args), max_seq_len=1024).NUM_SPLITS > 1, "the hint must still split, too short"
    _assert_matches_oracle(fn(*args, max_q_len=0, max_seq_len=1024), args, case)


# --- on a GPU --------------------------------------------------------------------------------


def _assert_no_sync_and_graph_replay(args, case, **hints):
    """After a first (compiling) call: no device sync, a CUDA graph replay into a NaN out, each output graded."""
    out = torch.full_like(args[0], float("nan"))
    kernels.paged_attention_triton(*args, out=out, **hints)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out.fill_(float("nan"))
        kernels.paged_attention_triton(*args, out=out, **hints)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    _assert_matches_oracle(out, args, case)
    out.fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernels.paged_attention_triton(*args, out=out, **hints)
    graph.replay()
    torch.cuda.synchronize()
    _assert_matches_oracle(out, args, case)


@pytest.mark.parametrize("case", SYNC_FREE_CASES, ids=str)
@pytest.mark.parametrize("_", [pytest.param(None, marks=ON_CUDA, id="cuda")])
def test_default_call_makes_no_device_sync_and_replays_from_a_cuda_graph(case, _, monkeypatch):
    monkeypatch.delenv(kernels.CHECK_ENV, raising=False)
    _assert_no_sync_and_graph_replay(_args(case, "cuda"), case)


# The device split (kernels.tiling.DEVICE_SPLIT): a ragged decode whose split the kernel decides from seq_lens,
# a grid of 4 splits where the two longest sequences (1000, 660 keys) take two and the rest one, down to 1 key
# (the bounds lowered to fit the interpreter: a "GPU" of 32 program slots, pieces of at least 64 keys).
DEVICE_SPLIT_DECODE = replace(BASE, name="device_split_decode", seq_lens=(1000, 1, 17, 430, 200, 660, 64, 33),
                              q_lens=(1,) * 8)  # fmt: skip
DEVICE_SPLIT_HINTS = {"max_q_len": 1, "max_seq_len": 1000}


@pytest.fixture
def device_split_on(monkeypatch):
    monkeypatch.setattr(tiling, "TARGET_PROGRAMS", 32)
    monkeypatch.setattr(tiling, "DEVICE_SPLIT_MIN_KEYS", 64)
    with tuning.override(tuning.TileConfig(16, 1, 32, 4, 2)):  # a plan of its own (the key sees the override)
        yield


def test_the_device_split_reads_no_tensor_value(device_split_on, triton_launches, value_reads):
    args = _args(DEVICE_SPLIT_DECODE)
    with value_reads.forbidden():
        got = kernels.paged_attention_triton(*args, **DEVICE_SPLIT_HINTS)
    assert not value_reads.reads
    chosen = tiling_for(prepare_call(*args, check=False), **DEVICE_SPLIT_HINTS)
    assert chosen.DEVICE_SPLIT is not None and triton_launches.grids[0] == (8, 2, chosen.NUM_SPLITS)
    assert needs_triton().combine_splits_kernel.grids == [(8 * 8,)]  # the combine: a program a row
    _assert_matches_oracle(got, args, DEVICE_SPLIT_DECODE)


@pytest.mark.parametrize("_", [pytest.param(None, marks=ON_CUDA, id="cuda")])
def test_the_device_split_replays_from_a_cuda_graph_and_makes_no_sync(_, device_split_on, monkeypatch):
    monkeypatch.delenv(kernels.CHECK_ENV, raising=False)
    args = _args(DEVICE_SPLIT_DECODE, "cuda")
    assert tiling_for(prepare_call(*args, check=False), **DEVICE_SPLIT_HINTS).DEVICE_SPLIT is not None
    _assert_no_sync_and_graph_replay(args, DEVICE_SPLIT_DECODE, **DEVICE_SPLIT_HINTS)
