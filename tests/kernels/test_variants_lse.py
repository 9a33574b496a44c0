"""return_lse: lse = ln(S + sum_j exp(l_j)) (docs/contract.md "The log-sum-exp"), and the cascade it allows.

Every built-in backend matches the oracle's lse, single-pass and split; a wrong lse fails the grade; two
partial attentions merged by their lse equal the whole; the harness grades lse where a case asks."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

import kernels
from harness.backends.registry import Backend, contract_prepare
from harness.cases.spec import CaseFileError, expand_spec
from harness.run.grading import grade
from harness.run.oracle import paged_attention_oracle
from harness.run.runner import case_inputs
from kernels.cascade import cascade_attention, merge_attention_states
from tests.kernels.kernel_cases import assert_passes, backend_fn, backend_grid, graded_inputs, run_backend
from tests.kernels.variant_cases import BY_NAME, VariantCase, graded_rows, tolerance

LSE_CASES = [
    BY_NAME[name]
    for name in ("window1_decode", "window5_spec_verify", "window_split_kv_decode", "sinks_extreme",
                 "sinks_split_kv", "sinks_float16", "all_four_spec_verify", "all_four_split_kv", "softcap_bfloat16")
]  # fmt: skip


@pytest.mark.parametrize(("case", "backend"), backend_grid(LSE_CASES))
def test_backend_lse_matches_oracle(case: VariantCase, backend: str):
    inputs, expected = graded_inputs(case, return_lse=True)
    result, lse = run_backend(backend, inputs, return_lse=True, **case.kwargs())
    assert lse.dtype == torch.float32 and lse.shape == inputs.q.shape[:2]
    assert_passes((result, lse), expected, tolerance(case), f"{backend} on {case}")


def test_lse_is_the_log_of_the_denominator_by_hand():
    """One query, three keys, a sink: lse = ln(e^z0 + e^z1 + e^z2 + e^sink), natural log, scaled logits."""
    q = torch.zeros(1, 1, 32)
    q[0, 0, 0] = 1.0
    keys = torch.zeros(3, 1, 32)
    keys[:, 0, 0] = torch.tensor([0.0, 2.0, -1.0])
    k_cache = keys.view(1, 3, 1, 32)
    table, lens = torch.zeros(1, 1, dtype=torch.int32), torch.tensor([3], dtype=torch.int32)
    sinks = torch.tensor([0.5])
    z = torch.tensor([0.0, 2.0, -1.0]) * 0.5
    by_hand = math.log(float(z.exp().sum()) + math.exp(0.5))
    for name in ("reference", "tlsim", "triton"):
        _, lse = backend_fn(name)(q, k_cache, k_cache, table, lens, None, 0.5, sinks=sinks, return_lse=True)
        assert abs(float(lse) - by_hand) < 1e-6, name


# Mutants, each a wrong lse that fails the grade, from tlsim's (scale, keywords) -> lse and the case's keywords.
WRONG_LSE = {
    "lse_without_the_sink": lambda tlsim, kw: tlsim(None, {k: v for k, v in kw.items() if k != "sinks"}),
    "lse_in_base_two": lambda tlsim, kw: tlsim(None, kw) / math.log(2),
    "lse_of_unscaled_logits": lambda tlsim, kw: tlsim(1.0, kw),  # ln sum exp(q . k): scale 1
}


@pytest.mark.parametrize("mutant", WRONG_LSE)
def test_oracle_catches_a_wrong_lse(mutant):
    case = BY_NAME["sinks_split_kv"]
    inputs, (_, expected_lse) = graded_inputs(case, return_lse=True)

    def tlsim(scale, kw):
        return kernels.paged_attention_tlsim(*inputs.args(), scale, return_lse=True, **kw)[1]

    assert not grade(WRONG_LSE[mutant](tlsim, case.kwargs()), expected_lse, *tolerance(case)).passed


# --- merging partial attentions ----------------------------------------------------------------


@pytest.mark.parametrize("backend", ["reference", "tlsim", "triton"])
def test_merge_of_two_partial_attentions_is_the_whole(backend):
    """Decode (every key visible) over keys [0, 32) and [32, seq_len) separately, then merged."""
    fn = backend_fn(backend)
    sinks_split_kv = BY_NAME["sinks_split_kv"]
    case = VariantCase("merge", replace(sinks_split_kv.base, seq_lens=(2500, 700, 40)), sinks_split_kv.options)
    inputs, (expected, expected_lse) = graded_inputs(case, return_lse=True)
    q, k_cache, v_cache, table, lens = inputs.args()[:5]
    head_table, tail_table = table[:, :2].contiguous(), table[:, 2:].contiguous()  # cut at logical block 2
    head_lens = lens.clamp(max=2 * k_cache.shape[1])
    tail_lens = lens - head_lens
    assert bool((tail_lens > 0).all())
    kw = case.kwargs()
    out_a, lse_a = fn(q, k_cache, v_cache, head_table, head_lens, None, return_lse=True, **kw)
    out_b, lse_b = fn(q, k_cache, v_cache, tail_table, tail_lens, None, return_lse=True)  # the sink once
    assert_passes(merge_attention_states(out_a, lse_a, out_b, lse_b), (expected, expected_lse), tolerance(case))
    wrong, _ = merge_attention_states(out_a, lse_b, out_b, lse_a)  # weights swapped
    assert not grade(wrong, expected, *tolerance(case)).passed


def test_merge_weighs_a_part_with_no_key_zero():
    out_a, out_b = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    lse_b = torch.randn(3, 2)
    merged, lse = merge_attention_states(out_a, torch.full((3, 2), float("-inf")), out_b, lse_b)
    assert torch.equal(merged, out_b) and torch.equal(lse, lse_b)


CASCADE_SPEC = {"name": "c", "num_q_heads": 8, "num_kv_heads": 2, "head_dim": 64, "block_size": 16,
                "seq_lens": [45, 72, 39, 52], "q_lens": [1, 5, 1, 3], "layout": "shared_prefix", "seed": 3,
                "tags": ["small"]}  # fmt: skip


@pytest.mark.parametrize("backend", ["reference", "tlsim", "triton"])
@pytest.mark.parametrize(
    "variants", [{}, {"sinks": {"scale": 2.0}, "logit_softcap": 5.0}], ids=["plain", "sinks_softcap"]
)
def test_cascade_equals_the_whole_attention(backend, variants):
    """Shared prefix of 2 blocks (32 keys) + each sequence's rest, merged by lse == the oracle of the whole."""
    fn = backend_fn(backend)
    (case,) = expand_spec({**CASCADE_SPEC, **variants, "return_lse": True}, "t.toml")
    inputs = case_inputs(case, "cpu")
    options = {k: v for k, v in inputs.options.items() if k != "return_lse"}
    assert case.prefix_blocks == 2
    expected = paged_attention_oracle(*inputs.args(), return_lse=True, **options)
    assert_passes(
        cascade_attention(fn, *inputs.args(), case.prefix_blocks, **options), expected, (case.atol, case.rtol)
    )


def test_cascade_refuses_positional_options():
    (case,) = expand_spec(CASCADE_SPEC, "t.toml")
    inputs = case_inputs(case, "cpu")
    with pytest.raises(ValueError, match="sliding_window and alibi_slopes"):
        cascade_attention(kernels.paged_attention_tlsim, *inputs.args(), 2, sliding_window=8)


# --- the harness grades lse ---------------------------------------------------------------------


def test_harness_fails_a_backend_whose_lse_is_wrong(monkeypatch):
    def off_by_one(*args, **kwargs):
        out, lse = kernels.paged_attention_tlsim(*args, **kwargs)
        return out, lse + 0.01

    (case,) = expand_spec({**CASCADE_SPEC, "name": "lse", "return_lse": True}, "t.toml")
    bad = Backend("bad_lse", contract_prepare(off_by_one), ("cpu",), "plugin", variants=frozenset({"return_lse"}))
    only_out = Backend("only_out", contract_prepare(lambda *a, **k: kernels.paged_attention_tlsim(*a, **k)[0]),
                       ("cpu",), "plugin", variants=frozenset({"return_lse"}))  # fmt: skip
    rows = graded_rows(case, bad, only_out)
    assert rows.loc["bad_lse", "status"] == "fail" and rows.loc["bad_lse", "reason"].startswith("lse:")
    assert rows.loc["only_out", "status"] == "fail" and "not a tuple (out, lse)" in rows.loc["only_out", "reason"]


def test_harness_runs_a_cascade_case():
    (case,) = expand_spec({**CASCADE_SPEC, "name": "cascade", "cascade": True}, "t.toml")
    rows = graded_rows(case, "reference", "tlsim")
    for name in ("reference", "tlsim"):
        assert rows.loc[name, "status"] == "pass", rows.loc[name, "reason"]
        assert "cascade: 2 shared blocks" in rows.loc[name, "note"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"layout": "shuffled"}, "needs layout = 'shared_prefix'"),
        ({"sliding_window": 4}, "cannot take sliding_window or alibi"),
        ({"seq_lens": [48, 72, 50, 52], "q_lens": [1, 5, 1, 3]}, "sequence 0 (seq_len 48, q_len 1)"),
        ({"seq_lens": [45], "q_lens": [1]}, "two or more sequences"),
    ],
)
def test_bad_cascade_case_is_refused_naming_the_field(changes, message):
    with pytest.raises(CaseFileError, match=rf"field 'cascade'.*{message.replace('(', '.').replace(')', '.')}"):
        expand_spec({**CASCADE_SPEC, "cascade": True, **changes}, "t.toml")
