"""A V head dim different from K's (MLA: K 576 / V 512 over one KV head; and K 192 / V 128).

v_cache is [num_blocks, block_size, num_kv_heads, head_dim_v], out [num_tokens, num_q_heads, head_dim_v].
Every built-in backend matches the oracle; the kernel loads K past 256 columns in two pieces and tiles a
large group's heads (kernels.tiling); the peers skip, naming the option (test_attention_variants.py)."""

from __future__ import annotations

import pytest
import torch

import kernels
from harness.cases.inputs import make_inputs
from harness.cases.spec import CaseFileError, expand_spec
from harness.cases.vocab import DEFAULT_TOLERANCES
from harness.run.grading import grade
from harness.run.oracle import paged_attention_oracle
from harness.run.runner import case_inputs
from harness.timing.metrics import bytes_moved
from kernels import tiling, tuning
from kernels.contract import prepare_call
from kernels.launch_plan import call_key, clear_plans, plans_enabled
from kernels.tiling import head_dim_pieces, heads_per_program, is_latent_view, latent_kv, tiling_for, v_parts
from tests.kernels.kernel_cases import KernelCase, assert_passes, backend_grid, graded_inputs, needs_triton, run_backend

SHAPES = {  # num_q_heads, num_kv_heads, head_dim, head_dim_v, dtype, seq_lens, q_lens
    "mla_decode_2_head_tiles": (32, 1, 576, 512, "bfloat16", [1, 40, 100], [1, 1, 1]),
    "mla_spec_verify": (16, 1, 576, 512, "float32", [30, 17], [3, 2]),
    "mla_split_kv": (32, 1, 576, 512, "float32", [600, 9], [1, 1]),  # two splits of 320 keys
    "mla_split_kv_bf16": (32, 1, 576, 512, "bfloat16", [600, 9], [1, 1]),  # wide tiling: V parts, split, lse
    "k192_v128_prefill": (8, 2, 192, 128, "float32", [1, 40, 100], [1, 5, 2]),
    "k192_v128_split_bf16": (4, 4, 192, 128, "bfloat16", [600, 44], [1, 1]),  # 44: its first split only
    "k64_v128_gqa": (8, 2, 64, 128, "float16", [20, 33], [4, 1]),
}
# On a GPU the split shapes run their longer histories (eight splits of the KV range, not two).
GPU_SEQ_LENS = {"mla_split_kv": [2100, 9], "mla_split_kv_bf16": [2100, 9], "k192_v128_split_bf16": [2500, 300]}


def _case(shape: str | tuple, device: str = "cpu") -> KernelCase:
    """SHAPES[shape] (on "cuda", with GPU_SEQ_LENS), or a tuple of SHAPES' fields, as a kernel case."""
    hq, hkv, d, dv, dtype, seq_lens, q_lens = SHAPES[shape] if isinstance(shape, str) else shape
    if device == "cuda" and isinstance(shape, str):
        seq_lens = GPU_SEQ_LENS.get(shape, seq_lens)
    return KernelCase(str(shape), hq, hkv, d, 16, tuple(seq_lens), tuple(q_lens), dtype, seed=1, head_dim_v=dv)


@pytest.mark.parametrize(("name", "backend", "device"), backend_grid(list(SHAPES), with_device=True))
def test_backend_matches_oracle_with_a_different_v_head_dim(name, backend, device):
    """On a GPU the kernel runs compiled (two K pieces, head tiles, shared memory), the split shapes at
    GPU_SEQ_LENS."""
    inputs, expected = graded_inputs(_case(name, device), device, return_lse=True)
    out, lse = run_backend(backend, inputs, return_lse=True)
    assert out.shape == (*inputs.q.shape[:2], inputs.v_cache.shape[3])
    assert_passes((out, lse), expected, DEFAULT_TOLERANCES[str(inputs.q.dtype).removeprefix("torch.")], backend)


def test_mla_tiling_splits_k_and_tiles_the_heads():
    call = prepare_call(*_case("mla_decode_2_head_tiles").inputs().args())
    assert head_dim_pieces(576) == (512, 64) and head_dim_pieces(192) == (256, 0)
    assert head_dim_pieces(300) == (256, 64) and head_dim_pieces(128) == (128, 0) and head_dim_pieces(80) == (128, 0)
    # bf16: the wide tiling, the whole group of 32 (up to WIDE_HEADS) a program and V's 512 dims in 2 parts
    assert heads_per_program(call) == 32 and call.group_size == 32 and v_parts(call) == 2
    tiling = tiling_for(call)
    assert tiling.BLOCK_M == 32 and tiling.BLOCK_Q == 1
    deepseek = prepare_call(*_case((128, 1, 576, 512, "bfloat16", [3], [1])).inputs().args())
    assert heads_per_program(deepseek) == 64 and v_parts(deepseek) == 2
    assert tiling_for(deepseek).BLOCK_M == 64
    fp32 = prepare_call(*_case("mla_split_kv").inputs().args())  # fp32 dots keep 16 heads a program and V whole
    assert heads_per_program(fp32) == 16 and v_parts(fp32) == 1 and tiling_for(fp32).BLOCK_M == 16
    small = prepare_call(*_case("k192_v128_prefill").inputs().args())
    assert heads_per_program(small) == small.group_size, "dims up to 256 keep the whole group in one program"
    group32 = prepare_call(*_case((32, 1, 128, 128, "float16", [3], [1])).inputs().args())
    assert heads_per_program(group32) == 32, "a group past 16 is cut to 16 a program only past head dim 256"
    group4 = prepare_call(*_case((4, 1, 300, 300, "float32", [3], [1])).inputs().args())
    assert heads_per_program(group4) == 4, "past head dim 256 a group of 16 or fewer stays whole"


def test_kernel_without_the_second_k_piece_fails(monkeypatch):
    """A kernel that dots only K's first 512 columns (the rope part forgotten) is caught."""
    triton_paged = needs_triton()
    inputs = _case("mla_spec_verify").inputs()
    expected = paged_attention_oracle(*inputs.args())
    monkeypatch.setattr(triton_paged, "head_dim_pieces", lambda head_dim: (512, 0))
    graded = grade(kernels.paged_attention_triton(*inputs.args()), expected, *DEFAULT_TOLERANCES["float32"])
    assert not graded.passed


def test_out_of_the_wrong_width_is_refused():
    inputs = _case("k192_v128_prefill").inputs()
    with pytest.raises(ValueError, match=r"out must be \(8, 8, 128\)"):
        kernels.paged_attention_tlsim(*inputs.args(), out=torch.empty_like(inputs.q))
    with pytest.raises(ValueError, match="v_cache"):
        kernels.paged_attention_tlsim(inputs.q, inputs.k_cache, inputs.v_cache[:, :, :1], *inputs.args()[3:])


# One tile config for both layouts when their outputs are compared bit for bit: the latent view's tuned
# entry may take tiles the separate V (its shared memory twice the view's) does not fit on a GPU.
def same_tiles():
    return tuning.override(tuning.TileConfig(max_rows=64, max_tokens=1, tile_n=32, num_warps=8, num_stages=2))


def _latent(inputs, device: str = "cpu"):
    """(view args, separate args) of ``inputs`` (or SHAPES[inputs]): V as a view of K's first columns, and a copy."""
    args = [a.to(device) for a in (_case(inputs, device).inputs() if isinstance(inputs, str) else inputs).args()]
    view = args[1][..., : args[2].shape[-1]]
    return [*args[:2], view, *args[3:]], [*args[:2], view.contiguous(), *args[3:]]


def _equal_at_same_tiles(view_args, separate_args, monkeypatch):
    """At one tile config the view's output and lse equal the separate tensors' bit for bit; the view's output."""
    clear_plans()
    out, lse = kernels.paged_attention_triton(*view_args, return_lse=True)
    monkeypatch.setattr(tiling, "V_PART_DIM", 512)  # the separate tensors' V whole too: the same tiles
    clear_plans()
    same, same_lse = kernels.paged_attention_triton(*separate_args, return_lse=True)
    assert torch.equal(out, same) and torch.equal(lse, same_lse)
    return out


def test_latent_kv_is_told_from_metadata_only():
    view_args, separate_args = _latent("mla_decode_2_head_tiles")
    view = prepare_call(*view_args)
    assert latent_kv(view) and v_parts(view) == 1 and tiling_for(view).TUNING_KEY[0] == "half_latent"
    separate = prepare_call(*separate_args)
    assert not latent_kv(separate) and v_parts(separate) == 2 and tiling_for(separate).TUNING_KEY[0] == "half"
    fp32 = prepare_call(*_latent("mla_split_kv")[0])  # the 16-head tiling keeps V a tensor of its own
    assert not latent_kv(fp32)
    # The plan key tells the view from a V of the same shape and strides elsewhere (a latent plan on
    # separate tensors would read K's values as V).
    other = view_args[1].clone()[..., :512]
    assert other.stride() == view_args[2].stride()
    with plans_enabled(True):
        keys = [
            call_key(*a, None, None, None, None, False, {})
            for a in (view_args, [*view_args[:2], other, *view_args[3:]])
        ]
    assert None not in keys and keys[0] != keys[1]


def test_the_launch_takes_v_from_the_k_tile_only_for_the_view(recorded):
    """SHARED_KV reaches the launch for the latent view only (the outputs are equal either way)."""
    view_args, separate_args = _latent("mla_decode_2_head_tiles")
    for args, shared in ((view_args, True), (separate_args, False)):
        recorded.launches.clear()
        kernels.paged_attention_triton(*args)
        constexprs = recorded.launches[0][2]
        assert constexprs["SHARED_KV"] is shared and (constexprs["V_PARTS"] == 1) is shared


@pytest.mark.parametrize("name", ["mla_decode_2_head_tiles", "mla_split_kv_bf16"])
@pytest.mark.slow  # long interpreted split-KV calls
def test_latent_kv_gives_the_separate_tensors_output(name, monkeypatch):
    """V from the K tile against V of its own, same tiles: identical outputs and lse, and the oracle's pass."""
    needs_triton()
    view_args, separate_args = _latent(name)
    expected = paged_attention_oracle(*separate_args)
    assert grade(kernels.paged_attention_triton(*view_args), expected, *DEFAULT_TOLERANCES["bfloat16"]).passed
    with same_tiles():
        out = _equal_at_same_tiles(view_args, separate_args, monkeypatch)
        monkeypatch.setattr(tiling, "LATENT_KV", False)  # the view as two tensors: the kernel loads V
        clear_plans()
        assert torch.equal(kernels.paged_attention_triton(*view_args), out)
    clear_plans()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["mla_decode_2_head_tiles", "mla_split_kv_bf16", "deepseek_128_heads"])
def test_triton_on_cuda_latent_kv_matches_separate(name, monkeypatch):
    """On a GPU: the latent view equals the separate tensors' bit for bit; both pass the oracle."""
    inputs = name  # a SHAPES name, or the inputs of DeepSeek's 128 heads
    if name == "deepseek_128_heads":
        inputs = make_inputs(num_q_heads=128, num_kv_heads=1, head_dim=576, head_dim_v=512, block_size=64,
                             seq_lens=[3000, 77, 1025], q_lens=[1, 1, 1], dtype="bfloat16", seed=2)  # fmt: skip
    view_args, separate_args = _latent(inputs, "cuda")
    assert latent_kv(prepare_call(*view_args))
    out, _lse = kernels.paged_attention_triton(*view_args, return_lse=True)
    expected = paged_attention_oracle(*[a.cpu() for a in separate_args])
    assert grade(out.cpu(), expected, *DEFAULT_TOLERANCES["bfloat16"]).passed
    default = kernels.paged_attention_triton(*separate_args)
    assert grade(default.cpu(), expected, *DEFAULT_TOLERANCES["bfloat16"]).passed
    with same_tiles():
        _equal_at_same_tiles(view_args, separate_args, monkeypatch)
    clear_plans()


def test_case_field_latent_kv_makes_v_a_view_of_k_that_survives_a_move():
    """``latent_kv = true``: V is K's first columns, one storage, also after a move; refused without a narrower V."""
    spec = {"name": "m", "num_q_heads": 16, "num_kv_heads": 1, "head_dim": 64, "head_dim_v": 32,
            "latent_kv": True, "dtype": "bfloat16", "seq_lens": [5, 40]}  # fmt: skip
    (case,) = expand_spec(spec, "t.toml")
    assert case.variants == {"head_dim_v", "latent_kv"}
    inputs = case_inputs(case, "cpu")
    assert inputs.v_cache.data_ptr() == inputs.k_cache.data_ptr()
    assert torch.equal(inputs.v_cache.nan_to_num(), inputs.k_cache[..., :32].nan_to_num())  # NaN: unowned slots
    moved = inputs.to("cuda" if torch.cuda.is_available() else "meta")
    assert moved.v_cache._base is moved.k_cache, "V stays a view of the moved K, not a copy of its own"
    assert moved.v_cache.shape == inputs.v_cache.shape and is_latent_view(moved.k_cache, moved.v_cache)
    # Only V at K's first element with K's block / slot / head strides is K's first columns: another
    # tensor on K's storage (a later column range, other strides) moves as a tensor of its own.
    big = torch.zeros(2, 4, 1, 600)
    k = big[..., :576]  # K not dense: a move makes it contiguous, and V must follow K's new strides
    assert is_latent_view(k, k[..., :512])
    assert not is_latent_view(k, big[..., 64:576])
    assert not is_latent_view(k, big.as_strided((2, 4, 1, 512), (2400, 300, 300, 1)))  # the slot stride differs
    assert not is_latent_view(k, k[..., :512].to(torch.float16))
    (separate,) = expand_spec({**spec, "latent_kv": False}, "t.toml")
    (same,) = expand_spec({**spec, "latent_kv": False, "head_dim_v": 64}, "t.toml")
    assert same.variants == frozenset(), "a V head dim equal to K's is no option"
    assert bytes_moved(separate) - bytes_moved(case) == 2 * 45 * 1 * 32, "a latent cache reads V inside K"
    for bad in ({"head_dim_v": None}, {"head_dim_v": 64}, {"kv_dtype": "float8_e4m3fn"}):
        with pytest.raises(CaseFileError, match="latent_kv"):
            expand_spec({**spec, **bad}, "t.toml")
