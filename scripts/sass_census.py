"""SASS census of the Triton kernel's tile loop, compiled for sm_90 on a machine without a GPU: per launch,
the instructions a warp runs a tile in the unmasked and masked loops, registers, stack, spills, shared memory.

    PYTHONPATH=<triton-3.6 site>:. python scripts/sass_census.py [--only NAME ...] [--set NAME=VALUE ...] [--ops]

Each launch (LAUNCHES) is the triton backend's for the case, planned on meta tensors. ``--set``
overrides a constexpr or compile option; ``--module`` names another copy of the kernel."""

from __future__ import annotations

import argparse
import ast
import collections
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.contract import prepare_call
from kernels.tiling import cdiv

F32_PTRS = {"lse_ptr", "partial_ptr", "sinks_ptr", "alibi_ptr", "k_scale_ptr", "v_scale_ptr"}
I32_PTRS = {"block_table_ptr", "seq_lens_ptr", "query_start_loc_ptr"}
FLOATS = {"qk_scale_log2", "cap_unscaled", "inv_cap_unscaled"}
DT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float8_e4m3fn: "fp8e4nv",
      torch.float8_e5m2: "fp8e5"}  # fmt: skip
OPTIONS = {"num_warps", "num_stages"}


class Launch(NamedTuple):
    """A case's shapes (q_lens None: decode; latent: V a view of K's first head_dim_v columns)."""

    q_heads: int
    kv_heads: int
    head_dim: int
    block_size: int
    seq_lens: list[int]
    dtype: torch.dtype = torch.bfloat16
    kv_dtype: torch.dtype | None = None
    q_lens: list[int] | None = None
    head_dim_v: int | None = None
    latent: bool = False


BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn
# The ragged / lognormal lengths are their cases' extremes.
LAUNCHES = {
    "fp32 decode 8b": Launch(32, 8, 128, 16, [1000, 4000] + [2500] * 30, torch.float32),
    "mla latent 32x8k": Launch(128, 1, 576, 64, [8192] * 32, head_dim_v=512, latent=True),
    "mla latent 128x2k": Launch(128, 1, 576, 64, [2048] * 128, head_dim_v=512, latent=True),
    "mla 32x8k (two tensors)": Launch(128, 1, 576, 64, [8192] * 32, head_dim_v=512),
    "bf16 decode 128 (decode_32x4k, ragged)": Launch(32, 8, 128, 16, [4096] * 32),
    "decode_32x4k_hd64": Launch(32, 8, 64, 16, [4096] * 32),
    "decode_16x2k_mha40": Launch(40, 40, 128, 16, [2048] * 16),
    "gemma2_9b_hd256_decode": Launch(16, 8, 256, 32, [500, 4000] + [2000] * 30),
    "llama3_8b_decode fp16": Launch(32, 8, 128, 16, [1000, 4000] + [2500] * 30, torch.float16),
    "fp8 decode (256-key)": Launch(32, 8, 128, 16, [1000, 32000] + [4000] * 62, BF16, FP8),
    "fp8 split 8x32k (128-key)": Launch(32, 8, 128, 16, [32768] * 8, BF16, FP8),
    "decode_32x4k_tp8_8q1kv (split)": Launch(8, 1, 128, 16, [4096] * 32),
    "decode_4x16k (split)": Launch(32, 8, 128, 16, [16384] * 4),
    "8b 4x128k (split long)": Launch(32, 8, 128, 16, [131072] * 4),
    "spec_verify_32x4k q_len 8": Launch(32, 8, 128, 16, [4096] * 32, q_lens=[8] * 32),
    "prefill_4x4k": Launch(32, 8, 128, 16, [4096] * 4, q_lens=[4096] * 4),
}


def plan_of(launch: Launch):
    """The launcher's plan for the launch's shapes (meta tensors: nothing allocated, nothing read)."""
    from kernels.triton_paged import TritonPlan

    lens, bs, meta = launch.seq_lens, launch.block_size, dict(device="meta")
    q_lens = launch.q_lens or [1] * len(lens)
    owned = sum(cdiv(n, bs) for n in lens)
    num_blocks = owned + max(1, owned // 8)
    q = torch.empty(sum(q_lens), launch.q_heads, launch.head_dim, dtype=launch.dtype, **meta)
    k = torch.empty(num_blocks, bs, launch.kv_heads, launch.head_dim, dtype=launch.kv_dtype or launch.dtype, **meta)
    dim_v = launch.head_dim_v or launch.head_dim
    v = k[..., :dim_v] if launch.latent else torch.empty_like(k[..., :dim_v], memory_format=torch.contiguous_format)
    table = torch.empty(len(lens), max(cdiv(n, bs) for n in lens), dtype=torch.int32, **meta)
    seq_lens = torch.empty(len(lens), dtype=torch.int32, **meta)
    starts = torch.empty(len(lens) + 1, dtype=torch.int32, **meta)
    scales = {n: torch.ones(launch.kv_heads, **meta) for n in ("k_scale", "v_scale") if launch.kv_dtype is not None}
    call = prepare_call(q, k, v, table, seq_lens, starts, check=False, **scales)
    return TritonPlan(call, torch.empty_like(q[..., :dim_v]), None, max(q_lens), max(lens))


def compile_kernel(fn, constexprs: dict, q: str, kv: str | None = None, scalars: dict | None = None, options=None):
    """``fn`` compiled for sm_90, pointers typed by q's (or kv's) dtype; ``scalars``: the launcher's specializations."""
    names, const = fn.arg_names, dict(constexprs)
    signature, marked = {}, []
    for param in fn.params:
        name = param.name
        if param.is_constexpr:  # given, or its default
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            marked.append(name)
            data = kv if kv and name in ("k_cache_ptr", "v_cache_ptr") else q
            signature[name] = "*fp32" if name in F32_PTRS else "*i32" if name in I32_PTRS else "*" + data
        elif name in FLOATS:
            signature[name] = "fp32"
        elif scalars is not None and int(scalars[name]) == 1:  # the launcher specializes an int equal to 1
            signature[name], const[name] = "constexpr", 1
        else:
            signature[name] = "i32"
            if scalars is not None and int(scalars[name]) % 16 == 0:
                marked.append(name)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in marked} if scalars is not None else {}
    constexprs = {(names.index(n),): v for n, v in const.items()}
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def compile_launch(name: str, overrides: dict | None = None, module: str = "kernels.triton_paged"):
    """LAUNCHES[name]'s kernel compiled for sm_90 with ``overrides``: (compiled, constexprs, options)."""
    kernel = importlib.import_module(module).paged_attention_kernel
    overrides = overrides or {}
    if unknown := set(overrides) - OPTIONS - {p.name for p in kernel.params if p.is_constexpr}:
        raise ValueError(f"launch {name!r}: --set {', '.join(sorted(unknown))}: not a constexpr of {module}'s "
                         f"kernel nor one of {sorted(OPTIONS)}")  # fmt: skip
    launch = LAUNCHES[name]
    plan = plan_of(launch)
    const = dict(plan.main.constexprs, INTERPRETED=False, INTERPRETED_BF16=False)
    if launch.dtype != torch.float32:
        const["DOT_PRECISION"] = "tf32"
    const.update((k, v) for k, v in overrides.items() if k not in OPTIONS)
    const = {n: v for n, v in const.items() if n in kernel.arg_names}  # an older kernel lacks some
    options = dict(plan.main.options, **{k: v for k, v in overrides.items() if k in OPTIONS})
    scalar_names = [p.name for p in kernel.params if not p.is_constexpr and not p.name.endswith("_ptr")]
    scalars = dict(zip(scalar_names, plan.main.scalars, strict=True))
    kv = DT[launch.kv_dtype or launch.dtype]
    try:
        compiled = compile_kernel(kernel, const, DT[launch.dtype], kv, scalars, options)
    except Exception as e:
        raise RuntimeError(f"launch {name!r} with {overrides}: does not compile: {str(e)[:300]}") from e
    return compiled, const, options


def sass_of(cubin: bytes) -> tuple[str, str]:
    """The cubin's SASS and its resource usage (registers, stack), by Triton's own cuobjdump."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "--dump-sass", f.name], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    return sass, usage


def tile_loops(sass: str) -> list[list[str]]:
    """The tile loops (unmasked first): each backward branch's body of more than 100 instructions."""
    ins = [(int(m.group(1), 16), m.group(2).strip()) for m in re.finditer(r"/\*([0-9a-f]+)\*/\s+([^;]*);", sass)]
    index = {a: i for i, (a, _) in enumerate(ins)}
    found = []
    for i, (a, text) in enumerate(ins):
        m = re.search(r"BRA .*?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < a and int(m.group(1), 16) in index:
            found.append([t for _, t in ins[index[int(m.group(1), 16)] : i + 1]])
    return [body for body in found if len(body) > 100]


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
    ("other", r""),
]


def census(name: str, overrides: dict | None = None, module: str = "kernels.triton_paged") -> dict:
    """One table row of LAUNCHES[name] (``loop``: the unmasked loop's instructions a warp a tile)."""
    compiled, const, options = compile_launch(name, overrides, module)
    sass, usage = sass_of(compiled.asm["cubin"])
    loops = [[re.sub(r"^@!?U?P\w+\s+", "", t).split()[0] for t in body] for body in tile_loops(sass)]  # opcodes
    ops = collections.Counter(loops[0])
    classes = collections.Counter(next(c for c, p in CLASSES if re.match(p, op)) for op in loops[0])
    return dict(
        launch=name, tile_n=const["TILE_N"], warps=options["num_warps"], stages=options["num_stages"],
        block_m=const["BLOCK_M"], splits=const["NUM_SPLITS"], registers=int(re.search(r"REG:(\d+)", usage).group(1)),
        stack=int(re.search(r"STACK:(\d+)", usage).group(1)), shared=compiled.metadata.shared, loop=len(loops[0]),
        masked_loop=len(loops[1]) if len(loops) > 1 else None, per_128_keys=len(loops[0]) / const["TILE_N"] * 128,
        spill_ops=sum(n for op, n in ops.items() if op.startswith(("STL", "LDL"))),
        classes={c: classes[c] for c, _ in CLASSES}, ops=dict(ops.most_common()),
    )  # fmt: skip


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--module", default="kernels.triton_paged")
    parser.add_argument("--only", nargs="*", help="substrings of launch names")
    parser.add_argument("--set", action="append", default=[], help="NAME=VALUE (a Python literal): an override")
    parser.add_argument("--json", help="write the rows there as JSON")
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.set:
        key, _, value = item.partition("=")  # no "=": value "", which does not parse
        try:
            overrides[key.strip()] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            parser.error(f"--set {item!r}: want NAME=VALUE, VALUE a Python literal (--set TILE_N=64)")
    for s in args.only or []:
        if not any(s in n for n in LAUNCHES):
            parser.error(f"--only {s!r}: no launch's name contains it; the launches: {', '.join(LAUNCHES)}")
    names = [n for n in LAUNCHES if not args.only or any(s in n for s in args.only)]
    order = [c for c, _ in CLASSES]
    print("| launch | TILE_N x stages, splits | regs | stack | shared | loop | masked loop | LDL+STL | /128 keys | "
          + " | ".join(order) + " |")  # fmt: skip
    print("|" + " --- |" * (9 + len(order)))
    rows = []
    for name in names:
        try:
            r = census(name, overrides, args.module)
        except (ValueError, RuntimeError) as e:
            sys.exit(f"sass_census: {e}")
        rows.append(r)
        cells = [name, f"{r['tile_n']} x {r['stages']}, {r['splits']}", r["registers"], r["stack"], r["shared"],
                 r["loop"], r["masked_loop"] or "", r["spill_ops"], f"{r['per_128_keys']:.0f}",
                 *(r["classes"][c] for c in order)]  # fmt: skip
        print("| " + " | ".join(map(str, cells)) + " |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(triton=triton.__version__, set=overrides, rows=rows), indent=1))


if __name__ == "__main__":
    main()
