"""What a plugin declares beside its function reaches the driver and the kernel as it said:
variants by any of their names, limits as plain values, a plan step timed apart, a supports hook
run in the worker, and the contract's decode form in the default call."""

from __future__ import annotations

import pytest
import torch

import kernels
from harness.backends.builtin import register_backend
from harness.backends.registry import REGISTRY, add_remote_backend, contract_prepare
from harness.cases.spec import load_case_file
from harness.cases.variants import VARIANTS
from harness.cli.main import main
from harness.execute.processes import registrations
from harness.run.runner import case_inputs
from kernels import paged_attention_reference
from tests.tiny_cases import write_cases

# --- variants: one name each, and the others still taken ------------------------------------------


@pytest.mark.parametrize(
    ("name", "capability"),
    [
        ("alibi", "alibi_slopes"),  # the case field
        ("alibi_slopes", "alibi_slopes"),  # the capability and keyword
        ("kv_dtype", "fp8_kv"),
        ("kv_scale", "fp8_kv"),
        ("k_scale", "fp8_kv"),
        ("fp8_kv", "fp8_kv"),
        ("logit_softcap", "logit_softcap"),
        ("cascade", "return_lse"),
        ("head_dim_v", "head_dim_v"),
    ],
)
def test_register_backend_takes_a_variant_by_its_case_field_capability_or_keyword(name, capability, clean_registry):
    backend = register_backend("named", paged_attention_reference, options=(name,))
    assert backend.options == {capability}


@pytest.mark.parametrize(("name", "suggested"), [("softcap", "logit_softcap"), ("alibi_slope", "alibi_slopes"),
                                                 ("rope", None)])  # fmt: skip
def test_an_unknown_variant_name_is_refused_naming_the_closest_and_the_known_ones(name, suggested, clean_registry):
    with pytest.raises(ValueError, match=f"unknown variant '{name}'") as refused:
        register_backend("named", paged_attention_reference, options=("sliding_window", name))
    message = str(refused.value)
    assert (f"did you mean '{suggested}'" in message) if suggested else ("did you mean" not in message)
    assert all(v.name in message for v in VARIANTS) and "harness variants" in message
    assert "named" not in REGISTRY


def test_the_driver_takes_a_workers_variant_names_as_register_backend_does(clean_registry):
    backend = add_remote_backend({"name": "remote", "devices": ["cpu"], "options": ["alibi", "kv_dtype"]})
    assert backend.options == {"alibi_slopes", "fp8_kv"}
    with pytest.raises(ValueError, match="unknown variant 'softcap'"):
        add_remote_backend({"name": "remote2", "devices": ["cpu"], "options": ["softcap"]})


def test_harness_variants_prints_each_variants_field_capability_and_keywords(capsys):
    assert main(["variants"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for v in VARIANTS:
        (line,) = [line for line in lines if line.split()[:1] == [v.name] and v.capability in line]
        assert all(keyword in line for keyword in v.keywords) or (not v.keywords and "none: a shape" in line)
    assert any("[num_kv_heads]" in line for line in lines), "the fp8 scales' shape is said"


def test_a_workers_registration_carries_its_variants_as_capabilities(clean_registry):
    register_backend("declares", paged_attention_reference, options=("alibi", "sliding_window"))
    (reported,) = [r for r in registrations() if r["name"] == "declares"]
    assert reported["options"] == ["alibi_slopes", "sliding_window"]


# --- the contract's decode form: query_start_loc=None in the default call -------------------------


@pytest.mark.parametrize(("q_lens", "call_form"), [(1, "None"), ([1, 2], "the tensor")])
def test_the_default_call_of_a_decode_case_passes_query_start_loc_none(q_lens, call_form, tmp_path):
    """run() (graded, then timed for latency) passes the tensor; call() (the user's default call, timed and
    graded with every call sample) passes None where every q_len is 1, the contract's decode form."""
    seen = []

    def kernel(q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, scale=None, out=None):
        seen.append("None" if query_start_loc is None else "the tensor")
        return paged_attention_reference(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, out=out)

    (case,) = load_case_file(write_cases(tmp_path / "one.toml", {"name": "one", "q_lens": q_lens}))
    inputs = case_inputs(case, "cpu")
    prepared = contract_prepare(kernel)(case, inputs, inputs.new_out())
    ran, called = prepared.run().clone(), prepared.call()
    assert seen == ["the tensor", call_form]
    assert torch.equal(ran, called)


@pytest.mark.parametrize("name", ["reference", "tlsim", "triton"])
def test_every_built_in_kernel_takes_the_decode_form_of_its_default_call(name, tmp_path):
    if name == "triton" and (reason := kernels.triton_unavailable_reason("cpu")):
        pytest.skip(reason)
    (case,) = load_case_file(write_cases(tmp_path / "one.toml", {"name": "one", "q_lens": 1, "seq_lens": [3, 9, 17]}))
    inputs = case_inputs(case, "cpu")
    prepared = REGISTRY[name].prepare(case, inputs, inputs.new_out())
    torch.testing.assert_close(prepared.call(), prepared.run(), atol=case.atol, rtol=case.rtol)
