"""The unmasked tile loop with p @ v one tile behind (kernels.tuning.TileConfig.pv_lag, the kernel's
PV_LAG: ``_attend_tiles_lagged``) gives the plain loop's output bit for bit, and its sm_90 build keeps
the wgmma asynchronous (ptxas serialized them all when the loop's first tile sat under an ``if``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernels
from harness.cases.inputs import make_inputs
from kernels import tuning
from kernels.contract import prepare_call
from kernels.tiling import tiling_for
from tests.test_kernel_compiles_for_sm90 import _ptxas_available

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Prefill (70 of 70 keys), a sequence whose first query tiles have no whole tile to see (12 of 40), a
# chunk over a history (33 of 90), GQA 4; 16-key tiles so that these short sequences walk several.
SHAPE = dict(num_q_heads=8, num_kv_heads=2, head_dim=64, block_size=16, seq_lens=[70, 40, 90], q_lens=[70, 12, 33])
CASES = {
    "bfloat16": dict(dtype="bfloat16"),
    "float16": dict(dtype="float16"),
    "float32": dict(dtype="float32"),
    "bfloat16_softcap_alibi": dict(dtype="bfloat16", logit_softcap=5.0, alibi=True),
    "bfloat16_fp8_cache": dict(dtype="bfloat16", kv_dtype="float8_e4m3fn"),
    "bfloat16_window": dict(dtype="bfloat16", sliding_window=20),  # no unmasked tile: the plain loops run
    "bfloat16_lse_sinks": dict(dtype="bfloat16", return_lse=True, sinks=[0.5, -1.0, 2.0, 0.0, 1.0, -0.5, 0.25, 3.0]),
}


def _run(inputs, lag: bool, tile_n: int, max_seq_len: int | None = None):
    config = tuning.TileConfig(max_rows=64, max_tokens=16, tile_n=tile_n, num_warps=4, num_stages=2, pv_lag=lag)
    with tuning.override(config):
        call = prepare_call(*inputs.args(), check=False)
        assert tiling_for(call, max_seq_len=max_seq_len).PV_LAG is lag
        result = kernels.paged_attention_triton(*inputs.args(), max_seq_len=max_seq_len, **inputs.options)
    return result if isinstance(result, tuple) else (result,)


@pytest.mark.parametrize("name", list(CASES))
def test_the_lagged_loop_moves_no_bit(name):
    if reason := kernels.triton_unavailable_reason(DEVICE):
        pytest.skip(reason)
    inputs = make_inputs(**SHAPE, **CASES[name], seed=3, device=DEVICE)
    plain, lagged = _run(inputs, False, 16), _run(inputs, True, 16)
    for a, b in zip(plain, lagged, strict=True):
        assert not a.isnan().any()
        assert torch.equal(a, b), f"{name}: the lagged loop is {float((a.float() - b.float()).abs().max()):.3g} off"


def test_the_lagged_loop_moves_no_bit_across_kv_splits():
    """A split's unmasked range starts at its own kv_start; the last split's rows past the others' keys."""
    if reason := kernels.triton_unavailable_reason(DEVICE):
        pytest.skip(reason)
    shape = {**SHAPE, "num_kv_heads": 1, "num_q_heads": 4, "seq_lens": [600, 1100], "q_lens": [40, 40]}
    inputs = make_inputs(**shape, dtype="bfloat16", seed=5, device=DEVICE)
    with tuning.override(tuning.TileConfig(64, 16, 32, 4, 2, pv_lag=True)):
        assert tiling_for(prepare_call(*inputs.args(), check=False)).NUM_SPLITS > 1
    (plain,), (lagged,) = _run(inputs, False, 32), _run(inputs, True, 32)
    assert torch.equal(plain, lagged)


def test_no_tuned_entry_takes_the_lagged_loop_yet():
    """Measured on an H200 (gpu_results/2026-12-02-h200-prefill-pipeline): the lag needs 64-key tiles (at 128 the
    loop spills), which lose more than it gains against the prefill entry's 128; every entry keeps it off."""
    assert not any(config.pv_lag for config in tuning.TUNED.values())


LAGGED_SM90 = r"""
import re, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels import triton_paged as tp
from kernels.tuning import TileConfig

config = TileConfig(max_rows=128, max_tokens=32, tile_n=64, num_warps=8, num_stages=2, pv_lag=True)  # the one timed
meta = dict(GROUP_SIZE=4, HEADS_PER_PROGRAM=4, HEAD_TILES=1, HEAD_DIM=128, DIM_MAIN=128, DIM_TAIL=0, HEAD_DIM_V=128,
            HEAD_DIM_V_PADDED=128, V_PARTS=1, V_PART_DIM=128, BLOCK_SIZE=16, BLOCK_M=config.max_rows,
            BLOCK_Q=config.max_rows // 4, TILE_N=config.tile_n, DOT_PRECISION="tf32", INTERPRETED_BF16=False,
            ONE_QUERY_PER_SEQ=False, NUM_SPLITS=1, USE_WINDOW=False, USE_SOFTCAP=False, USE_ALIBI=False,
            USE_SINKS=False, RETURN_LSE=False, KV_FP8=False, FP16_DOTS=False, V_PAIRS=False, PV_LAG=config.pv_lag,
            INTERPRETED=False)
fn = tp.paged_attention_kernel
sig = {p.name: "constexpr" if p.is_constexpr else ("*i32" if p.name in ("block_table_ptr", "seq_lens_ptr",
       "query_start_loc_ptr") else "*fp32" if p.name in ("lse_ptr", "partial_ptr", "sinks_ptr", "alibi_ptr",
       "k_scale_ptr", "v_scale_ptr") else "*bf16" if p.name.endswith("_ptr") else "fp32" if p.name in (
       "qk_scale_log2", "cap_unscaled", "inv_cap_unscaled") else "i32") for p in fn.params}
# Pointers, strides and sizes 16-divisible, as Triton's launcher marks them for these shapes.
marked = [n for n in fn.arg_names if n.endswith("_ptr") or n.startswith("stride") or n in (
          "num_tokens", "num_seqs", "num_q_heads", "num_blocks", "max_blocks_per_seq")]
src = ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in meta.items()},
                attrs={(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in marked})
compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=config.num_warps, num_stages=config.num_stages))
sass = compiled.asm["sass"]
print(len(re.findall(r"\bHGMMA\.", sass)), len(re.findall(r"WARPGROUP\.DEPBAR", sass)), len(re.findall(r"\bSTL\b", sass)))
"""


@pytest.mark.skipif(not kernels.has_triton() or not _ptxas_available(), reason="needs Triton with its NVIDIA backend")
def test_the_lagged_prefill_keeps_its_wgmma_async_on_sm90():
    """The lagged bf16 prefill as timed (128-row tiles, 64-key tiles, 8 warps, 2 stages). Serialized, ptxas
    waits for each wgmma before the next issues: one WARPGROUP.DEPBAR a HGMMA."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_DEFAULT_FP_FUSION": "1"}
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", LAGGED_SM90], cwd=root, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    hgmma, waits, spills = map(int, done.stdout.split())
    assert waits < hgmma // 2, f"{waits} wgmma waits for {hgmma} HGMMA: ptxas serialized them"
    assert spills == 0, f"{spills} spill stores"
