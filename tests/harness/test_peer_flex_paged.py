"""flex_paged: the call matches the oracle, and its BlockMask lists exactly the pages the compiled kernel needs."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torch.nn.attention.flex_attention")

from harness.backends import flex_paged
from harness.backends.builtin import REGISTRY
from harness.backends.flex_paged import kernel_options_for, page_logical_table, paged_flex_mask, prepare_flex_paged
from harness.backends.peers import flex_unavailable
from harness.backends.registry import Unsupported
from harness.cases.spec import expand_spec
from harness.cases.vocab import DEFAULT_TOLERANCES
from harness.run.grading import grade
from harness.run.oracle import paged_attention_oracle
from harness.run.runner import case_inputs

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

BASE = {"name": "flex", "num_q_heads": 8, "num_kv_heads": 2, "head_dim": 32, "block_size": 16}
CASES = {
    # packed: seq 0's first 128 rows form a query block of their own (full pages), the next
    # block spans the rest of seq 0, seq 1's decode row and seq 2 (all pages partial)
    "prefill_ragged_straddling": {"seq_lens": [300, 90, 7], "q_lens": [200, 1, 7]},
    "chunked_prefill": {"seq_lens": [500, 260], "q_lens": [130, 70]},
    "chunked_prefill_window": {"seq_lens": [500, 260], "q_lens": [130, 70], "sliding_window": 40},
    "prefill_contiguous_mha": {"seq_lens": [160, 129], "q_lens": [160, 129], "num_kv_heads": 8, "layout": "contiguous"},
    "prefill_shared_prefix": {"seq_lens": [150, 140], "q_lens": [100, 70], "layout": "shared_prefix"},
    "decode_ragged": {"seq_lens": [40, 33, 17, 64, 1], "q_lens": [1, 1, 1, 1, 1], "block_size": 8},
    "decode_shared_prefix": {"seq_lens": [70, 50, 33], "q_lens": [1, 1, 1], "layout": "shared_prefix"},
    "decode_window": {"seq_lens": [70, 50, 33], "q_lens": [1, 1, 1], "sliding_window": 20},
    "spec_verify": {"seq_lens": [50, 70], "q_lens": [4, 4]},
    "mixed_with_an_empty_query": {"seq_lens": [20, 9, 7], "q_lens": [6, 1, 0], "block_size": 4},
    "softcap_alibi_window": {"seq_lens": [300, 90], "q_lens": [140, 1], "sliding_window": 50, "logit_softcap": 5.0,
                             "input_scale": 3.0, "alibi": True},
}  # fmt: skip


def _case(name: str):
    (case,) = expand_spec({**BASE, **CASES[name]}, "t.toml")
    return case, case_inputs(case, "cpu")


def _graded(case, inputs):
    """flex_paged's output on ``inputs`` graded against the oracle, and the note of its prepare step."""
    prepared = prepare_flex_paged(case, inputs, torch.empty_like(inputs.q))
    expected = paged_attention_oracle(*inputs.args(), **inputs.options)
    return grade(prepared.to_packed(prepared.run()), expected, *DEFAULT_TOLERANCES[case.dtype]), prepared.note


@pytest.mark.parametrize("name", CASES)
def test_flex_paged_matches_oracle(name):
    case, inputs = _case(name)
    graded, note = _graded(case, inputs)
    assert ("packed" if max(case.q_lens) > flex_paged.PER_SEQUENCE_MAX_Q else "per_sequence") in note
    assert graded.passed, graded.reason


def _truth(case, inputs, rows) -> torch.Tensor:
    """[batch, rows, num_blocks * block_size] bool, from the block table by plain loops."""
    num_blocks, block_size = inputs.k_cache.shape[:2]
    truth = torch.zeros(*rows.row_seq.shape, num_blocks * block_size, dtype=torch.bool)
    for b in range(rows.row_seq.shape[0]):
        for r in range(rows.row_seq.shape[1]):
            seq, p = int(rows.row_seq[b, r]), int(rows.row_pos[b, r])
            if seq < 0:
                continue
            for key_pos in range(p + 1):
                if case.sliding_window is None or key_pos > p - case.sliding_window:
                    page = int(inputs.block_table[seq, key_pos // block_size])
                    truth[b, r, page * block_size + key_pos % block_size] = True
    return truth


def block_list_problems(block_mask, truth: torch.Tensor, q_block: int, block_size: int) -> list[str]:
    """What is wrong with the BlockMask's page lists against ``truth``; empty when nothing is."""
    batch, num_rows, _ = truth.shape
    problems = []
    covered = torch.zeros_like(truth)
    kinds = {"partial": (block_mask.kv_num_blocks, block_mask.kv_indices),
             "full": (block_mask.full_kv_num_blocks, block_mask.full_kv_indices)}  # fmt: skip
    for b in range(batch):
        for j in range(-(-num_rows // q_block)):
            rows = slice(j * q_block, min((j + 1) * q_block, num_rows))
            lists = {kind: indices[b, 0, j, : int(count[b, 0, j])].tolist() for kind, (count, indices) in kinds.items()}
            listed = lists["partial"] + lists["full"]
            if len(set(listed)) != len(listed):
                problems.append(f"batch {b} q block {j}: a page listed twice: {sorted(listed)}")
            for kind, pages in lists.items():
                for page in pages:
                    slots = truth[b, rows, page * block_size : (page + 1) * block_size]
                    if kind == "full" and not bool(slots.all()):
                        problems.append(f"batch {b} q block {j}: page {page} is listed full but not all seen")
                    if not bool(slots.any()):
                        problems.append(f"batch {b} q block {j}: {kind} page {page} is seen by no row")
                    covered[b, rows, page * block_size : (page + 1) * block_size] = True
    if missed := int((truth & ~covered).sum()):
        problems.append(f"{missed} admitted (row, slot) pairs lie in no listed page")
    return problems


@pytest.mark.parametrize("name", CASES)
def test_block_lists_cover_exactly_what_the_causal_rule_admits(name):
    case, inputs = _case(name)
    rows, block_mask, _ = paged_flex_mask(case, inputs)
    truth = _truth(case, inputs, rows)
    assert block_list_problems(block_mask, truth, rows.q_block, case.block_size) == []
    b, r, n = (torch.arange(size) for size in truth.shape)
    dense = block_mask.mask_mod(b[:, None, None], torch.tensor(0), r[None, :, None], n[None, None, :])
    assert torch.equal(dense, truth), "the mask_mod disagrees with the block table"


def test_dropping_the_full_pages_is_caught(monkeypatch):
    """The block-list check can fail: a mask that forgets its full pages leaves admitted slots unread."""
    case, inputs = _case("prefill_ragged_straddling")
    real = flex_paged.paged_block_mask

    def no_full(*args, **kwargs):
        num, indices, full_num, full_indices = real(*args, **kwargs)
        return num, indices, torch.zeros_like(full_num), full_indices

    monkeypatch.setattr(flex_paged, "paged_block_mask", no_full)
    rows, block_mask, _ = paged_flex_mask(case, inputs)
    problems = block_list_problems(block_mask, _truth(case, inputs, rows), rows.q_block, case.block_size)
    assert problems and "lie in no listed page" in problems[-1]


def test_a_wrong_inverse_page_table_fails_the_oracle(monkeypatch):
    """Shift every page's logical index by one (modulo the table's width): the mask_mod admits the wrong slots."""
    case, inputs = _case("chunked_prefill")
    real, width = flex_paged.page_logical_table, inputs.block_table.shape[1]

    def shifted(*args):
        table = real(*args)
        return torch.where(table >= 0, (table + 1) % width, -1)

    monkeypatch.setattr(flex_paged, "page_logical_table", shifted)
    assert not _graded(case, inputs)[0].passed


def test_a_page_at_two_logical_positions_is_refused():
    table = torch.tensor([[3, 1], [1, 0]], dtype=torch.int32)  # page 1 is block 1 of seq 0, block 0 of seq 1
    with pytest.raises(Unsupported, match="two logical positions"):
        page_logical_table(table, torch.tensor([20, 20]), 4, 16)


@pytest.mark.parametrize(
    ("block_size", "expected"),
    [(16, {"BLOCK_N": 16}), (32, {"BLOCK_N": 32}), (64, {"BLOCK_N": 64}), (48, {"BLOCK_N": 16}), (128, {}), (256, {})],
)
def test_kernel_options_tile_kv_within_a_page(block_size, expected):
    assert kernel_options_for(block_size, torch.device("cuda")) == expected
    assert kernel_options_for(block_size, torch.device("cpu")) == {}
    # under 128 packed rows flex would take its decoding kernel, whose BLOCK_M need not divide 128
    packed = {**expected, "FORCE_USE_FLEX_ATTENTION": True}
    assert kernel_options_for(block_size, torch.device("cuda"), "packed") == packed


def test_a_page_size_the_triton_kernel_cannot_tile_is_a_skip_naming_it():
    backend = REGISTRY["flex_paged"]
    assert backend.variants == {"sliding_window", "logit_softcap", "alibi_slopes"}
    (case,) = expand_spec({**BASE, "block_size": 5, "seq_lens": [9]}, "t.toml")
    if reason := flex_unavailable(case, "cuda"):  # no FlexAttention or no Triton: that reason comes first
        pytest.skip(reason)
    assert "multiple of 16" in (backend.unavailable(case, "cuda") or "")
    with pytest.raises(Unsupported, match="multiple of 16"):
        kernel_options_for(5, torch.device("cuda"))
    (sinks,) = expand_spec({**BASE, "seq_lens": [9], "sinks": {"scale": 1.0}}, "t.toml")
    assert "does not support sinks" in backend.skip_reason(sinks, "cuda")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["prefill_ragged_straddling", "chunked_prefill_window", "decode_shared_prefix"])
def test_flex_paged_compiled_on_the_cpu_matches_oracle(name, monkeypatch):
    """Compiled on the CPU, reading only the listed pages and skipping the mask_mod on full ones, it matches."""
    import torch.nn.attention.flex_attention as flex

    monkeypatch.setattr(flex, "flex_attention", torch.compile(flex.flex_attention, dynamic=False))
    graded, _ = _graded(*_case(name))
    assert graded.passed, graded.reason


GPU_BASE = {"name": "flex_gpu", "num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "dtype": "bfloat16"}
GPU_CASES = {
    # per_sequence form, flex's decoding kernel; BLOCK_N = 16 / 32 / 64 under the page; none at 128
    "decode_page16": {"block_size": 16, "seq_lens": [700, 1500, 33, 1024], "q_lens": [1, 1, 1, 1]},
    "decode_page32_window_softcap_alibi": {"block_size": 32, "seq_lens": [700, 1500, 33], "q_lens": [1, 1, 1],
                                           "sliding_window": 100, "logit_softcap": 30.0, "alibi": True},
    "decode_page64_hd64": {"block_size": 64, "head_dim": 64, "seq_lens": [700, 1500], "q_lens": [1, 1]},
    "decode_page128_fp32": {"block_size": 128, "dtype": "float32", "seq_lens": [700, 1500], "q_lens": [1, 1]},
    "decode_gqa3_main_kernel": {"num_q_heads": 12, "num_kv_heads": 4, "seq_lens": [700, 90], "q_lens": [1, 1]},
    "mixed_shared_prefix": {"seq_lens": [600, 650, 700], "q_lens": [40, 1, 7], "layout": "shared_prefix"},
    # packed form: fewer than 128 rows (the main kernel forced), then blocks spanning sequences
    "packed_under_128_rows": {"seq_lens": [900], "q_lens": [100]},
    "packed_ragged_prefill": {"seq_lens": [1000, 300, 90], "q_lens": [1000, 130, 1], "block_size": 32},
}  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
@pytest.mark.parametrize("name", GPU_CASES)
def test_flex_paged_compiled_on_cuda_matches_oracle(name):
    """The Triton path: page sizes 16-128, decoding and main kernels, both query forms."""
    (case,) = expand_spec({**GPU_BASE, **GPU_CASES[name]}, "t.toml")
    graded, note = _graded(case, case_inputs(case, "cuda"))
    assert graded.passed, f"{graded.reason} ({note})"
