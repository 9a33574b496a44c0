"""Bad calls fail with a message naming the argument, before any kernel runs; bad indices never crash or
read memory the call does not own.

Shape, dtype and device checks always run; value checks (a block id outside [0, num_blocks), say) run when
asked (check=True, or PAGED_ATTENTION_CHECK=1, which tests/conftest.py sets for the suite). With them off,
any index layout gives the contiguous answer, and the kernel and tlsim turn a bad block id into NaN rows."""

from __future__ import annotations

import functools

import pytest
import torch

import kernels
from kernels.contract import prepare_call
from kernels.tiling import tiling_for
from tests.kernels.kernel_cases import BAD_CALLS, BASE, CASES_BY_NAME, backend_fn, base_args, needs_triton, strided

NAMES = ["reference", "tlsim", "triton", "dispatch"]


@pytest.mark.parametrize("backend", NAMES)
@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_is_a_value_error_naming_the_argument(backend, name):
    args, message = BAD_CALLS[name]
    with pytest.raises(ValueError, match=message):
        backend_fn(backend)(*args)


def test_triton_sync_free_call_with_hints_matches_the_checked_call():
    """Checks off and launch hints given: the same answer, bit for bit, as the checked call."""
    needs_triton()
    args = base_args()
    checked = kernels.paged_attention_triton(*args, check=True)
    sync_free = kernels.paged_attention_triton(*args, max_q_len=max(BASE.q_lens), max_seq_len=35, check=False)
    torch.testing.assert_close(sync_free, checked, rtol=0, atol=0)


def test_check_none_follows_the_environment_variable(monkeypatch):
    for value in ("1", "0", "", "é"):
        monkeypatch.setenv(kernels.CHECK_ENV, value)
        assert kernels.checks_enabled(None) == kernels.checks_enabled() == (value == "1"), repr(value)
        assert kernels.checks_enabled(True) and not kernels.checks_enabled(False), "check given wins"
    monkeypatch.delenv(kernels.CHECK_ENV)
    assert not kernels.checks_enabled(None), "value checks are off by default"


@pytest.mark.parametrize("backend", NAMES)
def test_value_checks_are_opt_in_and_shape_checks_are_not(backend, monkeypatch):
    fn = backend_fn(backend)
    monkeypatch.delenv(kernels.CHECK_ENV)
    args, message = BAD_CALLS["qsl_wrong_total"]
    fn(*args)  # the default path reads no value: the caller vouches for query_start_loc
    with pytest.raises(ValueError, match=message):
        fn(*args, check=True)
    monkeypatch.setenv(kernels.CHECK_ENV, "1")
    with pytest.raises(ValueError, match=message):
        fn(*args)
    fn(*args, check=False)
    for name in ("q_not_3d", "dtype_mismatch", "block_table_int64"):  # metadata only: always checked
        bad_args, bad_message = BAD_CALLS[name]
        with pytest.raises(ValueError, match=bad_message):
            fn(*bad_args, check=False)


# --- bad indices ---------------------------------------------------------------------------------------


def with_block(seq: int, index: int, value: int):
    def change(table):
        table[seq, index] = value
        return table

    return change


@functools.cache
def unchecked_base(backend: str) -> torch.Tensor:
    """The backend's output on the base call, value checks off: made once a process for the rows that compare
    against it, which only read it."""
    return backend_fn(backend)(*base_args(), check=False)


@pytest.mark.parametrize("backend", NAMES)
@pytest.mark.parametrize("which", ["block_table", "seq_lens", "query_start_loc"])
def test_non_contiguous_index_tensor_gives_the_contiguous_answer(backend, which):
    got = backend_fn(backend)(*base_args(**{which: strided}), check=False)
    torch.testing.assert_close(got, unchecked_base(backend), rtol=0, atol=0)


NUM_BLOCKS = BASE.inputs().k_cache.shape[0]
BAD_BLOCK_IDS = {"num_blocks": NUM_BLOCKS, "far_past_the_pool": NUM_BLOCKS + 10**7, "minus_one": -1, "minus_five": -5}


@pytest.mark.parametrize("backend", NAMES)
@pytest.mark.parametrize("bad", BAD_BLOCK_IDS)
def test_used_block_id_outside_the_pool_is_refused_naming_block_table(backend, bad):
    args = base_args(block_table=with_block(4, 2, BAD_BLOCK_IDS[bad]))  # seq_len 35 uses blocks 0..2
    with pytest.raises(ValueError, match=r"block_table\[4, 2\] = .* outside \[0, num_blocks"):
        backend_fn(backend)(*args, check=True)


@pytest.mark.parametrize("backend", NAMES)
def test_unused_table_entries_may_hold_anything(backend):
    fn = backend_fn(backend)
    args = base_args(block_table=with_block(0, 1, 10**7))  # seq_len 1 uses block 0 only
    torch.testing.assert_close(fn(*args, check=True), fn(*base_args(), check=True), rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["tlsim", "triton"])
@pytest.mark.parametrize("bad", BAD_BLOCK_IDS)
def test_unchecked_bad_block_id_turns_its_rows_to_nan_and_leaves_the_rest(backend, bad):
    """Checks off: no crash, no stray read, no silent answer: the sequence's rows are NaN."""
    good = unchecked_base(backend)
    got = backend_fn(backend)(*base_args(block_table=with_block(4, 2, BAD_BLOCK_IDS[bad])), check=False)
    rows = slice(int(base_args()[5][4]), int(base_args()[5][5]))  # sequence 4's queries
    last_rows = got[rows][-1]  # the last query sees every key, the bad block's included
    assert bool(last_rows.isnan().all())
    torch.testing.assert_close(got[: rows.start], good[: rows.start], rtol=0, atol=0)


def _split_decode_args(table_change=None):
    """split_kv_decode (seq_lens 2500, 700, 1; 8 query heads on 1 KV head), whose KV is split; one query each."""
    args = list(CASES_BY_NAME["split_kv_decode"].inputs().args())[:5]
    if table_change is not None:
        table_change(args[3])
    return args


@pytest.mark.parametrize("backend", ["tlsim", "triton"])
def test_a_bad_block_in_one_kv_split_turns_that_sequence_to_nan(backend):
    """A bad id in the middle of a split KV range reaches the combine as NaN, only that sequence's."""
    fn = backend_fn(backend)
    assert tiling_for(prepare_call(*_split_decode_args(), check=False)).NUM_SPLITS > 1
    good = fn(*_split_decode_args(), check=False)
    got = fn(*_split_decode_args(with_block(0, 100, 10**6)), check=False)  # key 1600 of 2500
    assert bool(got[0].isnan().all())
    torch.testing.assert_close(got[1:], good[1:], rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["tlsim", "triton"])
def test_a_bad_block_before_the_windows_first_tile_is_not_read_and_changes_nothing(backend):
    """A bad id in block 3 (keys 48-63; window 1200 from key 1300) is never read: the good table's answer."""
    fn, window = backend_fn(backend), {"sliding_window": 1200}
    assert tiling_for(prepare_call(*_split_decode_args(), check=False, **window)).NUM_SPLITS > 1
    good = fn(*_split_decode_args(), check=False, **window)
    got = fn(*_split_decode_args(with_block(0, 3, -7)), check=False, **window)
    torch.testing.assert_close(got, good, rtol=0, atol=0)


@pytest.mark.parametrize("seq_len", [2**31 - 1, 2**31 - 40])
def test_a_seq_len_near_int32_max_is_nan_not_a_wrapped_bound(seq_len):
    """A garbage seq_len near 2^31 must not wrap the table check's end: the row is NaN."""
    fn = backend_fn("triton")
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 2, 16), torch.randn(8, 16, 1, 16), torch.randn(8, 16, 1, 16)
    table = torch.arange(8, dtype=torch.int32).view(2, 4)
    got = fn(q, k, v, table, torch.tensor([40, seq_len], dtype=torch.int32), check=False, sliding_window=5)
    assert bool(got[1].isnan().all())
    assert not bool(got[0].isnan().any())
