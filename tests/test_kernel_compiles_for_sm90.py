"""The Triton kernels compile for an H100/H200 (sm_90) on a machine without a GPU.

The CPU suite runs the kernels under Triton's interpreter, which accepts some programs
the compiler rejects (loop-carried types, scalar control flow such as the binary search
in ``_find_seq``). Compiling to PTX and through ptxas here catches those before a GPU run.
It runs in a fresh interpreter: in this process Triton was imported with TRITON_INTERPRET=1.
"""

from __future__ import annotations

import importlib.util
import inspect
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


# The split decode's tile loop, as SASS instructions a warp a tile, against the unsplit one's: the split start
# spelled a multiple of TILE_N and the unsigned block column / slot (POS_UNSIGNED) keep it as short (with signed
# arithmetic from a start the compiler cannot prove non-negative it took 1086 against 801 with Triton 3.6;
# gpu_results/2026-12-02-h200-split-decode). The split size is marked 16-divisible, as Triton's launcher marks it.
LOOP = r"""
import collections, os, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels import triton_paged as tp

def loop_length(splits, tile_n, offs_u32=False):
    fn = tp.paged_attention_kernel
    const = dict(GROUP_SIZE=4, HEADS_PER_PROGRAM=4, HEAD_TILES=1, HEAD_DIM=128, DIM_MAIN=128, DIM_TAIL=0,
                 HEAD_DIM_V=128, HEAD_DIM_V_PADDED=128, V_PARTS=1, V_PART_DIM=128, BLOCK_SIZE=16, BLOCK_M=16,
                 BLOCK_Q=4, TILE_N=tile_n, DOT_PRECISION="tf32", INTERPRETED_BF16=False, ONE_QUERY_PER_SEQ=True,
                 NUM_SPLITS=splits, USE_WINDOW=False, USE_SOFTCAP=False, USE_ALIBI=False, USE_SINKS=False,
                 RETURN_LSE=False, KV_FP8=False, FP16_DOTS=False, V_PAIRS=False, INTERPRETED=False,
                 BLOCK_OFFS_U32=offs_u32)
    names, sig, marked = fn.arg_names, {}, []
    for p in fn.params:
        if p.is_constexpr:
            sig[p.name] = "constexpr"
        elif p.name.endswith("_ptr"):
            sig[p.name] = "*bf16" if p.name in ("q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr") else "*fp32"
            if p.name in ("block_table_ptr", "seq_lens_ptr", "query_start_loc_ptr"):
                sig[p.name] = "*i32"
            marked.append(p.name)
        else:
            sig[p.name] = "fp32" if p.name in ("qk_scale_log2", "cap_unscaled", "inv_cap_unscaled") else "i32"
            if p.name.startswith("stride") or p.name in ("split_size", "num_blocks", "max_blocks_per_seq"):
                marked.append(p.name)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in marked}
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in const.items()}, attrs=attrs)
    cubin = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=3)).asm["cubin"]
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "--dump-sass", f.name], capture_output=True, text=True, check=True).stdout
    ins = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]+)\*/\s+([^;]*);", sass)]
    index = {a: i for i, (a, _) in enumerate(ins)}
    bodies = []
    for i, (a, text) in enumerate(ins):
        m = re.search(r"BRA .*?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < a and int(m.group(1), 16) in index:
            bodies.append(i + 1 - index[int(m.group(1), 16)])
    return [n for n in bodies if n > 100][0]  # the first tile loop (the unmasked one), not the table check's

for tile_n in (32, 128):
    print(tile_n, loop_length(1, tile_n), loop_length(16, tile_n))
print("u32", loop_length(1, 32), loop_length(1, 32, True))
"""


@pytest.mark.skipif(not kernels.has_triton() or not _ptxas_available(), reason="needs Triton with its NVIDIA backend")
def test_the_split_decodes_tile_loop_is_no_longer_than_the_unsplit_ones():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_DEFAULT_FP_FUSION": "1"}
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run([sys.executable, "-c", LOOP], cwd=root, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    _, signed, unsigned = lines.pop().split()
    # The block offsets as unsigned 32 x 32 -> 64-bit products (BLOCK_OFFS_U32) and the unmasked loop's unsigned
    # table checks: Triton 3.9, 32-key tiles, 289 before either, 270 with the checks, 253 with both (Triton 3.6,
    # 128-key tiles: 801 -> 700 -> 635; gpu_results/2026-12-02-h200-tile-loop).
    assert int(unsigned) <= int(signed) * 0.95 <= 270, f"unsigned block offsets {unsigned}, signed {signed}"
    for line in lines:
        tile_n, unsplit, split = map(int, line.split())
        assert split <= unsplit * 1.03, (
            f"{tile_n}-key tiles: {split} SASS instructions a warp a tile split, {unsplit} unsplit"
        )


@pytest.mark.parametrize(
    "num_blocks, block_stride, unsigned",
    [(40, 2048, True), (40, 2**31 - 2, True), (40, 2**31, False), (40, 1, False), (2**31 + 1, 2048, True)],
)
def test_the_launcher_takes_unsigned_block_offsets_for_ordinary_strides(num_blocks, block_stride, unsigned):
    """BLOCK_OFFS_U32 reaches the launch when K's and V's block strides are in [2, 2^31), and not otherwise;
    the kernel's num_blocks is capped at 2^31 (its unsigned table check stays an exact 32-bit compare)."""
    import torch

    from kernels.contract import prepare_call
    from kernels.triton_paged import TritonPlan, paged_attention_kernel

    meta = dict(device="meta", dtype=torch.bfloat16)
    q = torch.empty(4, 8, 64, **meta)
    k = torch.empty_strided((num_blocks, 16, 2, 64), (block_stride, 128, 64, 1), **meta)
    table = torch.empty(4, 8, dtype=torch.int32, device="meta")
    lens = torch.empty(4, dtype=torch.int32, device="meta")
    plan = TritonPlan(
        prepare_call(q, k, torch.empty_like(k), table, lens, check=False), torch.empty_like(q), None, 1, 128
    )
    assert plan.main.constexprs["BLOCK_OFFS_U32"] is unsigned
    names = list(inspect.signature(paged_attention_kernel.fn).parameters)
    scalars = names[names.index("qk_scale_log2") :]
    assert plan.main.scalars[scalars.index("num_blocks")] == min(num_blocks, 2**31)
