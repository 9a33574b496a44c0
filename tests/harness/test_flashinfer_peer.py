"""flashinfer peer: its page table, skip and variants on the CPU; on a GPU its wrappers against the oracle."""

from __future__ import annotations

import importlib.util
import tomllib

import pytest
import torch

from harness.backends import flashinfer_peer
from harness.backends.builtin import REGISTRY
from harness.backends.flashinfer_peer import DECLARED_VARIANTS, INSTALL, module_key, page_table, warmup_cases
from harness.cases.spec import expand_spec, load_case_file
from harness.cases.variants import VARIANT_KEYS, VARIANTS
from harness.run.grading import grade
from harness.run.oracle import paged_attention_oracle
from harness.run.runner import case_inputs
from kernels import PagedKVCache
from tests.fresh_python import ROOT

GPU_SUITES = ("cases/gpu_peers.toml", "cases/gpu_flashinfer.toml")
GPU_SUITE_CASES = [case for path in GPU_SUITES for case in load_case_file(ROOT / path)]


def _case(**fields):
    base = {"name": "fi", "num_q_heads": 8, "num_kv_heads": 2, "head_dim": 128, "block_size": 16,
            "dtype": "bfloat16", "seq_lens": [45, 16, 3], "q_lens": [1, 1, 1]}  # fmt: skip
    (case,) = expand_spec({**base, **fields}, "t.toml")
    return case


def test_page_table_matches_the_worked_example_of_the_docstring():
    table = torch.tensor([[7, 2, 9, -1], [4, -1, -1, -1], [0, -1, -1, -1]], dtype=torch.int32)
    pages = page_table(table, torch.tensor([45, 16, 3], dtype=torch.int32), 16)
    assert pages.indptr.tolist() == [0, 3, 4, 5]
    assert pages.indices.tolist() == [7, 2, 9, 4, 0]
    assert pages.last_page_len.tolist() == [13, 16, 3]


@pytest.mark.parametrize(
    "block_size, appends",
    [
        (16, [(0, 45), (1, 16), (2, 3), (0, 20), (1, 1)]),  # interleaved growth: pages out of order
        (8, [(0, 1), (1, 8), (2, 9), (1, 7), (0, 30), (2, 0)]),
        (4, [(0, 0), (1, 5), (2, 4), (1, 11)]),  # an empty sequence among full and partial ones
    ],
)
def test_every_key_is_in_the_slot_paged_kv_cache_wrote_it_to(block_size, appends):
    cache = PagedKVCache(num_layers=1, num_blocks=64, block_size=block_size, num_kv_heads=1, head_dim=8)
    slots: dict[int, list[int]] = {}
    for seq_id, count in appends:
        if seq_id not in slots:
            cache.allocate(seq_id)
            slots[seq_id] = []
        slots[seq_id] += cache.append(seq_id, count).tolist()
    ids = sorted(slots)
    pages = page_table(cache.block_table(ids), cache.seq_lens(ids), block_size)
    indptr, indices, last = pages.indptr.tolist(), pages.indices.tolist(), pages.last_page_len.tolist()
    assert indptr[-1] == len(indices) and -1 not in indices
    for s, seq_id in enumerate(ids):
        seq_len = len(slots[seq_id])
        own = indices[indptr[s] : indptr[s + 1]]
        assert len(own) == -(-seq_len // block_size)
        assert max(len(own) - 1, 0) * block_size + last[s] == seq_len
        assert 0 < last[s] <= block_size or seq_len == 0
        found = [own[p // block_size] * block_size + p % block_size for p in range(seq_len)]
        assert found == slots[seq_id]


def test_page_table_reads_no_entry_past_a_sequence_of_the_harness_inputs():
    case = _case(seq_lens=[45, 16, 3, 70], q_lens=[1, 1, 1, 1], layout="shared_prefix")
    inputs = case_inputs(case, "cpu")
    pages = page_table(inputs.block_table, inputs.seq_lens, case.block_size)
    lens = pages.indptr[1:] - pages.indptr[:-1]
    assert lens.tolist() == [-(-n // case.block_size) for n in case.seq_lens]
    rows = [inputs.block_table[s, :n].tolist() for s, n in enumerate(lens.tolist())]
    assert pages.indices.tolist() == [page for row in rows for page in row]


def test_missing_flashinfer_is_a_skip_row_naming_the_install_command_of_an_extra_of_the_project(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flashinfer" else real(name, *a))
    reason = REGISTRY["flashinfer"].skip_reason(_case(), "cuda")
    assert reason is not None and INSTALL in reason
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert INSTALL == "pip install '.[flashinfer]'"
    assert any(d.startswith("flashinfer-python") for d in extras["flashinfer"])


def test_declared_variants_are_keys_of_the_variant_table():
    assert set(VARIANT_KEYS) >= DECLARED_VARIANTS and REGISTRY["flashinfer"].variants == DECLARED_VARIANTS
    for variant in VARIANTS:
        case = _case(**variant.example) if variant.key != "sinks" else _case(sinks=[1.0] * 8)
        reason = REGISTRY["flashinfer"].skip_reason(case, "cuda") or ""
        refused = reason.partition("does not support ")[2].partition(" (")[0].split(", ")
        assert (variant.key in refused) != (variant.key in DECLARED_VARIANTS), (variant.key, reason)


def test_warmup_twins_keep_each_module_once_and_are_ragged_and_the_script_lists_them():
    served = {module_key(c) for c in GPU_SUITE_CASES if flashinfer_peer.serves(c)}
    twins = warmup_cases(GPU_SUITE_CASES)
    assert [module_key(t) for t in twins] == list(dict.fromkeys(module_key(t) for t in twins))
    assert {module_key(t) for t in twins} == served
    for twin in twins:
        assert len(set(twin.seq_lens)) == 2 and all(n % twin.block_size for n in twin.seq_lens)
    from scripts.flashinfer_warmup import main

    assert main(["cases/gpu_flashinfer.toml", "--list"]) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("twin", warmup_cases(GPU_SUITE_CASES), ids=str)
def test_flashinfer_wrappers_match_the_oracle_on_every_twin(twin):
    pytest.importorskip("flashinfer")
    inputs = case_inputs(twin, "cuda")
    out = inputs.new_out()
    prepared = flashinfer_peer.prepare_flashinfer(twin, inputs, out)
    result = prepared.to_packed(prepared.run())
    expected = paged_attention_oracle(*inputs.args(), **inputs.options)
    graded = grade(result, expected, twin.atol, twin.rtol)
    assert graded.passed, f"{prepared.note}: {graded.reason}"
    assert result.data_ptr() == out.data_ptr()
    assert prepared.plan_us is not None and prepared.plan_us > 0
