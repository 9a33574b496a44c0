"""Property: reference, tlsim and Triton match the oracle over the case space (HARNESS_HYPOTHESIS_EXAMPLES)."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

import kernels
from harness.cases.spec import expand_spec
from harness.cases.vocab import DTYPE_NAMES, LAYOUTS
from harness.run.grading import grade
from harness.run.runner import build_context
from tests.tiny_cases import case_file_text

EXAMPLES = int(os.environ.get("HARNESS_HYPOTHESIS_EXAMPLES", "30"))
GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
TRITON_EXAMPLES = int(os.environ.get("HARNESS_HYPOTHESIS_TRITON_EXAMPLES", str(EXAMPLES if GPU else 8)))


@st.composite
def case_tables(draw, max_seq_len: int = 300, max_head_dim: int = 256) -> dict:
    """One [[case]] table, as a case file would hold it."""
    num_kv_heads = draw(st.integers(1, 4))
    group = draw(st.sampled_from([1, 2, 3, 4, 6, 8]))
    seq_lens = draw(st.lists(st.integers(1, max_seq_len), min_size=1, max_size=4))
    q_lens = [draw(st.integers(0, min(8, n))) for n in seq_lens]
    return {
        "name": "hypothesis",
        "num_q_heads": num_kv_heads * group,
        "num_kv_heads": num_kv_heads,
        "head_dim": draw(st.integers(32, max_head_dim)),
        "block_size": draw(st.sampled_from([1, 2, 3, 5, 8, 16, 17, 32, 64, 128, 256])),
        "seq_lens": seq_lens,
        "q_lens": q_lens,
        "layout": draw(st.sampled_from(LAYOUTS)),
        "dtype": draw(st.sampled_from(DTYPE_NAMES)),
        "input_scale": draw(st.floats(0.1, 4.0).map(lambda x: round(x, 2))),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


@settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(table=case_tables())
def test_reference_and_tlsim_match_the_oracle_anywhere_in_the_case_space(table):
    note(f"failing case, as a case file:\n{case_file_text(table, defaults={})}")
    (case,) = expand_spec(table, "hypothesis")
    ctx = build_context(case, "cpu", "cpu")
    for name, kernel in (("reference", kernels.paged_attention_reference), ("tlsim", kernels.paged_attention_tlsim)):
        _assert_graded(name, kernel(*ctx.inputs.args(), out=torch.full_like(ctx.inputs.q, float("nan"))), ctx)


def _assert_graded(name: str, out: torch.Tensor, ctx) -> None:
    """``out`` passes, or (tolerance below the inputs' round-off) holds no NaN and lies within the error bound."""
    case = ctx.case
    result = grade(out, ctx.expected, case.atol, case.rtol, ctx.bound)
    if result.passed:
        return
    assert result.grading_note, f"{name}: {result.reason} (tol_ratio {result.tol_ratio:.2f})"
    event(f"tolerance below round-off ({case.dtype})")
    assert result.nan_count == 0, f"{name}: {result.reason}"
    within = (out.double() - ctx.expected.to(out.device)).abs() <= ctx.bound.to(out.device)
    assert bool(within.all()), f"{name}: beyond the forward error bound too: {result.reason}"


@st.composite
def windowed_case_tables(draw) -> dict:
    """A Triton case table (interpreter-sized on a CPU) whose window often starts on or one off a tile boundary."""
    table = draw(case_tables(300, 256) if GPU else case_tables(160, 128))
    kind = draw(st.sampled_from(["none", "tile_edge", "any"]))
    last_pos = table["seq_lens"][0] - 1
    if kind == "tile_edge":
        first_key = draw(st.sampled_from([63, 64, 65, 127, 128, 129]))
        if first_key <= last_pos:
            table["sliding_window"] = last_pos - first_key + 1
    elif kind == "any":
        table["sliding_window"] = draw(st.integers(1, 320))
    return table


@settings(max_examples=TRITON_EXAMPLES, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(table=windowed_case_tables())
def test_the_triton_kernel_matches_the_oracle_anywhere_in_the_case_space(table):
    if reason := kernels.triton_unavailable_reason(DEVICE):
        pytest.skip(reason)
    note(f"failing case, as a case file:\n{case_file_text(table, defaults={})}")
    (case,) = expand_spec(table, "hypothesis")
    ctx = build_context(case, DEVICE, DEVICE)
    event(f"window: {'sliding_window' in table}")
    # The hints an engine passes (as the harness's triton backend does): they pick the tiles and the split.
    out = kernels.paged_attention_triton(
        *ctx.inputs.args(), out=torch.full_like(ctx.inputs.q, float("nan")), max_q_len=max(case.q_lens),
        max_seq_len=case.max_seq_len, **ctx.inputs.options,
    )  # fmt: skip
    _assert_graded("triton", out, ctx)
