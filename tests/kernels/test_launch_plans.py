"""A launch plan (kernels/launch_plan.py) launches exactly what the full path would, and only for its own key.

Most tests swap the Triton kernels for recorders, so a plan hit must record the same launches as the
call with plans off; the last ones compare the interpreted kernel's outputs bit for bit."""

from __future__ import annotations

import importlib.util
import random
from dataclasses import replace

import pytest
import torch

import kernels
from kernels import launch_plan, tuning
from kernels.contract import prepare_call
from kernels.launch_plan import PlanCache, call_key, plans_enabled
from kernels.tiling import tiling_for
from tests.kernels.kernel_cases import (
    BAD_CALLS,
    BASE,
    CASES_BY_NAME,
    DEVICES,
    KernelRecorder,
    base_args,
    describe_launch_arg,
    needs_triton,
    strided,
)


def _launches(recorder, args, kwargs):
    """The launches one call makes."""
    before = len(recorder.launches)
    kernels.paged_attention_triton(*args, **kwargs)
    return recorder.launches[before:]


def _random_call(rng: random.Random):
    """A call of random shapes, options and hints (empty tensors: nothing is read)."""
    dtype = rng.choice([torch.float32, torch.float16, torch.bfloat16])
    num_kv_heads, head_dim = rng.choice([1, 2, 8]), rng.choice([32, 64, 80, 128, 256, 576])
    group = rng.choice([1, 3, 4, 8, 16, 32] + ([128] if num_kv_heads == 1 else []))
    head_dim_v = 512 if head_dim == 576 else head_dim
    block_size = rng.choice([1, 5, 16, 64, 256])
    num_seqs = rng.randint(1, 48)
    max_blocks = rng.randint(1, 8192 // block_size + 1)
    decode = rng.random() < 0.5
    num_tokens = num_seqs if decode else rng.randint(num_seqs, 4 * num_seqs + 40)
    q = torch.empty(num_tokens, num_kv_heads * group, head_dim, dtype=dtype)
    k = torch.empty(2, block_size, num_kv_heads, head_dim, dtype=dtype)
    v = torch.empty(2, block_size, num_kv_heads, head_dim_v, dtype=dtype)
    table = torch.zeros(num_seqs, max_blocks, dtype=torch.int32)
    lens = torch.zeros(num_seqs, dtype=torch.int32)
    qsl = None if decode and rng.random() < 0.5 else torch.zeros(num_seqs + 1, dtype=torch.int32)
    kwargs = {
        "max_q_len": rng.choice([None, 1, rng.randint(1, 64)]),
        "max_seq_len": rng.choice([None, rng.randint(1, 20000)]),
        "sliding_window": rng.choice([None, rng.randint(1, 5000)]),
        "logit_softcap": rng.choice([None, 30.0]),
        "return_lse": rng.random() < 0.3,
        "sinks": rng.choice([None, torch.zeros(num_kv_heads * group)]),
        "alibi_slopes": rng.choice([None, torch.zeros(num_kv_heads * group)]),
    }
    scale = rng.choice([None, 0.125])
    if kwargs["sinks"] is not None and rng.random() < 0.5:  # a strided vector: the full path and a hit copy it
        kwargs["sinks"] = torch.zeros(2 * num_kv_heads * group)[::2]
    if dtype != torch.float32 and rng.random() < 0.3:  # an fp8 cache; its scales absent, host floats or tensors
        k, v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
        kwargs["k_scale"] = rng.choice([None, 0.5, torch.ones(1), torch.ones(num_kv_heads)])
        kwargs["v_scale"] = rng.choice([None, 2.0, torch.ones(num_kv_heads)])
    return [q, k, v, table, lens, qsl, scale], kwargs


RANDOM_SEEDS = range(60)


@pytest.mark.parametrize("seed", RANDOM_SEEDS)
def test_a_plan_hit_launches_what_the_full_path_launches(recorded, seed):
    """Random shapes, options and hints: the hit launches as the uncached call, its tiling a fresh one."""
    args, kwargs = _random_call(random.Random(seed))
    first = _launches(recorded, args, kwargs)
    (plan_tiling,) = [recipe.plan.tiling for recipe in recorded.plans.plans()]
    hit = _launches(recorded, args, kwargs)
    assert recorded.plans.hits == 1
    with plans_enabled(False):
        uncached = _launches(recorded, args, kwargs)
    assert hit == first == uncached and len(hit) in (1, 2)
    call = prepare_call(*args, check=False, **{k: kwargs[k] for k in ("sliding_window", "logit_softcap", "sinks",
                                                                        "alibi_slopes")})  # fmt: skip
    assert plan_tiling == tiling_for(call, kwargs["max_q_len"], kwargs["max_seq_len"])


@pytest.mark.parametrize("seed", RANDOM_SEEDS[:30])
def test_the_short_hit_methods_launch_what_the_general_ones_launch(recorded, monkeypatch, seed):
    """_run_plain and _launch_direct launch and return what the general methods they skip do."""
    triton_paged = needs_triton()
    args, kwargs = _random_call(random.Random(seed))

    def first_and_hit():
        triton_paged.PLANS.clear()
        results = [kernels.paged_attention_triton(*args, **kwargs) for _ in range(2)]
        assert triton_paged.PLANS.hits == 1
        outs = [r if isinstance(r, tuple) else (r,) for r in results]
        return recorded.launches[-2:], [[describe_launch_arg(t) for t in out] for out in outs]

    short = first_and_hit()
    monkeypatch.setattr(launch_plan.CallRecipe, "_run_plain", launch_plan.CallRecipe._run)
    monkeypatch.setattr(triton_paged.TritonPlan, "_launch_direct", triton_paged.TritonPlan._launch_general)
    general = first_and_hit()
    assert short == general


@pytest.mark.parametrize(
    "q_view",
    [
        lambda q: q,
        lambda q: q.transpose(0, 1).contiguous().transpose(0, 1),
        lambda q: q.as_strided((q.shape[0], 1, q.shape[2]), (q.shape[2], 3, 1)),  # contiguous, an odd size-1 stride
    ],
)
@pytest.mark.parametrize("head_dim_v", [32, 16])
def test_a_hit_allocates_out_as_the_full_path_does(recorded, q_view, head_dim_v):
    """The hit's out (empty_like(q) where that matches) has the full path's shape, strides and dtype."""
    q = q_view(torch.empty(4, 8, 32))
    k, v = torch.empty(3, 4, 1, 32), torch.empty(3, 4, 1, head_dim_v)
    args = [q, k, v, torch.zeros(4, 2, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)]
    outs = [kernels.paged_attention_triton(*args) for _ in range(2)]
    assert recorded.plans.hits == 1
    with plans_enabled(False):
        outs.append(kernels.paged_attention_triton(*args))
    assert len({(tuple(o.shape), o.stride(), o.dtype) for o in outs}) == 1 and outs[0].is_contiguous()
    assert outs[1].stride() == torch.empty(outs[1].shape).stride()


def test_the_compiled_runner_is_made_once_and_gets_tensors_scalars_constexprs_and_the_current_stream(monkeypatch):
    monkeypatch.setattr(launch_plan, "_fast_launch_error", None)
    made, calls, current = [], [], {3: 111}

    class Compiled:
        def __getitem__(self, grid):
            made.append(grid)
            return lambda *args, **kwargs: calls.append((args, kwargs))

    jit = object()
    launch = launch_plan.KernelLaunch((2,), {"N": 4, "M": 8}, {"num_warps": 4}, cuda=True, scalars=(0.5, 7))
    launch.compiled, launch.jit, launch.constexpr_values = Compiled(), jit, (8, 4)
    launch(jit, "t0")  # no stream_of: the runner looks its stream up itself
    launch.device_index, launch.stream_of = 3, current.__getitem__
    launch(jit, "t1")
    current[3] = 222  # another stream made current (a graph capture's, say): the next hit uses it
    launch(jit, "t2")
    args = [(name, 0.5, 7, 8, 4) for name in ("t0", "t1", "t2")]
    assert made == [(2, 1, 1)] and calls == [(args[0], {}), (args[1], {"stream": 111}), (args[2], {"stream": 222})]


def _shift(t: torch.Tensor, elements: int = 1) -> torch.Tensor:
    """The same values in a buffer ``elements`` further on: data_ptr no longer a multiple of 16."""
    flat = torch.empty(t.numel() + elements, dtype=t.dtype)[elements:]
    return flat.view(t.shape).copy_(t)


def _with(args, **at):
    """args with the positions ``at`` (named p0..p5) replaced."""
    args = list(args)
    for position, value in at.items():
        args[int(position[1:])] = value
    return args


# Each: a change to BASE's call after a hit, (args, kwargs) -> (args, kwargs); it must miss and
# launch as the full path does.
CHANGES = {
    "block_table_wider": lambda a, kw: (_with(a, p3=torch.nn.functional.pad(a[3], (0, 3), value=-1)), kw),
    "fewer_seqs": lambda a, kw: (_with(a, p0=a[0][: int(a[5][3])], p3=a[3][:3], p4=a[4][:3], p5=a[5][:4]), kw),
    "dtype": lambda a, kw: (_with(a, p0=a[0].half(), p1=a[1].half(), p2=a[2].half()), kw),
    "q_strided": lambda a, kw: (_with(a, p0=a[0].transpose(0, 1).contiguous().transpose(0, 1)), kw),
    "block_table_strided": lambda a, kw: (_with(a, p3=strided(a[3])), kw),
    "k_cache_head_dim_strided": lambda a, kw: (_with(a, p1=strided(a[1])), kw),
    "sliding_window": lambda a, kw: (a, {**kw, "sliding_window": 7}),
    "return_lse": lambda a, kw: (a, {**kw, "return_lse": True}),
    "max_q_len_hint": lambda a, kw: (a, {**kw, "max_q_len": 1}),
    "scale": lambda a, kw: (a, {**kw, "scale": 0.3}),
    "out_given_strided": lambda a, kw: (a, {**kw, "out": torch.empty(8, a[0].shape[0], 64).transpose(0, 1)}),
    "q_misaligned": lambda a, kw: (_with(a, p0=_shift(a[0])), kw),
    # Triton specializes on data_ptr % 16: a view one element on must not share the aligned call's plan
    "k_cache_misaligned": lambda a, kw: (_with(a, p1=_shift(a[1])), kw),
}

# Changes the launch does not show: the launcher copies these tensors to contiguous ones (a
# stale plan would not have, and would pass the strided tensor), and the recorder does not
# compare pointers; BASE's fp32 tiles keep 16 rows whatever max_q_len says.
SAME_LAUNCH = {"block_table_strided", "k_cache_head_dim_strided", "q_misaligned", "max_q_len_hint"}


@pytest.mark.parametrize("change", CHANGES)
def test_a_changed_call_after_a_hit_gets_its_own_plan(recorded, change):
    args, kwargs = base_args(), {}
    _launches(recorded, args, kwargs)
    base = _launches(recorded, args, kwargs)  # a hit
    assert recorded.plans.hits == 1
    args, kwargs = CHANGES[change](args, kwargs)
    changed = _launches(recorded, args, kwargs)
    assert len(recorded.plans) == 2 and recorded.plans.hits == 1
    with plans_enabled(False):
        assert changed == _launches(recorded, args, kwargs), "the changed call launched a stale plan"
    if change not in SAME_LAUNCH:
        assert changed != base


def test_a_scalar_key_tells_true_from_one_and_refuses_other_types():
    args = base_args()

    def key(**given):
        spec = {"scale": None, "out": None, "max_q_len": None, "max_seq_len": None, "return_lse": False}
        options = {name: value for name, value in given.items() if name not in spec}
        return call_key(*args, *(spec | {k: v for k, v in given.items() if k in spec}).values(), options)

    assert key(sliding_window=True) != key(sliding_window=1) != key(sliding_window=1.0)
    assert key(max_q_len=4) != key(max_q_len=5)
    assert key(scale=[0.1]) is None and key(sinks=[0.0] * 8) is None, "an unexpected type takes the full path"
    # a tensor where the contract reads a host value (the full path does float(scale)): never cached, since a
    # key of its metadata alone would hit with the last call's value (scale 0.1 reused for 0.9)
    for name in ("scale", "max_q_len", "max_seq_len", "sliding_window", "logit_softcap"):
        assert key(**{name: torch.tensor(1.0)}) is None, name


def test_a_tensor_scale_is_read_on_every_call_not_reused_from_a_plan(recorded):
    args = base_args()
    first = _launches(recorded, args, {"scale": torch.tensor(0.1)})
    second = _launches(recorded, args, {"scale": torch.tensor(0.9)})
    assert recorded.plans.hits == 0 and first != second
    with plans_enabled(False):
        assert second == _launches(recorded, args, {"scale": torch.tensor(0.9)})


def test_the_tuning_override_is_part_of_the_key(recorded):
    args = base_args()
    plain = _launches(recorded, args, {})
    config = tuning.TileConfig(max_rows=16, max_tokens=2, tile_n=16, num_warps=2, num_stages=1)
    with tuning.override(config):
        overridden = _launches(recorded, args, {})
        assert _launches(recorded, args, {}) == overridden
    assert overridden[0][2]["TILE_N"] == 16 != plain[0][2]["TILE_N"]
    assert _launches(recorded, args, {}) == plain


def test_plans_off_keeps_none_and_the_env_var_turns_them_off(recorded):
    with plans_enabled(False):
        _launches(recorded, base_args(), {})
        _launches(recorded, base_args(), {})
    assert len(recorded.plans) == 0 and recorded.plans.hits == 0
    for env, enabled in ((None, True), ("0", False)):  # read at import: a fresh copy of the module imported
        with pytest.MonkeyPatch.context() as patch:
            patch.delenv("PAGED_ATTN_PLAN_CACHE", raising=False)
            if env is not None:
                patch.setenv("PAGED_ATTN_PLAN_CACHE", env)
            spec = importlib.util.spec_from_file_location("kernels._launch_plan_imported_here", launch_plan.__file__)
            imported = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(imported)
        assert imported._enabled is enabled


def test_the_cache_keeps_the_most_recently_used_plans():
    cache = PlanCache(size=2)
    cache.put(("a",), 1)
    cache.put(("b",), 2)
    assert cache.get(("a",)) == 1  # now b is the least recently used
    cache.put(("c",), 3)
    assert cache.get(("b",)) is None and cache.get(("a",)) == 1 and cache.get(("c",)) == 3 and len(cache) == 2


def test_a_failing_compiled_launch_falls_back_to_the_jit_entry_for_good(monkeypatch):
    """A compiled kernel whose launch raises (an API this Triton lacks) is given up without an error."""
    monkeypatch.setattr(launch_plan, "_fast_launch_error", None)
    recorder = KernelRecorder()

    class Broken:
        def __getitem__(self, grid):
            raise AttributeError("no runner here")

    launch = launch_plan.KernelLaunch((2,), {"N": 4}, {"num_warps": 4}, cuda=True)
    launch.compiled, launch.jit, launch.constexpr_values = Broken(), recorder, (4,)
    launch(recorder, 1.0, 7)
    launch(recorder, 1.0, 7)
    assert recorder.launches == [((2,), (1.0, 7), {"N": 4, "num_warps": 4})] * 2
    assert "no runner here" in launch_plan.fast_launch_status()


# --- validation on the second call ------------------------------------------------------------


@pytest.mark.parametrize("name", BAD_CALLS)
def test_a_bad_call_fails_the_same_way_after_a_good_one(name, recorded, monkeypatch):
    """A hit still runs the value checks, and a call that differs in the key never meets the good plan (the
    launches recorded, not run; the value checks on, as the suite's calls have them)."""
    monkeypatch.setenv(kernels.CHECK_ENV, "1")
    good = base_args()
    kernels.paged_attention_triton(*good)
    kernels.paged_attention_triton(*good)
    assert recorded.plans.hits == 1
    args, message = BAD_CALLS[name]
    for _ in range(2):
        with pytest.raises(ValueError, match=message):
            kernels.paged_attention_triton(*args)


# --- real launches under the interpreter -------------------------------------------------------

DECODE = replace(BASE, name="decode", q_lens=(1, 1, 1, 1, 1))
# K past the single dot: loaded as a main piece and a tail
K300 = replace(BASE, name="k300", num_q_heads=2, num_kv_heads=1, head_dim=300, seq_lens=(1, 37), q_lens=(1, 3))
OUTPUT_CASES = {
    "base": (BASE, {}),
    "decode_no_offsets": (DECODE, {"query_start_loc": None}),
    "split_kv_decode": (CASES_BY_NAME["split_kv_decode"], {"return_lse": True}),
    "variants": (BASE, {"sliding_window": 9, "logit_softcap": 20.0, "return_lse": True, "sinks": 1, "alibi_slopes": 1}),
    "strided_out_and_table": (CASES_BY_NAME["bfloat16_prefill"], {"out": "strided", "table": "strided"}),
    "fp8_float_scale": (replace(BASE, name="fp8"), {"fp8": torch.float8_e4m3fn, "k_scale": 0.5, "v_scale": 2.0}),
    "fp8_e5m2_per_head_scales": (DECODE, {"fp8": torch.float8_e5m2, "k_scale": (0.5, 0.25), "v_scale": (2.0, 1.0)}),
    "k300_main_and_tail": (K300, {}),
    "k300_main_and_tail_lse": (K300, {"return_lse": True}),
}


def _output_call(case, spec, device="cpu"):
    inputs = case.inputs(device)
    args = list(inputs.args())
    options = ("sliding_window", "logit_softcap", "return_lse", "k_scale", "v_scale")
    kwargs = {k: torch.tensor(v, device=device) if isinstance(v, tuple) else v for k, v in spec.items() if k in options}
    kwargs |= {
        n: torch.linspace(-1, 1, case.num_q_heads, device=device) for n in ("sinks", "alibi_slopes") if n in spec
    }
    if "query_start_loc" in spec:
        args[5] = None
    if spec.get("table") == "strided":
        args[3] = strided(args[3])
    if fp8 := spec.get("fp8"):
        args[1], args[2] = args[1].to(fp8), args[2].to(fp8)
    if spec.get("out") == "strided":
        out = torch.full((args[2].shape[-1], *args[0].shape[:2]), float("nan"), dtype=args[0].dtype, device=device)
        kwargs["out"] = out.permute(1, 2, 0)  # [num_tokens, num_q_heads, head_dim_v], head_dim_v outermost
    return args, kwargs


def _outputs(result):
    return [t.clone() for t in (result if isinstance(result, tuple) else (result,))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OUTPUT_CASES)
def test_a_plan_hit_computes_what_the_full_path_computes(name, device):
    """The hit's outputs equal the first call's bit for bit; on CUDA it launches compiled. The first call, a miss,
    is the full path: kernels.contract's entry runs the same implementation on a miss as with plans off, then
    files the plan (the launches of both are compared above, with plans off)."""
    triton_paged = needs_triton(device)
    args, kwargs = _output_call(*OUTPUT_CASES[name], device)
    triton_paged.PLANS.clear()
    first = _outputs(kernels.paged_attention_triton(*args, **kwargs))
    second = _outputs(kernels.paged_attention_triton(*args, **kwargs))
    assert triton_paged.PLANS.hits == 1
    if device == "cuda":
        (plan,) = [recipe.plan for recipe in triton_paged.PLANS.plans()]
        assert launch_plan.fast_launch_status() == "compiled kernel" and plan.main.compiled is not None
        assert plan.combine is None or plan.combine.compiled is not None
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))
    assert not first[0].isnan().all()


def test_a_misspelled_option_is_refused_naming_it_even_after_a_hit(recorded):
    """The options reach the entry as **options: a name the contract lacks is never served a plan."""
    args = base_args()
    for _ in range(2):
        _launches(recorded, args, {"sliding_window": 4})
    with pytest.raises(TypeError, match="sliding_windw"):
        kernels.paged_attention_triton(*args, sliding_windw=4)
    assert call_key(*args, None, None, None, None, False, {"sliding_windw": 4}) is None
