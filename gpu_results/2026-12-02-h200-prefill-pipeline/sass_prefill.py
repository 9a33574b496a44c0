"""The paged-attention kernel compiled for sm_90 on a machine without a GPU: registers, spills, shared
memory, and per tile loop the SASS instructions a warp runs a tile (spills and wgmma waits among them).

Adapted from gpu_results/2026-12-01-h200-fp8-round2/sass_loop.py for the bf16 prefill launch (group 4,
128-row tiles of 32 tokens, 8 warps, 2 stages: kernels.tuning's ("half", 128, "prefill")).

    PYTHONPATH=/path/to/triton-3.6:. python gpu_results/2026-12-01-h200-fp8-round2/sass_loop.py MODULE \
        [--q bf16] [--kv fp8e4nv] [--tile-n 128] [--warps 4] [--stages 3] [--set NAME=VALUE ...]

MODULE is a module path such as ``kernels.triton_paged``. The launch is the 8B prefill (group 4,
head dim 128, blocks of 16, 128-row tiles, query_start_loc given); every pointer and every stride is
marked 16-divisible as Triton's launcher marks them for these shapes. ``--set`` overrides a
constexpr (``--set FP16_DOTS=False``); a constexpr the module's kernel does not have is dropped, so
one command line serves the base kernel and the new one. ``--sass-out FILE`` keeps the whole SASS,
to compare two builds instruction by instruction (addresses stripped).
"""

from __future__ import annotations

import argparse
import ast
import collections
import importlib
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

F32_PTRS = {"lse_ptr", "partial_ptr", "sinks_ptr", "alibi_ptr", "k_scale_ptr", "v_scale_ptr"}
I32_PTRS = {"block_table_ptr", "seq_lens_ptr", "query_start_loc_ptr"}
FLOATS = {"qk_scale_log2", "cap_unscaled", "inv_cap_unscaled"}
SIZES = {"num_tokens", "num_seqs", "num_q_heads", "num_blocks", "max_blocks_per_seq"}


def compile_kernel(module: str, q: str, kv: str, tile_n: int, warps: int, stages: int, overrides: dict):
    kernel = importlib.import_module(module).paged_attention_kernel
    fp8 = kv.startswith("fp8")
    const = dict(GROUP_SIZE=4, HEADS_PER_PROGRAM=4, HEAD_TILES=1, HEAD_DIM=128, DIM_MAIN=128, DIM_TAIL=0, HEAD_DIM_V=128,
                 HEAD_DIM_V_PADDED=128, V_PARTS=1, V_PART_DIM=128, BLOCK_SIZE=16, BLOCK_M=128, BLOCK_Q=32, TILE_N=tile_n, DOT_PRECISION="tf32",
                 INTERPRETED_BF16=False, ONE_QUERY_PER_SEQ=False, NUM_SPLITS=1, USE_WINDOW=False, USE_SOFTCAP=False,
                 USE_ALIBI=False, USE_SINKS=False, RETURN_LSE=False, KV_FP8=fp8, FP16_DOTS=fp8 and q == "bf16",
                 V_PAIRS=fp8, PV_LAG=False, INTERPRETED=False)  # fmt: skip
    const.update(overrides)
    names = kernel.arg_names
    signature, marked = {}, []
    for name in names:
        if name in const:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            marked.append(name)
            signature[name] = "*fp32" if name in F32_PTRS else "*i32" if name in I32_PTRS else "*" + q
            if name in ("k_cache_ptr", "v_cache_ptr"):
                signature[name] = "*" + kv
        else:
            signature[name] = "fp32" if name in FLOATS else "i32"
            if name.startswith("stride") or name in SIZES:
                marked.append(name)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in marked}
    constexprs = {(names.index(n),): v for n, v in const.items() if n in names}
    src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))


def sass_of(cubin: bytes) -> tuple[str, str]:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "--dump-sass", f.name], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    return sass, usage


def loops(sass: str) -> list[tuple[int, list[str]]]:
    """Each backward branch's body: (start address, opcodes with modifiers)."""
    ins = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]+)\*/\s+([^;]*);", sass)]
    index = {a: i for i, (a, _) in enumerate(ins)}
    found = []
    for i, (a, text) in enumerate(ins):
        m = re.search(r"BRA .*?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < a and int(m.group(1), 16) in index:
            body = ins[index[int(m.group(1), 16)] : i + 1]
            found.append((body[0][0], [re.sub(r"^@!?U?P\w+\s+", "", t).split()[0] for _, t in body]))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("module")
    parser.add_argument("--q", default="bf16")
    parser.add_argument("--kv", default="bf16")
    parser.add_argument("--tile-n", type=int, default=128)
    parser.add_argument("--warps", type=int, default=8)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], help="NAME=VALUE (a Python literal)")
    parser.add_argument("--sass-out")
    parser.add_argument("--ttgir-out")
    args = parser.parse_args()
    overrides = {k: ast.literal_eval(v) for k, v in (s.split("=", 1) for s in args.set)}
    compiled = compile_kernel(args.module, args.q, args.kv, args.tile_n, args.warps, args.stages, overrides)
    sass, usage = sass_of(compiled.asm["cubin"])
    if args.ttgir_out:
        with open(args.ttgir_out, "w") as f:
            f.write(compiled.asm["ttgir"])
    if args.sass_out:
        with open(args.sass_out, "w") as f:
            f.write("\n".join(m.group(1) for m in re.finditer(r"/\*[0-9a-f]+\*/\s+([^;]*);", sass)))
    print(" ".join(re.findall(r"REG:\d+|STACK:\d+", usage)), "shared", compiled.metadata.shared)
    tile_loops = [body for _, body in loops(sass) if len(body) > 100]  # the tile loops, not the table check's
    whole = [m.group(1).split()[0] for m in re.finditer(r"/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([^;]*);", sass)]
    print(
        "function: HGMMA",
        whole.count("HGMMA.64x128x16.F32.BF16") + whole.count("HGMMA.64x64x16.F32.BF16"),
        "WARPGROUP.DEPBAR.LE",
        whole.count("WARPGROUP.DEPBAR.LE"),
        "(one a HGMMA: ptxas serialized the wgmma)",
    )
    for i, body in enumerate(tile_loops):
        counts = collections.Counter(op.split(".")[0] for op in body)
        print(
            f"tile loop {i}: {len(body)} instructions a warp a tile; HGMMA {counts['HGMMA']}, WARPGROUP.DEPBAR "
            f"{sum(1 for op in body if op.startswith('WARPGROUP.DEPBAR'))}, MUFU {counts['MUFU']}, "
            f"STL {counts['STL']}, LDL {counts['LDL']}, BAR {counts['BAR']}, LDGSTS {counts['LDGSTS']}"
        )


if __name__ == "__main__":
    main()
