"""SASS census of the Triton kernel's tile loop for the launches the GPU suites make, compiled for sm_90
on a machine without a GPU.

    PYTHONPATH=/path/to/triton-3.6:. python gpu_results/2026-12-02-h200-tile-loop/census.py [--module kernels.triton_paged]
        [--only NAME ...] [--sass-dir DIR] [--set NAME=VALUE ...]

Each launch is the one the registry's ``triton`` backend makes for the case (its query_start_loc
given, the max_q_len / max_seq_len hints an engine passes): the plan (``TritonPlan``) is built from
meta tensors of the case's shapes, so its constexprs, warps and stages are the launcher's. Triton's
launcher specializations are reproduced: every pointer 16-byte aligned, every int argument divisible
by 16 marked so, an int equal to 1 a constant. The first tile loop (the unmasked one, where a decode
spends its time) is counted, per warp and per tile, and its opcodes sorted into what a tile must do
(the K / V copies, shared-memory reads, dots, softmax) and what it pays besides (integer and address
arithmetic, predicates and masks, conversions, moves, control).
"""

from __future__ import annotations

import argparse
import ast
import collections
import importlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kernels.contract import prepare_call
from kernels.tiling import cdiv

F32_PTRS = {"lse_ptr", "partial_ptr", "sinks_ptr", "alibi_ptr", "k_scale_ptr", "v_scale_ptr"}
I32_PTRS = {"block_table_ptr", "seq_lens_ptr", "query_start_loc_ptr"}
FLOATS = {"qk_scale_log2", "cap_unscaled", "inv_cap_unscaled"}
DT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float8_e4m3fn: "fp8e4nv"}

# name: (q heads, KV heads, head dim, block size, seq lens, q dtype, KV dtype). The lengths set the split
# (max_seq_len) and the pool's size; the ragged / lognormal ones are their cases' extremes.
LAUNCHES = {
    "fp32 decode 8b": (32, 8, 128, 16, [1000, 4000] + [2500] * 30, torch.float32, None),
    "mla latent 32x8k": (128, 1, 576, 64, [8192] * 32, torch.bfloat16, None),
    "mla latent 128x2k": (128, 1, 576, 64, [2048] * 128, torch.bfloat16, None),
    "bf16 decode 128 (decode_32x4k, ragged)": (32, 8, 128, 16, [4096] * 32, torch.bfloat16, None),
    "decode_32x4k_hd64": (32, 8, 64, 16, [4096] * 32, torch.bfloat16, None),
    "decode_16x2k_mha40": (40, 40, 128, 16, [2048] * 16, torch.bfloat16, None),
    "gemma2_9b_hd256_decode": (16, 8, 256, 32, [500, 4000] + [2000] * 30, torch.bfloat16, None),
    "llama3_8b_decode fp16": (32, 8, 128, 16, [1000, 4000] + [2500] * 30, torch.float16, None),
    "fp8 decode (256-key)": (32, 8, 128, 16, [1000, 32000] + [4000] * 62, torch.bfloat16, torch.float8_e4m3fn),
    "fp8 split 8x32k (128-key)": (32, 8, 128, 16, [32768] * 8, torch.bfloat16, torch.float8_e4m3fn),
    "decode_32x4k_tp8_8q1kv (split)": (8, 1, 128, 16, [4096] * 32, torch.bfloat16, None),
    "decode_4x16k (split)": (32, 8, 128, 16, [16384] * 4, torch.bfloat16, None),
    "8b 4x128k (split long)": (32, 8, 128, 16, [131072] * 4, torch.bfloat16, None),
}


def plan_of(nq, nkv, hd, bs, lens, dtype, kv_dtype):
    """The launcher's plan for the case's shapes (meta tensors: nothing allocated, nothing read)."""
    from kernels.triton_paged import TritonPlan

    owned = sum(cdiv(n, bs) for n in lens)
    num_blocks = owned + max(1, owned // 8)
    meta = dict(device="meta")
    q = torch.empty(len(lens), nq, hd, dtype=dtype, **meta)
    k = torch.empty(num_blocks, bs, nkv, hd, dtype=kv_dtype or dtype, **meta)
    v = k[..., :512] if hd == 576 else torch.empty(num_blocks, bs, nkv, hd, dtype=kv_dtype or dtype, **meta)
    table = torch.empty(len(lens), max(cdiv(n, bs) for n in lens), dtype=torch.int32, **meta)
    seq_lens = torch.empty(len(lens), dtype=torch.int32, **meta)
    starts = torch.empty(len(lens) + 1, dtype=torch.int32, **meta)
    options = {}
    if kv_dtype is not None:
        options = dict(k_scale=torch.ones(nkv, **meta), v_scale=torch.ones(nkv, **meta))
    call = prepare_call(q, k, v, table, seq_lens, starts, check=False, **options)
    out = torch.empty_like(q[..., : v.shape[-1]])
    return TritonPlan(call, out, None, 1, max(lens)), (q, k, v)


def compile_plan(kernel, plan, tensors, overrides: dict):
    q, k, _v = tensors
    const = dict(plan.main.constexprs)
    const.update(INTERPRETED=False, INTERPRETED_BF16=False)
    if q.dtype != torch.float32:
        const["DOT_PRECISION"] = "tf32"
    const.update(overrides)
    names = kernel.arg_names
    const = {n: val for n, val in const.items() if n in names}
    scalar_names = [p.name for p in kernel.params if not p.is_constexpr and not p.name.endswith("_ptr")]
    values = dict(zip(scalar_names, plan.main.scalars, strict=True))
    signature, marked = {}, []
    for name in names:
        if name in const:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            marked.append(name)
            signature[name] = "*fp32" if name in F32_PTRS else "*i32" if name in I32_PTRS else "*" + DT[q.dtype]
            if name in ("k_cache_ptr", "v_cache_ptr"):
                signature[name] = "*" + DT[k.dtype]
        elif name in FLOATS:
            signature[name] = "fp32"
        else:
            val = int(values[name])
            if val == 1:  # Triton's launcher specializes an int equal to 1 as a constant
                signature[name] = "constexpr"
                const[name] = 1
            else:
                signature[name] = "i32"
                if val % 16 == 0:
                    marked.append(name)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in marked}
    constexprs = {(names.index(n),): val for n, val in const.items()}
    src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    options = dict(plan.main.options)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    return compiled, const, options


def sass_of(cubin: bytes) -> tuple[str, str]:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "--dump-sass", f.name], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    return sass, usage


def loops(sass: str) -> list[list[str]]:
    """Each backward branch's body, as instruction texts (predicates kept)."""
    ins = [(int(m.group(1), 16), m.group(2).strip()) for m in re.finditer(r"/\*([0-9a-f]+)\*/\s+([^;]*);", sass)]
    index = {a: i for i, (a, _) in enumerate(ins)}
    found = []
    for i, (a, text) in enumerate(ins):
        m = re.search(r"BRA .*?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < a and int(m.group(1), 16) in index:
            found.append([t for _, t in ins[index[int(m.group(1), 16)] : i + 1]])
    return found


def opcode(text: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]


# What a tile must do, and what it pays besides. Uniform-datapath ops (U*) are listed apart: they issue
# from the warp's instruction stream too, but the per-lane datapath is free meanwhile.
CLASSES = [
    ("copy", r"^(LDGSTS|LDG|LDGDEPBAR|DEPBAR|UTMALDG|SYNCS)"),
    ("smem", r"^(LDSM|LDS|STS|MOVM)"),
    ("mma", r"^(HGMMA|HMMA|WARPGROUP|UHGMMA)"),
    ("softmax", r"^(FMNMX|MUFU|FADD|FMUL|FFMA|FSETP|SHFL|FCHK|FSEL)"),
    ("convert", r"^(F2FP|F2F|I2F|F2I|PRMT|HADD2|HMUL2|HFMA2|I2FP|F2IP)"),
    ("int", r"^(IMAD|IADD3|LEA|SHF|LOP3|IMNMX|IABS|VIADD|IADD|ISCADD|SGXT|BMSK|FLO|POPC|IMUL)"),
    ("predicate", r"^(ISETP|PLOP3|SEL|P2R|R2P|VOTE|PSETP)"),
    ("move", r"^(MOV|S2R|CS2R|LDC|S2UR|R2UR)"),
    ("uniform", r"^U"),
    ("control", r"^(BAR|BRA|NOP|BSYNC|BSSY|WARPSYNC|YIELD|EXIT|CALL|RET|ELECT|MEMBAR|FENCE|ERRBAR|ACQBULK)"),
]


def classify(op: str) -> str:
    for name, pattern in CLASSES:
        if re.match(pattern, op):
            return name
    return "other"


def census(name, args, module, overrides, sass_dir):
    kernel = importlib.import_module(module).paged_attention_kernel
    plan, tensors = plan_of(*args)
    compiled, const, options = compile_plan(kernel, plan, tensors, overrides)
    sass, usage = sass_of(compiled.asm["cubin"])
    if sass_dir:
        safe = re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_")
        with open(os.path.join(sass_dir, safe + ".sass"), "w") as f:
            f.write("\n".join(m.group(1) for m in re.finditer(r"/\*[0-9a-f]+\*/\s+([^;]*);", sass)))
    reg = re.search(r"REG:(\d+)", usage).group(1)
    stack = re.search(r"STACK:(\d+)", usage).group(1)
    body = next(b for b in loops(sass) if len(b) > 100)  # the first tile loop (the unmasked one)
    ops = [opcode(t) for t in body]
    by_class = collections.Counter(classify(op) for op in ops)
    counts = collections.Counter(ops)
    tile_n = const["TILE_N"]
    return dict(
        name=name, tile_n=tile_n, warps=options["num_warps"], stages=options["num_stages"],
        block_m=const["BLOCK_M"], splits=const["NUM_SPLITS"], reg=int(reg), stack=int(stack),
        shared=compiled.metadata.shared, n=len(ops), per_key=len(ops) / tile_n * 128, classes=by_class, ops=counts,
        spill_ops=sum(n for op, n in counts.items() if op.startswith(("STL", "LDL"))),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--module", default="kernels.triton_paged")
    parser.add_argument("--only", nargs="*", help="substrings of launch names")
    parser.add_argument("--set", action="append", default=[], help="NAME=VALUE: a constexpr override")
    parser.add_argument("--sass-dir")
    parser.add_argument("--ops", action="store_true", help="every opcode of each loop")
    args = parser.parse_args()
    overrides = {k: ast.literal_eval(v) for k, v in (s.split("=", 1) for s in args.set)}
    names = [n for n in LAUNCHES if not args.only or any(s in n for s in args.only)]
    order = [c for c, _ in CLASSES] + ["other"]
    print("| launch | TILE_N x stages, splits | regs | stack | shared | loop | /128 keys | " + " | ".join(order) + " |")
    print("|" + " --- |" * (8 + len(order)))
    for name in names:
        r = census(name, LAUNCHES[name], args.module, overrides, args.sass_dir)
        print(
            f"| {name} | {r['tile_n']} x {r['stages']}, {r['splits']} | {r['reg']} | {r['stack']} | {r['shared']} | "
            f"{r['n']} | {r['per_key']:.0f} | " + " | ".join(str(r["classes"].get(c, 0)) for c in order) + " |",
            flush=True,
        )
        if args.ops:
            print("   ", ", ".join(f"{op} {n}" for op, n in r["ops"].most_common()), flush=True)


if __name__ == "__main__":
    main()
