"""Bad calls fail with a message naming the argument, before any kernel runs."""

from __future__ import annotations

import pytest
import torch

import kernels
from tests.kernel_cases import BASE

BACKENDS = [kernels.paged_attention_reference, kernels.paged_attention_tlsim, kernels.paged_attention_triton]


def _args():
    return list(BASE.inputs().args())


def _bad(index, value):
    args = _args()
    args[index] = value(args[index])
    return args


BAD_CALLS = {
    "q_not_3d": (_bad(0, lambda q: q[0]), "q must be"),
    "heads_not_multiple": (_bad(0, lambda q: q[:, :7].contiguous()), "multiple of num_kv_heads"),
    "dtype_mismatch": (_bad(1, lambda k: k.half()), "must share one of"),
    "block_table_int64": (_bad(3, lambda bt: bt.long()), "must be int32"),
    "qsl_wrong_total": (
        _bad(5, lambda qsl: qsl - 1 + torch.nn.functional.pad(torch.ones(1, dtype=torch.int32), (0, len(qsl) - 1))),
        "query_start_loc",
    ),
    "seq_len_past_table": (_bad(4, lambda s: s * 100), "exceeds max_blocks_per_seq"),
}


@pytest.mark.parametrize("fn", BACKENDS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_is_a_value_error_naming_the_argument(fn, name):
    args, message = BAD_CALLS[name]
    with pytest.raises(ValueError, match=message):
        fn(*args)


def test_q_len_above_seq_len_is_rejected():
    args = _args()
    args[4] = torch.ones_like(args[4])  # every seq_len 1, but one sequence has q_len 4
    with pytest.raises(ValueError, match="q_len <= seq_len"):
        kernels.paged_attention_tlsim(*args)


def test_decode_default_needs_one_query_per_sequence():
    q, k, v, bt, seq_lens, _ = _args()
    with pytest.raises(ValueError, match="one query per sequence"):
        kernels.paged_attention_tlsim(q, k, v, bt, seq_lens)


def test_triton_sync_free_call_matches_the_checked_call():
    """With max_q_len given the launcher reads no tensor value; the result must not change."""
    if reason := kernels.triton_unavailable_reason("cpu"):
        pytest.skip(reason)
    args = _args()
    checked = kernels.paged_attention_triton(*args)
    sync_free = kernels.paged_attention_triton(*args, max_q_len=max(BASE.q_lens))
    torch.testing.assert_close(sync_free, checked, rtol=0, atol=0)
