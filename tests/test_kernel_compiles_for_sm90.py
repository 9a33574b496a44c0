"""The Triton kernels compile for an H100/H200 (sm_90) on a machine without a GPU.

The CPU suite runs the kernels under Triton's interpreter, which accepts some programs
the compiler rejects (loop-carried types, scalar control flow such as the binary search
in ``_find_seq``). Compiling to PTX and through ptxas here catches those before a GPU run.
It runs in a fresh interpreter: in this process Triton was imported with TRITON_INTERPRET=1.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kernels

COMPILE = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels import triton_paged as tp

FLOATS = {"qk_scale_log2"}


F32_PTRS = {"lse_ptr", "sinks_ptr", "alibi_ptr", "k_scale_ptr", "v_scale_ptr"}
OFF = dict(USE_WINDOW=False, USE_SOFTCAP=False, USE_ALIBI=False, USE_SINKS=False, RETURN_LSE=False, KV_FP8=False,
           FP16_DOTS=False, V_PAIRS=False, INTERPRETED=False)


def compile_for_sm90(fn, dtype, kv_dtype=None, **meta):
    names = fn.arg_names
    sig = {}
    for param in fn.params:
        name = param.name
        if param.is_constexpr:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = "*fp32" if name.startswith("partial") or name in F32_PTRS else ("*i32" if name in (
                "block_table_ptr", "seq_lens_ptr", "query_start_loc_ptr") else "*" + dtype)
            if name in ("k_cache_ptr", "v_cache_ptr") and kv_dtype:
                sig[name] = "*" + kv_dtype
        else:
            sig[name] = "fp32" if name in FLOATS | {"cap_unscaled", "inv_cap_unscaled"} else "i32"
    constexprs = {(names.index(k),): v for k, v in meta.items()}
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs), target=GPUTarget("cuda", 90, 32))


main = dict(HEAD_DIM=128, DIM_MAIN=128, DIM_TAIL=0, HEAD_DIM_V=128, HEAD_DIM_V_PADDED=128, BLOCK_SIZE=16, TILE_N=64,
            INTERPRETED_BF16=False, HEAD_TILES=1, V_PARTS=1, V_PART_DIM=128)
compile_for_sm90(tp.paged_attention_kernel, "fp16", GROUP_SIZE=4, HEADS_PER_PROGRAM=4, BLOCK_M=64, BLOCK_Q=16,
                 DOT_PRECISION="tf32", ONE_QUERY_PER_SEQ=False, NUM_SPLITS=4, **main, **OFF)
compile_for_sm90(tp.paged_attention_kernel, "fp32", GROUP_SIZE=4, HEADS_PER_PROGRAM=4, BLOCK_M=16, BLOCK_Q=4,
                 DOT_PRECISION="ieee", ONE_QUERY_PER_SEQ=True, NUM_SPLITS=1, **main, **OFF)
# Every variant on, an fp8 e4m3 cache and the lse (single pass), bf16 q.
compile_for_sm90(tp.paged_attention_kernel, "bf16", kv_dtype="fp8e4nv", GROUP_SIZE=4, HEADS_PER_PROGRAM=4, BLOCK_M=64,
                 BLOCK_Q=16, DOT_PRECISION="tf32", ONE_QUERY_PER_SEQ=False, NUM_SPLITS=1, **main,
                 **{**OFF, "USE_WINDOW": True, "USE_SOFTCAP": True, "USE_ALIBI": True, "USE_SINKS": True,
                    "RETURN_LSE": True, "KV_FP8": True})
# The fp8 decode: bf16 q scaled into fp16, V read as uint16 pairs and split by PTX (e4m3 and e5m2), 256-key tiles.
for fp8 in ("fp8e4nv", "fp8e5"):
    compile_for_sm90(tp.paged_attention_kernel, "bf16", kv_dtype=fp8, GROUP_SIZE=4, HEADS_PER_PROGRAM=4, BLOCK_M=16,
                     BLOCK_Q=4, DOT_PRECISION="tf32", ONE_QUERY_PER_SEQ=False, NUM_SPLITS=1,
                     **{**main, "TILE_N": 256}, **{**OFF, "KV_FP8": True, "FP16_DOTS": True, "V_PAIRS": True})
# MLA decode: K 576 = 512 + 64, V 512, 128 heads a KV head in 8 tiles of 16, split KV.
mla = {**main, "HEAD_DIM": 576, "DIM_MAIN": 512, "DIM_TAIL": 64, "HEAD_DIM_V": 512, "HEAD_DIM_V_PADDED": 512,
       "TILE_N": 32, "HEAD_TILES": 8, "V_PART_DIM": 512}
compile_for_sm90(tp.paged_attention_kernel, "bf16", GROUP_SIZE=128, HEADS_PER_PROGRAM=16, BLOCK_M=16, BLOCK_Q=1,
                 DOT_PRECISION="tf32", ONE_QUERY_PER_SEQ=True, NUM_SPLITS=8, **mla, **OFF)
# The wide tiling (kernels.tiling.WIDE_HEADS): 64 heads a program, V in 2 parts of 256, split KV with sinks and the lse.
compile_for_sm90(tp.paged_attention_kernel, "bf16", GROUP_SIZE=128, HEADS_PER_PROGRAM=64, BLOCK_M=64, BLOCK_Q=1,
                 DOT_PRECISION="tf32", ONE_QUERY_PER_SEQ=True, NUM_SPLITS=4,
                 **{**mla, "HEAD_TILES": 2, "V_PARTS": 2, "V_PART_DIM": 256},
                 **{**OFF, "USE_SINKS": True, "RETURN_LSE": True})
compile_for_sm90(tp.combine_splits_kernel, "fp16", NUM_Q_HEADS=32, HEAD_DIM_V=128, HEAD_DIM_V_PADDED=128, NUM_SPLITS=4,
                 INTERPRETED_BF16=False, USE_SINKS=True, RETURN_LSE=True)
compile_for_sm90(tp.combine_splits_kernel, "bf16", NUM_Q_HEADS=128, HEAD_DIM_V=512, HEAD_DIM_V_PADDED=512, NUM_SPLITS=8,
                 INTERPRETED_BF16=False, USE_SINKS=False, RETURN_LSE=False)
print("compiled")
"""


def _ptxas_available() -> bool:
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return False
    return (Path(next(iter(spec.submodule_search_locations))) / "backends" / "nvidia" / "bin" / "ptxas").exists()


@pytest.mark.skipif(not kernels.has_triton() or not _ptxas_available(), reason="needs Triton with its NVIDIA backend")
def test_kernels_compile_for_sm90_without_a_gpu():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_DEFAULT_FP_FUSION": "1"}
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run([sys.executable, "-c", COMPILE], cwd=root, env=env, capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "compiled", result.stderr[-3000:]
