"""The KV split follows the sliding window: a windowed decode at 128k splits like a decode of the window.

kernels.tiling.tiling_for bounds the keys a program walks by W + the longest q_len, and the
kernel (and tlsim) cut the splits from the window's first tile, so every split shares the
window's work instead of all but the last walking nothing.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import kernels
from harness.run.grading import grade
from harness.run.oracle import paged_attention_oracle
from kernels.contract import prepare_call
from kernels.tiling import tiling_for
from tests.kernels.kernel_cases import CASES_BY_NAME, needs_triton


def _long_decode_call(window: int | None, seq_len: int = 131072):
    """4 x 128k decode at 32 / 8 heads (Mistral-7B-shaped), shapes only: the pools hold one block."""
    q = torch.zeros(4, 32, 128, dtype=torch.bfloat16)
    pool = torch.zeros(1, 16, 8, 128, dtype=torch.bfloat16)
    table = torch.zeros(4, seq_len // 16, dtype=torch.int32)
    lens = torch.full((4,), seq_len, dtype=torch.int32)
    return prepare_call(q, pool, pool, table, lens, sliding_window=window, check=False)


def test_windowed_128k_decode_splits_like_a_decode_of_the_window():
    windowed, plain = tiling_for(_long_decode_call(4096)), tiling_for(_long_decode_call(None))
    short = tiling_for(_long_decode_call(None, seq_len=4096 + 16))  # a plain decode of about W keys
    assert plain.SPLIT_SIZE * plain.NUM_SPLITS >= 131072
    assert (windowed.NUM_SPLITS, windowed.SPLIT_SIZE) == (short.NUM_SPLITS, short.SPLIT_SIZE)
    assert windowed.SPLIT_SIZE * windowed.NUM_SPLITS >= 4096 + 1, "the splits cover the window"
    assert windowed.SPLIT_SIZE * windowed.NUM_SPLITS < 2 * (4096 + 64), "and about nothing else"


def test_a_window_wider_than_the_table_changes_nothing():
    assert tiling_for(_long_decode_call(1_000_000)) == tiling_for(_long_decode_call(None))


def test_prefill_bound_counts_the_queries():
    base = replace(CASES_BY_NAME["split_kv_prefill_early_rows"], seq_lens=(1100,), q_lens=(600,))  # tiling only
    inputs = base.inputs()
    hinted = tiling_for(prepare_call(*inputs.args(), sliding_window=500), max_q_len=600)
    unhinted = tiling_for(prepare_call(*inputs.args(), sliding_window=500))
    assert hinted == unhinted, "without a hint the bound is num_tokens (600 here)"
    assert hinted.NUM_SPLITS == tiling_for(prepare_call(*inputs.args())).NUM_SPLITS == 2, "1100 keys: both split"
    narrow = tiling_for(prepare_call(*inputs.args(), sliding_window=100), max_q_len=600)
    assert narrow.NUM_SPLITS == 1, "100 + 600 keys is too few to split"


@pytest.mark.parametrize("fn_name", ["tlsim", "triton"])
@pytest.mark.parametrize("window", [1100, 1500])
def test_splits_cut_from_the_window_match_the_oracle(fn_name, window):
    """Decode over 4000 and 3900 keys: the window's keys in 2 splits that start at its first tile."""
    if fn_name == "triton":
        needs_triton()
    base = replace(CASES_BY_NAME["split_kv_decode"], seq_lens=(4000, 3900), q_lens=(1, 1))
    inputs = base.inputs()
    tiling = tiling_for(prepare_call(*inputs.args(), sliding_window=window))
    assert tiling.NUM_SPLITS == 2 and window > tiling.SPLIT_SIZE
    result = getattr(kernels, f"paged_attention_{fn_name}")(*inputs.args(), sliding_window=window, return_lse=True)
    expected, expected_lse = paged_attention_oracle(*inputs.args(), sliding_window=window, return_lse=True)
    assert grade(result[0], expected, 1e-5, 1e-4).passed
    assert grade(result[1], expected_lse, 1e-5, 1e-4).passed
