"""The Triton kernels compile for an H100/H200 (sm_90) on a machine without a GPU.

The interpreter accepts programs the compiler rejects (loop-carried types, scalar control flow), so
this compiles through ptxas, in a fresh interpreter (here Triton was imported with TRITON_INTERPRET=1)."""

from __future__ import annotations

import inspect
import json

import pytest
import torch

from kernels.contract import prepare_call
from kernels.triton_paged import TritonPlan, paged_attention_kernel
from tests.fresh_python import needs_ptxas, run_fresh

COMPILE = r"""
from kernels import triton_paged as tp
from scripts.sass_census import compile_kernel

OFF = dict(USE_WINDOW=False, USE_SOFTCAP=False, USE_ALIBI=False, USE_SINKS=False, RETURN_LSE=False, KV_FP8=False,
           FP16_DOTS=False, V_PAIRS=False, INTERPRETED=False)


def compile_for_sm90(fn, dtype, kv_dtype=None, **meta):
    compile_kernel(fn, meta, dtype, kv_dtype)  # no launcher specialization: any alignment, any int


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


@pytest.mark.slow  # a fresh interpreter compiles through ptxas
@needs_ptxas
def test_kernels_compile_for_sm90_without_a_gpu():
    result = run_fresh("-c", COMPILE)
    assert result.returncode == 0 and result.stdout.strip() == "compiled", result.stderr[-3000:]


# The split decode's tile loop, as SASS instructions a warp a tile, against the unsplit one's: the split start
# spelled a multiple of TILE_N and the unsigned block column / slot (POS_UNSIGNED) keep it as short (signed
# arithmetic from a start the compiler cannot prove non-negative lengthens it by a third). The split size is
# marked 16-divisible, as Triton's launcher marks it.
LOOP = r"""
from scripts.sass_census import census

def loop(**overrides):  # the first tile loop (the unmasked one), a launch without query_start_loc
    return census("decode_4x16k (split)", dict(ONE_QUERY_PER_SEQ=True, **overrides))["loop"]

for tile_n in (32, 128):
    print(tile_n, loop(TILE_N=tile_n, NUM_SPLITS=1), loop(TILE_N=tile_n))
print("u32", loop(NUM_SPLITS=1, BLOCK_OFFS_U32=False), loop(NUM_SPLITS=1))
"""


@pytest.mark.slow  # a fresh interpreter compiles through ptxas
@needs_ptxas
def test_the_split_decodes_tile_loop_is_no_longer_than_the_unsplit_ones():
    result = run_fresh("-c", LOOP)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    _, signed, unsigned = lines.pop().split()
    # The block offsets as unsigned 32 x 32 -> 64-bit products (BLOCK_OFFS_U32) shorten the unmasked loop, whose
    # unsigned table checks keep it at 270 instructions or fewer at 32-key tiles.
    assert int(unsigned) <= int(signed) * 0.95 <= 270, f"unsigned block offsets {unsigned}, signed {signed}"
    for line in lines:
        tile_n, unsplit, split = map(int, line.split())
        assert split <= unsplit * 1.03, (
            f"{tile_n}-key tiles: {split} SASS instructions a warp a tile split, {unsplit} unsplit"
        )


@pytest.mark.slow  # a fresh interpreter compiles through ptxas
@needs_ptxas
def test_the_sass_census_tables_a_launch_and_set_changes_its_count(tmp_path):
    """sass_census on one launch: positive counts, the same JSON, ``--set`` reaching the compile, errors naming."""
    census = ("scripts/sass_census.py", "--only", "decode_4x16k")
    done = run_fresh(*census, "--json", str(tmp_path / "a.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    header, rule, *rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith("|")]
    assert len(rows) == 1 and len(header) == len(rule) == len(rows[0]) and "loop" in header[5]
    row = json.loads((tmp_path / "a.json").read_text())["rows"][0]
    assert rows[0][0].strip() == row["launch"] == "decode_4x16k (split)" and int(rows[0][5]) == row["loop"]
    assert min(row["loop"], row["masked_loop"], row["registers"], row["shared"], sum(row["classes"].values())) > 0
    signed = run_fresh(*census, "--set", "BLOCK_OFFS_U32=False", "--json", str(tmp_path / "b.json"))
    assert signed.returncode == 0, signed.stderr[-3000:]
    assert json.loads((tmp_path / "b.json").read_text())["rows"][0]["loop"] > row["loop"]
    unknown = run_fresh("scripts/sass_census.py", "--only", "no_such_launch")
    assert unknown.returncode == 2 and "'no_such_launch'" in unknown.stderr, unknown.stderr
    bad = run_fresh(*census, "--set", "NO_SUCH=1")
    assert bad.returncode == 1 and "'decode_4x16k (split)': --set NO_SUCH" in bad.stderr, bad.stderr


@pytest.mark.parametrize(
    "num_blocks, block_stride, unsigned",
    [(40, 2048, True), (40, 2**31 - 2, True), (40, 2**31, False), (40, 1, False), (2**31 + 1, 2048, True)],
)
def test_the_launcher_takes_unsigned_block_offsets_for_ordinary_strides(num_blocks, block_stride, unsigned):
    """BLOCK_OFFS_U32 only for K and V block strides in [2, 2^31); num_blocks is capped at 2^31."""
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
