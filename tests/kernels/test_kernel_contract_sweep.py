"""Property: anywhere in the contract's declared ranges, tlsim and the Triton kernel match the float64 oracle.

Head dims, block sizes, q and cache dtypes, GQA groups, lengths and a max_seq_len hint drawn from the
declarations (test_kernel_contract_edges.py runs their edges); a few examples, many under ``nox -s fuzz``:

    KERNEL_SWEEP_EXAMPLES=200 TRITON_INTERPRET=1 python -m pytest tests/kernels/test_kernel_contract_sweep.py"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import kernels
from harness.cases.inputs import make_inputs
from harness.cases.vocab import DEFAULT_TOLERANCES
from harness.run.oracle import paged_attention_oracle
from kernels.contract import MAX_HEAD_DIM, MIN_HEAD_DIM
from kernels.fp8 import FP8_DTYPES
from tests.kernels.kernel_cases import assert_passes

EXAMPLES = int(os.environ.get("KERNEL_SWEEP_EXAMPLES", "3"))


@st.composite
def calls(draw) -> dict:
    """make_inputs keywords and a max_seq_len hint, drawn from the contract's ranges."""
    seq_lens = draw(st.lists(st.integers(1, 300), min_size=1, max_size=3))
    dtype = draw(st.sampled_from(["float32", "float16", "bfloat16"]))
    kv_dtype = draw(st.sampled_from([None, *(str(d).removeprefix("torch.") for d in FP8_DTYPES)]))
    num_kv_heads, group = draw(st.integers(1, 2)), draw(st.integers(1, 8))
    fields = {
        "num_q_heads": num_kv_heads * group,
        "num_kv_heads": num_kv_heads,
        "head_dim": draw(st.integers(MIN_HEAD_DIM, MAX_HEAD_DIM)),
        "head_dim_v": draw(st.integers(MIN_HEAD_DIM, MAX_HEAD_DIM)),
        "block_size": draw(st.integers(1, 256)),
        "seq_lens": seq_lens,
        "q_lens": [draw(st.integers(0, min(4, n))) for n in seq_lens],
        "dtype": dtype,
        "seed": draw(st.integers(0, 2**16)),
    }
    if kv_dtype:
        fields |= {"kv_dtype": kv_dtype, "kv_scale": draw(st.sampled_from(["amax", "amax_per_head"]))}
    capacity = -(-max(seq_lens) // fields["block_size"]) * fields["block_size"]
    return {"fields": fields, "max_seq_len": draw(st.integers(1, capacity))}


@pytest.mark.interpreter
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=EXAMPLES <= 3)
@given(call=calls())
def test_tlsim_and_the_kernel_match_the_oracle_anywhere_in_the_contracts_ranges(call: dict):
    note(repr(call))
    inputs = make_inputs(**call["fields"])
    expected = paged_attention_oracle(*inputs.args(), **inputs.options)
    hints = {"max_q_len": max(call["fields"]["q_lens"]), "max_seq_len": call["max_seq_len"]}
    backends = ["tlsim"] if kernels.triton_unavailable_reason("cpu") else ["tlsim", "triton"]
    for backend in backends:
        got = getattr(kernels, f"paged_attention_{backend}")(*inputs.args(), **hints, **inputs.options)
        assert_passes(got, expected, DEFAULT_TOLERANCES[call["fields"]["dtype"]], backend)
