"""The attention variants (docs/contract.md, "Attention variants"): sliding_window, logit_softcap, sinks, alibi_slopes.

Every built-in backend matches the oracle with each and all at once; tlsim predicts the kernel; the window
skips the tiles it cannot see; a wrong definition of each fails the grade; a backend lacking an option is a
skip naming it; and a row of harness.cases.variants is all a new variant needs."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch
from pydantic import Field

import kernels
from harness.backends.builtin import REGISTRY
from harness.backends.registry import Backend, contract_prepare
from harness.cases.inputs import make_inputs
from harness.cases.spec import CaseFileError, expand_spec
from harness.cases.variants import VARIANT_KEYS, VARIANTS, OracleHook, Variant, standard_alibi_slopes, with_options
from harness.cases.vocab import DEFAULT_TOLERANCES, Float
from harness.run.grading import grade
from harness.run.oracle import paged_attention_oracle
from harness.run.runner import case_inputs
from kernels import tlsim
from kernels.contract import prepare_call
from kernels.reference import gather_kv
from kernels.tiling import tiling_for, window_tile_start
from tests.kernels.kernel_cases import (
    CASES_BY_NAME,
    assert_passes,
    assert_tlsim_close,
    backend_fn,
    backend_grid,
    graded_inputs,
    needs_triton,
    run_backend,
)
from tests.kernels.variant_cases import BY_NAME, ORACLE_ONLY, VARIANT_CASES, VariantCase, graded_rows, tolerance
from tests.tiny_cases import TINY


@pytest.mark.parametrize(("case", "backend"), backend_grid(VARIANT_CASES))
def test_backend_matches_oracle_with_the_variant(case: VariantCase, backend: str):
    """Triton's rows also hold tlsim to the bound of tests/kernels/test_tlsim_predicts_triton.py (but ORACLE_ONLY)."""
    inputs, expected = graded_inputs(case)
    result = run_backend(backend, inputs, **case.kwargs())
    assert_passes(result, expected, tolerance(case), f"{backend} on {case}")
    if backend == "triton" and case.name not in ORACLE_ONLY:
        sim = kernels.paged_attention_tlsim(*inputs.args(), **case.kwargs())
        assert_tlsim_close(sim, result, inputs.q.dtype, what=str(case))


# --- the window: the tiles it cannot see go unread, and the KV split follows it --------------------


def _poison_before(inputs, first_seen: list[int], block_size: int):
    """A copy of the pools with every slot of sequence s before position first_seen[s] set to NaN."""
    k, v = inputs.k_cache.clone(), inputs.v_cache.clone()
    for seq, first in enumerate(first_seen):
        pos = torch.arange(first)
        blocks = inputs.block_table[seq, pos // block_size].long()
        k[blocks, pos % block_size] = float("nan")
        v[blocks, pos % block_size] = float("nan")
    return k, v


@pytest.mark.parametrize("fn_name", ["tlsim", "triton"])
@pytest.mark.parametrize(("seq_lens", "window"), [((2500, 2400), 100), ((2500, 2400), 1100), ((4000, 3900), 1500)])
def test_window_reads_no_tile_before_the_first_visible_one_and_splits_from_it(fn_name, seq_lens, window):
    """Decode: every key before the window's first tile is NaN; 100 does not split, the wider windows' keys are
    cut in 2 splits that start at that tile (of 576 keys under 1100, of 768 under 1500). Output and lse match the
    oracle."""
    base = replace(CASES_BY_NAME["split_kv_decode"], seq_lens=seq_lens, q_lens=(1, 1))
    fn, inputs = backend_fn(fn_name), base.inputs()
    tiling = tiling_for(prepare_call(*inputs.args(), sliding_window=window))
    assert tiling.NUM_SPLITS == 1 if window == 100 else (tiling.NUM_SPLITS == 2 and window > tiling.SPLIT_SIZE)
    # tlsim walks from the earliest tile any sequence needs; the kernel per program.
    first = [int(window_tile_start(n - 1, window, tiling.TILE_N)) for n in base.seq_lens]
    if fn_name == "tlsim":
        first = [min(first)] * len(first)
    k, v = _poison_before(inputs, first, base.block_size)
    assert bool(k.isnan().any())
    result = fn(inputs.q, k, v, *inputs.args()[3:], sliding_window=window, return_lse=True)
    expected = paged_attention_oracle(*inputs.args(), sliding_window=window, return_lse=True)
    assert_passes(result, expected, (1e-5, 1e-4), f"{fn_name} read a tile before the window:")


def test_window_tile_start_worked_example():
    assert window_tile_start(1000, 100, 64) == 896  # 901 // 64 * 64
    assert window_tile_start(50, 100, 64) == 0
    assert window_tile_start(torch.tensor([1000, 63]), 64, 64).tolist() == [896, 0]


def _long_decode_call(window: int | None, seq_len: int = 131072):
    """4 x 128k decode at 32 / 8 heads (Mistral-7B-shaped), shapes only: the pools hold one block."""
    q = torch.zeros(4, 32, 128, dtype=torch.bfloat16)
    pool = torch.zeros(1, 16, 8, 128, dtype=torch.bfloat16)
    table = torch.zeros(4, seq_len // 16, dtype=torch.int32)
    lens = torch.full((4,), seq_len, dtype=torch.int32)
    return prepare_call(q, pool, pool, table, lens, sliding_window=window, check=False)


def test_windowed_128k_decode_splits_like_a_decode_of_the_window():
    """The keys a program walks are bounded by W + the longest q_len: every split shares the window's work."""
    windowed, plain = tiling_for(_long_decode_call(4096)), tiling_for(_long_decode_call(None))
    short = tiling_for(_long_decode_call(None, seq_len=4096 + 16))  # a plain decode of about W keys
    assert plain.SPLIT_SIZE * plain.NUM_SPLITS >= 131072
    assert (windowed.NUM_SPLITS, windowed.SPLIT_SIZE) == (short.NUM_SPLITS, short.SPLIT_SIZE)
    assert windowed.SPLIT_SIZE * windowed.NUM_SPLITS >= 4096 + 1, "the splits cover the window"
    assert windowed.SPLIT_SIZE * windowed.NUM_SPLITS < 2 * (4096 + 64), "and about nothing else"
    assert tiling_for(_long_decode_call(1_000_000)) == plain, "a window wider than the table changes nothing"


def test_the_windows_split_bound_counts_the_queries():
    base = replace(CASES_BY_NAME["split_kv_prefill_early_rows"], seq_lens=(1100,), q_lens=(600,))  # tiling only
    inputs = base.inputs()
    hinted = tiling_for(prepare_call(*inputs.args(), sliding_window=500), max_q_len=600)
    unhinted = tiling_for(prepare_call(*inputs.args(), sliding_window=500))
    assert hinted == unhinted, "without a hint the bound is num_tokens (600 here)"
    assert hinted.NUM_SPLITS == tiling_for(prepare_call(*inputs.args())).NUM_SPLITS == 2, "1100 keys: both split"
    narrow = tiling_for(prepare_call(*inputs.args(), sliding_window=100), max_q_len=600)
    assert narrow.NUM_SPLITS == 1, "100 + 600 keys is too few to split"


# --- mutants: each wrong definition is caught against the oracle -----------------------------


def dense_attention(inputs, sliding_window=None, logit_softcap=None, sinks=None, alibi_slopes=None, *,
                    sink_copies=1, sink_value_first_key=False, alibi_before_cap=False):  # fmt: skip
    """The definition in fp32, per sequence, with switches for the mutants that no keyword reaches."""
    q, k_cache, v_cache, table, seq_lens, starts = inputs.args()
    scale = q.shape[-1] ** -0.5
    group = q.shape[1] // k_cache.shape[2]
    out = torch.empty_like(q)
    for seq, seq_len in enumerate(seq_lens.tolist()):
        a, b = int(starts[seq]), int(starts[seq + 1])
        if a == b:
            continue
        k = gather_kv(k_cache, table[seq], seq_len).float().repeat_interleave(group, 1).transpose(0, 1)
        v = gather_kv(v_cache, table[seq], seq_len).float().repeat_interleave(group, 1).transpose(0, 1)
        z = q[a:b].float().transpose(0, 1) @ k.transpose(-1, -2) * scale  # [heads, q_len, seq_len]
        distance = torch.arange(seq_len)[None, :] - torch.arange(seq_len - (b - a), seq_len)[:, None]
        bias = 0 if alibi_slopes is None else alibi_slopes[:, None, None] * distance
        if alibi_before_cap:
            z, bias = z + bias, 0
        if logit_softcap is not None:
            z = logit_softcap * torch.tanh(z / logit_softcap)
        z = z + bias
        hidden = (distance > 0) | (False if sliding_window is None else distance <= -sliding_window)
        z = z.masked_fill(hidden, float("-inf"))
        m = z.amax(-1, keepdim=True)
        if sinks is not None:
            m = torch.maximum(m, sinks[:, None, None])
        p = torch.exp(z - m)
        denominator = p.sum(-1, keepdim=True)
        o = p @ v
        if sinks is not None:
            sink_p = torch.exp(sinks[:, None, None] - m)
            denominator = denominator + sink_copies * sink_p
            if sink_value_first_key:
                o = o + sink_p * v[:, :1]
        out[a:b] = (o / denominator).transpose(0, 1).to(out.dtype)
    return out


def _tlsim_with(change):
    """A mutant: tlsim called with the case's keywords changed by ``change`` (keywords, inputs) -> keywords."""
    return lambda inputs, kw, monkeypatch: kernels.paged_attention_tlsim(*inputs.args(), **change(kw, inputs))


def _dense_with(**switches):
    """A mutant: :func:`dense_attention` with a switch no keyword reaches."""
    return lambda inputs, kw, monkeypatch: dense_attention(inputs, **kw, **switches)


def _without(name: str):
    return _tlsim_with(lambda kw, inputs: {k: v for k, v in kw.items() if k != name})


def window_starts_a_tile_late(inputs, kw, monkeypatch):
    """The tile loop starts one tile after the first visible one."""
    real = tlsim.window_tile_start
    monkeypatch.setattr(tlsim, "window_tile_start", lambda p, w, n: real(p, w, n) + n)
    return kernels.paged_attention_tlsim(*inputs.args(), **kw)


def sink_added_per_split(inputs, kw, monkeypatch):
    """Each KV split adds the sink to its own sum: the combine then counts it NUM_SPLITS times."""
    splits = tiling_for(prepare_call(*inputs.args())).NUM_SPLITS
    assert splits > 1
    return dense_attention(inputs, **kw, sink_copies=splits)


def _shift_window(by: int):
    return _tlsim_with(lambda kw, inputs: {**kw, "sliding_window": kw["sliding_window"] + by})


# Each: the wrong definition, the mutant (inputs, keywords, monkeypatch) -> output, the case that must catch it.
MUTANTS = [
    ("window_off_by_one_wide", _shift_window(1), "window5_spec_verify"),  # W + 1 keys: q_pos - k_pos <= W
    ("window_off_by_one_narrow", _shift_window(-1), "window5_spec_verify"),  # W - 1: forgets the query sees itself
    ("window_off_by_one_wide", _shift_window(1), "window_split_kv_prefill"),
    ("window_starts_a_tile_late", window_starts_a_tile_late, "window_split_kv_decode"),
    # cap * tanh(s / cap) on s = q . k, scaled afterwards: the same as a cap of cap * scale on z
    ("softcap_on_unscaled_logits",
     _tlsim_with(lambda kw, inputs: {**kw, "logit_softcap": kw["logit_softcap"] * inputs.q.shape[-1] ** -0.5}),
     "softcap50_large_logits"),
    ("softcap_left_out", _without("logit_softcap"), "softcap50_large_logits"),
    ("sink_left_out", _without("sinks"), "sinks_extreme"),  # forgotten in the denominator
    ("sink_added_per_split", sink_added_per_split, "sinks_split_kv"),
    # the sink joins the softmax as a key whose value is the first value row (not zero)
    ("sink_as_a_key_with_value", _dense_with(sink_value_first_key=True), "sinks_extreme"),
    ("slopes_on_the_wrong_head",  # head h gets head h + 1's slope
     _tlsim_with(lambda kw, inputs: {**kw, "alibi_slopes": kw["alibi_slopes"].roll(1)}), "alibi_gqa_group6"),
    ("alibi_sign_flipped",  # slope * (query_pos - key_pos): old keys favoured instead of penalised
     _tlsim_with(lambda kw, inputs: {**kw, "alibi_slopes": -kw["alibi_slopes"]}), "alibi_gqa_group6"),
    ("alibi_before_softcap", _dense_with(alibi_before_cap=True), "all_four_spec_verify"),  # the cap bends the bias
]  # fmt: skip


@pytest.mark.parametrize(("name", "mutant", "case_name"), MUTANTS, ids=[f"{m}-{c}" for m, _, c in MUTANTS])
def test_oracle_catches_a_wrong_variant(name, mutant, case_name, monkeypatch):
    case = BY_NAME[case_name]
    inputs, expected = graded_inputs(case)
    bounds = tolerance(case)
    assert grade(dense_attention(inputs, **case.kwargs()), expected, *bounds).passed, "the unmutated form passes"
    graded = grade(mutant(inputs, case.kwargs(), monkeypatch), expected, *bounds)
    assert not graded.passed, f"{name} slipped through on {case_name}: {graded}"


# --- the contract refuses malformed options ----------------------------------------------------

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


@pytest.mark.parametrize(
    ("options", "cache_dtypes", "message"),
    [
        ({"sliding_window": 0}, None, "sliding_window must be an int >= 1"),
        ({"sliding_window": 2.5}, None, "sliding_window must be an int >= 1"),
        ({"logit_softcap": 0.0}, None, "logit_softcap must be a positive finite"),
        ({"logit_softcap": float("inf")}, None, "logit_softcap must be a positive finite"),
        ({"sinks": torch.zeros(7)}, None, "sinks must be a float32 tensor [num_q_heads] = [8]"),
        ({"sinks": torch.zeros(8, dtype=torch.float64)}, None, "sinks must be a float32 tensor"),
        ({"alibi_slopes": [0.5] * 8}, None, "alibi_slopes must be a float32 tensor"),
        ({"return_lse": 1}, None, "return_lse must be True or False"),
        *(({"scale": scale}, None, "scale must be a positive finite number") for scale in (0.0, -0.125, float("nan"))),
        ({"k_scale": 0.5}, None, "k_scale applies to an fp8 cache"),
        ({"k_scale": -1.0}, (E4M3, E4M3), "k_scale must be a positive finite"),
        ({"v_scale": True}, (E4M3, E4M3), "v_scale must be a float or"),  # a bool is no scale
        ({"v_scale": torch.ones(3)}, (E4M3, E4M3), "v_scale must be a float or a float32 tensor of 1 or"),
        ({"k_scale": torch.ones(2, dtype=torch.float64)}, (E4M3, E4M3), "k_scale must be a float or"),
        ({}, (E4M3, E5M2), "both one fp8"),
    ],
)
@pytest.mark.parametrize("fn_name", ["reference", "tlsim", "triton"])
def test_malformed_option_is_refused_naming_it(options, cache_dtypes, message, fn_name):
    q, k, v, *rest = CASES_BY_NAME["base"].inputs().args()
    if cache_dtypes:
        k, v = k.to(cache_dtypes[0]), v.to(cache_dtypes[1])
    with pytest.raises(ValueError, match=re.escape(message)):
        backend_fn(fn_name)(q, k, v, *rest, **options)


def test_standard_alibi_slopes_follow_bloom():
    assert standard_alibi_slopes(8) == [2.0**-i for i in range(1, 9)]
    twelve = standard_alibi_slopes(12)  # 8 of the 8-head set, then every other one of the 16-head set
    assert twelve[:8] == standard_alibi_slopes(8)
    assert twelve[8:] == [2.0 ** (-0.5 * (2 * i + 1)) for i in range(4)]


# --- case files and the registry -----------------------------------------------------------------

SPEC = {"name": "v", "num_q_heads": 4, "num_kv_heads": 2, "head_dim": 32, "seq_lens": [5, 9], "tags": ["small"]}


def test_case_fields_become_call_options():
    (case,) = expand_spec({**SPEC, "sliding_window": 3, "logit_softcap": 10.0, "sinks": {"scale": 2.0},
                           "alibi": True}, "t.toml")  # fmt: skip
    assert case.variants == {"sliding_window", "logit_softcap", "sinks", "alibi_slopes"}
    (again,) = expand_spec({**SPEC, "sinks": {"scale": 2.0}}, "t.toml")
    assert again.sinks == case.sinks and len(case.sinks) == 4, "seeded sinks are the same every time"

    options = case_inputs(case, "cpu").options
    assert options["sliding_window"] == 3 and options["logit_softcap"] == 10.0
    assert options["sinks"].dtype == torch.float32 and options["sinks"].tolist() == list(case.sinks)
    assert options["alibi_slopes"].tolist() == [0.25, 0.0625, 0.015625, 0.00390625]
    (plain,) = expand_spec(SPEC, "t.toml")
    assert plain.variants == frozenset() and case_inputs(plain, "cpu").options == {}


# --- the variant table: each row's hooks take its case field to the call and into the oracle ----

STAGES = ("kv", "score", "mask", "sink")


def _output_form(out) -> tuple:
    """What the oracle's result shows without reading values: a tuple (the lse) or not, and the shapes."""
    return tuple(tuple(t.shape) for t in out) if isinstance(out, tuple) else tuple(out.shape)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.key)
def test_each_rows_example_turns_on_its_variant_and_reaches_the_call_and_the_oracle_through_its_hooks(
    variant, monkeypatch
):
    (case,) = expand_spec({**SPEC, **variant.example}, "t.toml")
    implied = {"head_dim_v"} if variant.key == "latent_kv" else set()  # a latent cache: V narrower than K
    assert case.variants == {variant.key} | implied, f"{variant.key}'s example turns on {set(case.variants)}"
    # a keyword needs an input hook; an input hook without one only reshapes the inputs (latent_kv alone)
    assert (variant.inputs is not None) == (bool(variant.keywords) or variant.key == "latent_kv")
    inputs = case_inputs(case, "cpu")
    assert set(inputs.options) == set(variant.keywords), "the input hook gives exactly the row's keywords"
    out = paged_attention_oracle(*inputs.args(), **inputs.options)
    if not any(getattr(variant.oracle, stage) for stage in STAGES):
        # no hook: the oracle's output shows the variant by its form (the lse beside it, V's head dim), or
        # by its values where the row only reshapes the inputs (latent_kv: V is K's first columns)
        (plain,) = expand_spec(
            {**SPEC, **{k: v for k, v in variant.example.items() if k not in variant.fields}}, "t.toml"
        )
        plain_out = paged_attention_oracle(*case_inputs(plain, "cpu").args())
        if variant.inputs is None or variant.keywords:
            assert _output_form(out) != _output_form(plain_out)
        else:
            assert _output_form(out) == _output_form(plain_out) and (out - plain_out).abs().max() > 1e-2
        return
    hookless = tuple(replace(v, oracle=OracleHook()) if v is variant else v for v in VARIANTS)
    monkeypatch.setattr("harness.run.oracle.VARIANTS", hookless)
    without_hook = paged_attention_oracle(*inputs.args(), **inputs.options)
    assert torch.equal(without_hook, paged_attention_oracle(*inputs.args())), "the keywords act through the hook alone"
    assert (out - without_hook).abs().max() > 1e-2, f"{variant.key}'s oracle hook changes the oracle's output"


BUILTIN_KERNELS = ("reference", "tlsim", "triton", "cache")  # cache: the engine's path, through dispatch


@pytest.mark.parametrize("backend", BUILTIN_KERNELS)
@pytest.mark.parametrize("variant", [*VARIANTS, None], ids=lambda v: v.key if v else "all_at_once")
def test_every_builtin_kernel_passes_each_rows_example_and_all_at_once(variant, backend):
    """A new row is graded here with no edit, alone and with the others (but latent_kv, which takes no fp8
    cache); the engine path's pools are two, so its latent_kv row is a skip naming the option."""
    if backend == "triton":
        needs_triton()
    at_once = {name: value for v in VARIANTS if v.key != "latent_kv" for name, value in v.example.items()}
    rows = graded_rows({**SPEC, **(variant.example if variant else at_once)}, backend)
    if variant and (variant.key, backend) == ("latent_kv", "cache"):
        assert rows["status"].tolist() == ["skip"] and "latent_kv" in rows["reason"].iloc[0]
        return
    assert rows["status"].tolist() == ["pass"], rows["reason"].tolist()


def test_a_row_alone_takes_a_new_variant_to_the_call_and_the_oracle(monkeypatch):
    """A toy temperature T as one more row reaches make_inputs, the call and the oracle (attention at scale / T)."""
    temperature = Variant(
        "temperature",
        fields={"temperature": (Float | None, Field(default=None, gt=0))},
        keywords=("temperature",),
        turned_on=lambda c: c.temperature is not None,
        example={"temperature": 2.0},
        inputs=lambda inputs, c: with_options(inputs, temperature=float(c.temperature)),
        oracle=OracleHook(score=lambda logits, distance, temperature: logits / temperature),
        meaning="logits divided by T",
    )
    for module in ("harness.cases.inputs", "harness.run.oracle"):
        monkeypatch.setattr(f"{module}.VARIANTS", (*VARIANTS, temperature))
    inputs = make_inputs(**TINY, temperature=2.0)
    assert inputs.options == {"temperature": 2.0}
    cooled = paged_attention_oracle(*inputs.args(), **inputs.options)
    assert torch.equal(cooled, paged_attention_oracle(*inputs.args(), scale=TINY["head_dim"] ** -0.5 / 2))
    assert not torch.equal(cooled, paged_attention_oracle(*inputs.args()))
    with pytest.raises(TypeError, match="unexpected keyword"):
        make_inputs(**TINY, heat=2.0)


@pytest.mark.parametrize(
    ("changes", "field"),
    [({"sinks": [1.0, 2.0]}, "sinks"), ({"sliding_window": 0}, "sliding_window"),
     ({"logit_softcap": -1.0}, "logit_softcap"), ({"alibi": 1}, "alibi"),
     ({"sinks": {"scale": 1.0, "std": 2.0}}, "sinks"), ({"kv_scale": 0.5}, "kv_scale"),
     ({"kv_dtype": "float8"}, "kv_dtype"), ({"kv_dtype": "float8_e4m3fn", "kv_scale": "max"}, "kv_scale"),
     ({"kv_dtype": "float8_e4m3fn", "kv_scale": -1.0}, "kv_scale")],
)  # fmt: skip
def test_bad_variant_field_is_refused_naming_it(changes, field):
    with pytest.raises(CaseFileError, match=f"field '{field}"):
        expand_spec({**SPEC, **changes}, "t.toml")


def _fp8_row(case, row) -> bool:
    """One byte a KV element, the cache's dtype, and e5m2's own error above the kernel's."""
    return case.kv_element_bytes == 1 and row["kv_dtype"] == "float8_e5m2" and row["quant_error"] > row["max_abs_err"]


# Each: case fields, the variants they turn on, what each built-in kernel's row shows of them (case, row -> bool).
ROWS_SHOW = {
    "fp8_kv": ({"kv_dtype": "float8_e5m2", "kv_scale": "amax_per_head", "dtype": "bfloat16"}, {"fp8_kv"}, _fp8_row),
    "return_lse": (
        {"return_lse": True, "sinks": {"scale": 1.0}},
        {"return_lse", "sinks"},
        lambda case, row: 0 <= row["lse_tol_ratio"] < 0.5,
    ),
    "head_dim_v": ({"head_dim": 192, "head_dim_v": 128}, {"head_dim_v"}, lambda case, row: row["head_dim_v"] == 128),
}


@pytest.mark.parametrize("name", ROWS_SHOW)
def test_the_rows_show_the_variant_and_a_peer_without_it_skips_naming_it(name):
    fields, variants, shows = ROWS_SHOW[name]
    (case,) = expand_spec({**SPEC, **fields}, "t.toml")
    assert case.variants == variants
    rows = graded_rows(case, "reference", "tlsim", "cache", "gather_sdpa")
    for backend in ("reference", "tlsim", "cache"):
        assert rows.loc[backend, "status"] == "pass" and shows(case, rows.loc[backend]), rows.loc[backend].to_dict()
    assert rows.loc["gather_sdpa", "status"] == "skip" and name in rows.loc["gather_sdpa", "reason"]


def _plain_backend(name: str, variants=frozenset()) -> Backend:
    return Backend(name, contract_prepare(kernels.paged_attention_tlsim), ("cpu",), "plugin", variants=variants)


def test_backend_without_the_option_is_a_skip_naming_it():
    (case,) = expand_spec({**SPEC, "sliding_window": 3, "sinks": [0.0, 1.0, 2.0, 3.0]}, "t.toml")
    backends = [_plain_backend("knows_none"), _plain_backend("knows_window", frozenset({"sliding_window"})),
                _plain_backend("knows_both", frozenset({"sliding_window", "sinks"}))]  # fmt: skip
    rows = graded_rows(case, *backends)
    assert rows.loc["knows_none", "status"] == "skip"
    assert "sinks, sliding_window" in rows.loc["knows_none", "reason"]
    assert rows.loc["knows_window", "status"] == "skip"
    assert "does not support sinks" in rows.loc["knows_window", "reason"]
    assert rows.loc["knows_both", "status"] == "pass", rows.loc["knows_both", "reason"]


def test_builtin_kernels_declare_every_option_and_peers_what_their_library_takes():
    for name in ("reference", "tlsim", "triton"):
        assert REGISTRY[name].variants == frozenset(VARIANT_KEYS)
    assert REGISTRY["cache"].variants == frozenset(VARIANT_KEYS) - {"latent_kv"}  # its K and V pools are two
    for name in ("gather_sdpa", "varlen_flash", "varlen_flash_paged"):  # a boolean mask; window_size=(W-1, 0)
        assert REGISTRY[name].variants == {"sliding_window"}
    assert REGISTRY["flex_attention"].variants == {"sliding_window", "logit_softcap", "alibi_slopes"}
    assert not REGISTRY["sdpa_contiguous"].variants
    with pytest.raises(ValueError, match="unknown variant"):
        _plain_backend("typo", frozenset({"sliding_windows"}))


@pytest.mark.parametrize("window", [1, 4, 9, 100])
def test_gather_sdpa_peer_matches_oracle_with_a_window(window):
    """The peer's padded boolean mask carries the window; prefill, decode and a q_len 0 sequence."""
    rows = graded_rows({**SPEC, "seq_lens": [20, 9, 7], "q_lens": [6, 1, 0], "sliding_window": window}, "gather_sdpa")
    assert rows["status"].tolist() == ["pass"], rows["reason"].tolist()


@pytest.mark.parametrize(
    "changes",
    [
        {"sliding_window": 4},
        {"logit_softcap": 5.0, "input_scale": 3.0},
        {"alibi": True},
        {"sliding_window": 6, "logit_softcap": 5.0, "alibi": True},
    ],
    ids=["window", "softcap", "alibi", "all_three"],
)
def test_flex_attention_peer_mods_match_oracle(changes, monkeypatch):
    """The peer's mask_mod and score_mod, run eagerly on the CPU (the registry runs it compiled on CUDA)."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    from harness.backends.peers import _prepare_flex

    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    (case,) = expand_spec({**SPEC, "seq_lens": [20, 9, 7], "q_lens": [6, 1, 0], **changes}, "t.toml")
    inputs = case_inputs(case, "cpu")
    prepared = _prepare_flex(case, inputs, torch.empty_like(inputs.q))
    result = prepared.to_packed(prepared.run())
    expected = paged_attention_oracle(*inputs.args(), **inputs.options)
    assert_passes(result, expected, DEFAULT_TOLERANCES["float32"])
