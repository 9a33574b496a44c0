"""A backend cannot pass by mutating its inputs, returning the wrong dtype, or exiting; tolerance 0 works."""

from __future__ import annotations

import math
import re
import sys

import pytest
import torch

import kernels
from harness import register_backend
from harness.cases.inputs import make_inputs
from harness.cli.main import main
from harness.run import grading, guard, oracle
from harness.run.grading import forward_error_bound, grade
from harness.run.guard import device_digest, fingerprint
from harness.run.oracle import paged_attention_oracle
from tests.tiny_cases import write_cases

pytestmark = pytest.mark.usefixtures("clean_registry")  # backends registered here vanish after each test


MUTATIONS = {
    "k_cache": lambda **a: a["k_cache"].mul_(2),
    "q": lambda **a: a["q"].add_(1),
    "block_table": lambda **a: a["block_table"].fill_(0),
    "seq_lens": lambda **a: a["seq_lens"].sub_(1),
    "query_start_loc": lambda **a: a["query_start_loc"][1:].fill_(0),
    "v_cache": lambda **a: a["v_cache"][0, 0, 0, 0].fill_(3.0),  # one element, a NaN slot turned finite
}


@pytest.mark.parametrize(("name", "timed"), [*((name, False) for name in MUTATIONS), ("k_cache", True)])
def test_a_backend_that_mutates_an_input_fails_and_the_next_sees_pristine_inputs(case_file, name, timed, run_rows):
    calls = []

    def mutator(q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, scale=None, out=None):
        result = kernels.paged_attention_tlsim(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, out)
        calls.append(1)
        if not timed or len(calls) > 1:  # timed: from the second call on, while timed only
            MUTATIONS[name](q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, seq_lens=seq_lens,
                            query_start_loc=query_start_loc)  # fmt: skip
        return result

    register_backend("mutator", mutator)
    rows = run_rows(case_file, ["mutator", "tlsim", "reference"], timing=timed)
    assert rows.loc["mutator", "status"] == "fail"
    assert f"mutated its input {name}{' while timed' * timed}" in rows.loc["mutator", "reason"]
    assert (rows.loc[["tlsim", "reference"], "status"] == "pass").all(), rows["reason"].tolist()


def _raise(error):
    raise error


# backend -> (a kernel returning an output unlike q's or exiting, its row's status, its reason)
OUTPUTS = {
    "float64_result": (lambda *a, out=None: paged_attention_oracle(*a), "fail", r"dtype float64, expected q's float32"),
    "wrong_shape": (lambda *a, out=None: kernels.paged_attention_tlsim(*a)[:, None], "fail", r"shape \(3, 1, 4, 32\)"),
    "returns_none": (lambda *a, **k: None, "fail", r"not a tensor"),
    "exits": (lambda *a, **k: sys.exit(0), "error", r"^SystemExit"),
    "interrupts": (lambda *a, **k: _raise(KeyboardInterrupt), "error", r"^KeyboardInterrupt"),
}  # fmt: skip


@pytest.mark.parametrize("name", OUTPUTS)
def test_an_output_unlike_qs_or_an_exit_from_a_backend_is_its_row_and_the_next_one_passes(case_file, run_rows, name):
    kernel, status, reason = OUTPUTS[name]
    register_backend(name, kernel)
    rows = run_rows(case_file, [name, "tlsim"])
    assert rows.loc[name, "status"] == status
    assert re.search(reason, rows.loc[name, "reason"]), rows.loc[name, "reason"]
    assert rows.loc["tlsim", "status"] == "pass"


def test_the_users_ctrl_c_still_stops_the_run(case_file, run_rows):
    def users_ctrl_c(*args, **kwargs):
        guard.USER_INTERRUPT.set()  # what the SIGINT handler does before raising
        raise KeyboardInterrupt

    register_backend("users_ctrl_c", users_ctrl_c)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_rows(case_file, ["users_ctrl_c", "tlsim"])
    finally:
        guard.USER_INTERRUPT.clear()


@pytest.mark.parametrize(
    ("offset", "atol", "rtol", "passed", "tol_ratio"),
    [
        ([5e-5, 0.0, 4e-6], 1e-5, 1e-4, True, 5e-5 / (1e-5 + 1e-4)),  # the largest err / (atol + rtol |expected|)
        (1e-3, 1e-5, 1e-4, False, 1e-3 / 1e-5),
        (0.0, 0.0, 0.0, True, 0.0),  # tolerance zero: exact output passes, its ratio finite
        (1e-9, 0.0, 0.0, False, math.inf),
    ],
)
def test_tol_ratio_is_the_margin_to_tolerance_tolerance_0_passes_exact_output(offset, atol, rtol, passed, tol_ratio):
    expected = torch.tensor([1.0, -2.0, 0.0], dtype=torch.float64)
    result = grade(expected + torch.tensor(offset, dtype=torch.float64), expected, atol=atol, rtol=rtol)
    assert result.passed == passed and result.tol_ratio == pytest.approx(tol_ratio)


def test_tolerance_zero_run_exits_0_when_every_row_is_exact(tmp_path, capsys):
    """One key per sequence: the output is v exactly, so tol_ratio is 0 / 0 everywhere, and the run still exits 0."""
    zero = {"atol": 0.0, "rtol": 0.0}
    path = write_cases(tmp_path / "zero.toml", {"name": "tiny", "seq_lens": [1, 1], "q_lens": [1, 1],
                                                "tolerance": {"float32": zero}})  # fmt: skip
    out = tmp_path / "run"
    assert main(["run", str(path), "--out", str(out), "--backend", "tlsim", "--backend", "reference",
                 "--no-progress", "--no-timing"]) == 0  # fmt: skip
    assert out.is_dir()
    assert "closest to its tolerance: " in capsys.readouterr().out


def test_error_bound_covers_real_round_off_and_flags_tolerances_below_it():
    atol, rtol = 1e-5, 1e-4
    for scale in (1.0, 3.0, 8.0):
        inputs = make_inputs(num_q_heads=8, num_kv_heads=2, head_dim=128, block_size=16, seq_lens=[300, 77, 1000],
                             q_lens=[3, 1, 2], dtype="float32", input_scale=scale, seed=0)  # fmt: skip
        expected = paged_attention_oracle(*inputs.args())
        bound = forward_error_bound(*inputs.args(), expected)
        reference = kernels.paged_attention_reference(*inputs.args())
        tlsim = kernels.paged_attention_tlsim(*inputs.args())
        # the last: the exact result rounded to q's dtype, the best any kernel can do
        for name, output in zip(("reference", "tlsim", "exact"), (reference, tlsim, expected.float()), strict=True):
            err = (output.double() - expected).abs()
            assert bool((err <= bound).all()), f"{name} beyond the bound at input_scale {scale}"
        result = grade(reference, expected, atol, rtol, bound)
        assert result.error_bound == float(bound.max())
        if scale == 1.0:
            assert result.bound_ratio < 1 and result.grading_note == ""
        else:  # gather + SDPA lands at 1.14x the fp32 tolerance at input scale 3: the input's round-off
            assert result.bound_ratio > 1
            assert "tolerance below the input's own round-off: grades the input" in result.grading_note


def test_rows_carry_error_bound_and_grading_note(case_file, tmp_path, run_rows):
    path = write_cases(tmp_path / "big.toml", {"name": "tiny", "head_dim": 128, "input_scale": 6.0})
    rows = run_rows(path, ["reference"])
    assert rows.loc["reference", "error_bound"] > 0
    assert "grades the input" in rows.loc["reference", "grading_note"]
    rows = run_rows(case_file, ["reference"])
    assert rows.loc["reference", "grading_note"] == "" and rows.loc["reference", "error_bound"] > 0


def test_fingerprints_see_one_changed_element_and_a_swap_on_either_path():
    pool = torch.full((64, 16, 2, 32), float("nan"))
    pool[:40] = torch.randn(40, 16, 2, 32)
    changed = pool.clone()
    changed[3, 4, 1, 7] += 1e-6
    swapped = pool.clone()
    swapped[[0, 1]] = pool[[1, 0]]
    for other, same in ((pool.clone(), True), (changed, False), (swapped, False)):  # NaN slots compare equal
        assert (fingerprint(other) == fingerprint(pool)) == same
        on_device = [device_digest(t.reshape(-1).view(torch.uint8)) for t in (pool, other)]  # the one used for CUDA
        assert (on_device[0] == on_device[1]) == same


def test_the_oracle_and_the_error_bound_in_chunks_of_query_rows_are_the_same(monkeypatch):
    inputs = make_inputs(num_q_heads=8, num_kv_heads=2, head_dim=64, block_size=16, seq_lens=[300, 500],
                         q_lens=[40, 300], input_scale=3.0, seed=3)  # fmt: skip
    expected = paged_attention_oracle(*inputs.args())
    whole = forward_error_bound(*inputs.args(), expected)
    monkeypatch.setattr(oracle, "CHUNK_BYTES", 8 * 8 * 500 * 2)  # two query rows a chunk
    monkeypatch.setattr(grading, "BOUND_CHUNK_ELEMENTS", 5000)  # a few query rows a chunk
    chunked = paged_attention_oracle(*inputs.args())
    assert (chunked - expected).abs().max() < 1e-12, "float64 reassociation only; a misplaced row is O(1)"
    assert torch.allclose(forward_error_bound(*inputs.args(), expected), whole, rtol=1e-12, atol=0)
