"""One registration reaches CLI, case suite and benchmarks; its declarations reach the driver and kernel."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
import torch

import kernels
from harness.backends.builtin import register_backend
from harness.backends.plugins import Limits, case_facts
from harness.backends.registry import REGISTRY, add_remote_backend, contract_prepare
from harness.cases.spec import load_case_file
from harness.cases.variants import VARIANTS
from harness.cli.main import main
from harness.execute.processes import decode, encode, registrations
from harness.run.runner import case_inputs
from kernels import paged_attention_reference
from tests.fresh_python import run_script
from tests.tiny_cases import plugin_run_scope, write_cases

# --- variants: one name each, and the others still taken ------------------------------------------


@pytest.mark.parametrize(
    ("name", "key"),
    [("alibi", "alibi_slopes"), ("alibi_slopes", "alibi_slopes"),  # the case field; the key and keyword
     ("kv_dtype", "fp8_kv"), ("kv_scale", "fp8_kv"), ("k_scale", "fp8_kv"), ("fp8_kv", "fp8_kv"),
     ("logit_softcap", "logit_softcap"), ("cascade", "return_lse"), ("head_dim_v", "head_dim_v")],
)  # fmt: skip
def test_register_backend_and_the_driver_take_a_variant_by_its_case_field_key_or_keyword(name, key, clean_registry):
    assert register_backend("named", paged_attention_reference, variants=(name,)).variants == {key}
    assert add_remote_backend({"name": "remote", "devices": ["cpu"], "variants": [name]}).variants == {key}


def test_harness_variants_prints_each_variants_field_key_and_keywords(capsys):
    assert main(["variants"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for v in VARIANTS:
        (line,) = [line for line in lines if line.split()[:1] == [v.name] and v.key in line]
        assert all(keyword in line for keyword in v.keywords) or (not v.keywords and "none: a shape" in line)
    assert any("[num_kv_heads]" in line for line in lines), "the fp8 scales' shape is said"


def test_options_is_still_taken_for_variants_with_a_deprecation_warning(clean_registry):
    with pytest.warns(DeprecationWarning, match="variants="):
        backend = register_backend("old", paged_attention_reference, options=("alibi", "sliding_window"))
    assert backend.variants == {"alibi_slopes", "sliding_window"}
    with pytest.raises(TypeError, match="variants= only"):
        register_backend("both", paged_attention_reference, variants=("alibi",), options=("alibi",))


# --- the contract's decode form: query_start_loc=None in the default call -------------------------


@pytest.mark.parametrize(("q_lens", "call_form"), [(1, "None"), ([1, 2], "the tensor")])
def test_the_default_call_of_a_decode_case_passes_query_start_loc_none(q_lens, call_form, tmp_path):
    """run() passes query_start_loc; call() passes None where every q_len is 1, the contract's decode form."""
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


# --- limits and the supports hook: skips that name why, decided where the declaration lives ---------

DECLARING_PLUGIN = """
import dataclasses, json, os
from pathlib import Path
import kernels
from harness import register_backend

DIR = Path(os.environ["HARNESS_TEST_DIR"])


def supports(facts):
    with open(DIR / "limited.jsonl", "a") as file:
        file.write(json.dumps({"pid": os.getpid(), **dataclasses.asdict(facts)}) + "\\n")
    return "three sequences or more" if facts.num_seqs >= 3 else None


def limited(q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, scale=None, out=None):
    return kernels.paged_attention_reference(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, out=out)


register_backend("limited", limited, limits={"dtypes": ["float32"], "block_size_multiple_of": 4}, supports=supports)
"""


@pytest.fixture(scope="module")
def plugin_runs(tmp_path_factory) -> dict[str, tuple[pd.DataFrame, list]]:
    """One timed ``harness run``, the plugins' calls in their isolated worker, of DECLARING_PLUGIN's ``limited`` over
    cases inside and outside its limits and one its hook refuses, and of PLANNING_PLUGIN's ``planned`` over a decode,
    a mixed and a cascade case: backend -> (its rows by case, what its hook or its plans logged); the registry as it
    was after it."""
    folder = tmp_path_factory.mktemp("plugins")
    cases = {"limited": [{"name": "inside"}, {"name": "bf16", "dtype": "bfloat16"}, {"name": "block_size_2", "block_size": 2},
                         {"name": "three_seqs", "seq_lens": [3, 9, 4], "q_lens": [1, 2, 1]},
                         {"name": "fp8", "kv_dtype": "float8_e4m3fn", "kv_scale": "amax_per_head"}],
             "planned": [{"name": "decode", "q_lens": 1}, {"name": "mixed"},
                         {"name": "cascade", "layout": "shared_prefix", "cascade": True, "seq_lens": [21, 26]}]}  # fmt: skip
    path = write_cases(folder / "cases.toml", *({**case, "backends": [name]} for name in cases for case in cases[name]))
    argv = ["run", str(path), "--no-progress", "--out", str(folder / "run")]
    for name, plugin in (("limited", DECLARING_PLUGIN), ("planned", PLANNING_PLUGIN)):
        (folder / f"{name}.py").write_text(plugin)
        argv += ["--plugin", str(folder / f"{name}.py"), "--backend", name]
    with plugin_run_scope(folder):
        assert main(argv) == 0
    frame = pd.read_parquet(folder / "run" / "results.parquet")
    logged = {
        name: [json.loads(line) for line in (folder / f"{name}.jsonl").read_text().splitlines()] for name in cases
    }
    return {name: (frame[frame["backend"] == name].set_index("case"), logged[name]) for name in cases}


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("bf16", "limited limits dtypes to float32; the case's is bfloat16"),
        ("block_size_2", "limited limits block_size to multiples of 4; the case's is 2"),
        ("three_seqs", "limited supports(facts): three sequences or more"),
        ("fp8", "limited does not support fp8_kv (it declares: none)"),
    ],
)
def test_a_case_outside_a_plugins_limits_or_its_supports_hook_is_a_skip_naming_why(plugin_runs, case, reason):
    rows, _ = plugin_runs["limited"]
    assert (rows.loc[case, "status"], rows.loc[case, "reason"]) == ("skip", reason)
    assert rows.loc["inside", "status"] == "pass"


def test_plain_limits_are_checked_by_the_driver_and_the_supports_hook_in_the_worker(plugin_runs):
    _, seen = plugin_runs["limited"]
    asked = [facts["num_seqs"] for facts in seen]
    assert sorted(asked) == [2, 3], "the hook saw the cases within the plain limits only, once each"
    assert {facts["pid"] for facts in seen} != {os.getpid()} and len({facts["pid"] for facts in seen}) == 1
    (inside,) = [facts for facts in seen if facts["num_seqs"] == 2]
    assert inside == {**inside, "max_q_len": 2, "num_tokens": 3, "decode": False, "block_size": 4, "dtype": "float32",
                      "kv_dtype": "float32", "kv_scale": "", "variants": [], "device": "cpu", "interpreted": True}  # fmt: skip


def test_a_workers_variant_keys_limits_and_hooks_travel_as_plain_values_and_are_checked(clean_registry):
    register_backend("declares_all", paged_attention_reference, limits=Limits(dtypes=("float16",), cpu_tags=("small",)),
                     supports=lambda facts: None, variants=("alibi", "sliding_window"))  # fmt: skip
    (reported,) = [r for r in registrations() if r["name"] == "declares_all"]
    assert reported["variants"] == ["alibi_slopes", "sliding_window"]
    assert reported["limits"] == {"dtypes": ["float16"], "head_dims": [], "block_size_multiple_of": 1,
                                  "cpu_tags": ["small"]}  # fmt: skip
    assert (reported["supports"], reported["plan"]) == (True, False)
    REGISTRY.pop("declares_all")
    remote = add_remote_backend(decode(encode(reported)))
    assert remote.limits == Limits(dtypes=("float16",), cpu_tags=("small",)) and remote.supports_hook
    for field in ("plan", "supports"):
        with pytest.raises(ValueError, match=f"whose {field} is not a bool"):
            add_remote_backend({"name": "odd", "devices": ["cpu"], field: "yes"})


KNOWN = (*(v.name for v in VARIANTS), "`harness variants` lists them")


@pytest.mark.parametrize(
    ("declared", "words"),
    [
        ({"limits": {"dtype": ["float32"]}}, ["unknown key(s) 'dtype'"]),
        ({"limits": {"dtypes": "float32"}}, ["limits.dtypes must be a list of str"]),
        ({"limits": {"dtypes": ["fp32"]}}, ["limits.dtypes: 'fp32' is not a dtype"]),
        ({"limits": {"head_dims": [64.0]}}, ["limits.head_dims must be a list of int"]),
        ({"limits": {"block_size_multiple_of": 0}}, ["limits.block_size_multiple_of must be a positive int"]),
        ({"limits": {"block_size_multiple_of": True}}, ["limits.block_size_multiple_of must be a positive int"]),
        ({"limits": ["float32"]}, ["limits must be a dict"]),
        # an unknown variant: the closest named, if any is close, and the known ones
        ({"variants": ["sliding_window", "softcap"]},
         ["unknown variant 'softcap' (did you mean 'logit_softcap'?)", *KNOWN]),
        ({"variants": ["sliding_window", "alibi_slope"]},
         ["unknown variant 'alibi_slope' (did you mean 'alibi_slopes'?)", *KNOWN]),
        ({"variants": ["sliding_window", "rope"]}, ["unknown variant 'rope'; a variant", *KNOWN]),
    ],
)  # fmt: skip
def test_a_bad_limit_or_variant_is_refused_where_it_is_declared_and_where_it_arrives(declared, words, clean_registry):
    with pytest.raises(ValueError) as refused:
        register_backend("bad", paged_attention_reference, **declared)
    with pytest.raises(ValueError) as arrived:  # a worker's registration, in the driver
        add_remote_backend({"name": "bad", "devices": ["cpu"], **declared})
    assert all(w in str(e.value) for e in (refused, arrived) for w in words), (refused.value, arrived.value)
    assert "bad" not in REGISTRY


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"q_lens": 1}, {"decode": True, "max_q_len": 1, "variants": ()}),
        ({"kv_dtype": "float8_e5m2"}, {"kv_dtype": "float8_e5m2", "kv_scale": "per_tensor", "variants": ("kv_dtype",)}),
        ({"kv_dtype": "float8_e4m3fn", "kv_scale": 0.5}, {"kv_scale": "per_tensor"}),
        ({"kv_dtype": "float8_e4m3fn", "kv_scale": "amax_per_head"}, {"kv_scale": "per_head"}),
        ({"alibi": True, "sliding_window": 4}, {"variants": ("sliding_window", "alibi")}),
    ],
)
def test_case_facts_say_decode_the_fp8_scales_form_and_the_variants_by_name(fields, expected, tmp_path):
    (case,) = load_case_file(write_cases(tmp_path / "one.toml", {"name": "one", **fields}))
    facts = case_facts(case, "cpu", interpreted=False)
    assert {name: getattr(facts, name) for name in expected} == expected


# --- the plan step: once per input set, outside the timed calls, handed to every call ---------------

PLANNING_PLUGIN = """
import json, os, time
from pathlib import Path
import kernels
from harness import register_backend

DIR = Path(os.environ["HARNESS_TEST_DIR"])
PLAN_S = 0.05


def plan(facts):
    time.sleep(PLAN_S)  # what a plan costs, which no call may be charged for
    with open(DIR / "planned.jsonl", "a") as file:
        file.write(json.dumps({"pid": os.getpid(), "max_q_len": facts.max_q_len}) + "\\n")
    return {"max_q_len": facts.max_q_len}


def planned(q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, scale=None, out=None, *, plan,
            return_lse=False):
    expected = 1 if query_start_loc is None else int((query_start_loc[1:] - query_start_loc[:-1]).max())
    if plan["max_q_len"] != expected:
        raise ValueError(f"handed the plan of another input set: {plan}")
    return kernels.paged_attention_reference(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale,
                                             out=out, return_lse=return_lse)


register_backend("planned", planned, plan=plan, variants=("return_lse",))
"""


def test_a_plan_step_runs_once_per_input_set_in_the_worker_timed_apart_and_every_call_gets_its_result(plugin_runs):
    rows, plans = plugin_runs["planned"]
    assert rows.loc[["decode", "mixed"], "status"].tolist() == ["pass", "pass"], rows["reason"].tolist()
    assert sorted(p["max_q_len"] for p in plans) == [1, 2], "one plan per row, from that case's facts"
    assert os.getpid() not in {p["pid"] for p in plans}
    for case in ("decode", "mixed"):
        assert rows.loc[case, "plan_us"] >= 50_000, "the plan's own time"
        assert rows.loc[case, "latency_us"] < 50_000 and rows.loc[case, "call_us"] < 50_000, "no call pays for it"
    # a cascade case calls the kernel on shapes other than the case's: a skip saying why
    assert rows.loc["cascade", "status"] == "skip"
    assert "plan step is made for the case's own" in rows.loc["cascade", "reason"]


# --- one registration: the CLI, pytest's case suite and the benchmarks all pick it up ------------

TOY = """
import kernels
from harness import register_backend


def toy_paged_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, scale=None, out=None):
    return kernels.paged_attention_reference(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, out=out)


register_backend("toy", toy_paged_attention)
"""


@pytest.mark.slow  # the CLI, the case suite and the benchmarks in fresh interpreters
def test_one_registration_reaches_the_cli_the_case_suite_and_the_benchmarks(tmp_path):
    plugin = tmp_path / "toy.py"
    plugin.write_text(TOY)
    cases = write_cases(tmp_path / "tiny.toml", {"name": "tiny"})
    done = run_script("-m", "harness", "run", str(cases), "--plugin", str(plugin), "--backend", "toy", "--no-timing",
                      "--no-progress", "--out", str(tmp_path / "run"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "toy" in done.stdout
    # one collection of both suites: each has its own conftest that loads the harness's pytest plugin
    collected = run_script("-m", "pytest", "tests/harness/test_case_suite.py", "benchmarks", "--plugin", str(plugin),
                           "--collect-only", "-q")  # fmt: skip
    assert collected.returncode == 0, collected.stdout + collected.stderr
    lines = collected.stdout.splitlines()
    for suite in ("tests/harness/test_case_suite.py::", "benchmarks/"):
        toy = [line for line in lines if line.startswith(suite) and line.endswith("-toy]")]
        assert toy, (suite, collected.stdout[-2000:])
