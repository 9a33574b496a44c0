"""fp8 decode against its bf16 twin, and which knob moves the fp8 time: one process, one GPU.

    PYTHONPATH=. python gpu_results/2026-12-01-h200-fp8-decode/probe.py OUT.json [BASE_KERNEL.py]

Kernels: "base" is BASE_KERNEL.py (the kernel file at the base commit, imported as a module of
its own), "new" the working tree's kernels/triton_paged.py. Shapes: 8B-style decode (32 q heads,
8 KV heads, head dim 128, blocks of 16, shuffled), bf16 q; the caches drawn on the GPU, the fp8
pools quantized from the bf16 ones with one amax scale each (so both twins attend over the same
values up to quantization). Timing: harness.timing.time_call (CUDA-graph replay, L2 flushed
before each replay, median). Configs: kernels.tuning.override (tile_n, num_warps, num_stages).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import torch
from harness.ceilings import measure_read_bandwidth

import kernels
from harness.timing import time_call
from kernels import tuning
from kernels.tuning import TileConfig

OUT = Path(sys.argv[1])
BASE_FILE = sys.argv[2] if len(sys.argv) > 2 else None
DEV = "cuda"
HQ, HKV, D, BS = 32, 8, 128, 16


def load_module(name, path):
    spec = importlib.util.spec_from_file_location(f"kernels.{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


import kernels.triton_paged  # noqa: E402

MODS = {"new": kernels.triton_paged}
if BASE_FILE:
    MODS["base"] = load_module("_probe_base", BASE_FILE)


def make(seq_lens, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    n = len(seq_lens)
    blocks_per = [-(-s // BS) for s in seq_lens]
    total = sum(blocks_per)
    perm = torch.randperm(total, generator=g, device=DEV).to(torch.int32)
    width = max(blocks_per)
    bt = torch.full((n, width), -1, dtype=torch.int32, device=DEV)
    start = 0
    for i, b in enumerate(blocks_per):
        bt[i, :b] = perm[start : start + b]
        start += b
    k = torch.randn(total, BS, HKV, D, generator=g, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(total, BS, HKV, D, generator=g, device=DEV, dtype=torch.bfloat16)
    q = torch.randn(n, HQ, D, generator=g, device=DEV, dtype=torch.bfloat16)
    fp8 = torch.float8_e4m3fn
    k_scale = float(k.float().abs().amax()) / 448.0
    v_scale = float(v.float().abs().amax()) / 448.0
    k8 = (k.float() / k_scale).clamp(-448, 448).to(fp8)
    v8 = (v.float() / v_scale).clamp(-448, 448).to(fp8)
    sl = torch.tensor(seq_lens, dtype=torch.int32, device=DEV)
    qsl = torch.arange(n + 1, dtype=torch.int32, device=DEV)
    return dict(
        q=q,
        k=k,
        v=v,
        k8=k8,
        v8=v8,
        k_scale=k_scale,
        v_scale=v_scale,
        bt=bt,
        sl=sl,
        qsl=qsl,
        tokens=sum(seq_lens),
        max_len=max(seq_lens),
    )


def call_of(mod, x, fp8):
    fn = mod.paged_attention_triton
    out = torch.empty_like(x["q"])
    k, v = (x["k8"], x["v8"]) if fp8 else (x["k"], x["v"])
    extra = dict(k_scale=x["k_scale"], v_scale=x["v_scale"]) if fp8 else {}

    def run():
        return fn(x["q"], k, v, x["bt"], x["sl"], x["qsl"], out=out, max_q_len=1, max_seq_len=x["max_len"], **extra)

    return run, out


def kv_bytes(x, fp8):
    return x["tokens"] * HKV * D * 2 * (1 if fp8 else 2)


RESULTS = []


def measure(shape, x, side, fp8, config, label, ref=None):
    rec = dict(
        shape=shape,
        kernel=side,
        kv="fp8" if fp8 else "bf16",
        label=label,
        config=None if config is None else config.__dict__,
    )
    t0 = time.time()
    try:
        ctx = tuning.override(config) if config is not None else _null()
        with ctx:
            run, out = call_of(MODS[side], x, fp8)
            run()
            torch.cuda.synchronize()
            if ref is not None:
                rec["max_abs_diff_vs_ref"] = float((out.float() - ref.float()).abs().max())
            rec["nan"] = bool(out.isnan().any())
            t = time_call(run, DEV)
        rec["us"] = t.median_us
        rec["method"] = t.method
        rec["fp8_TBps"] = kv_bytes(x, True) / (t.median_us * 1e-6) / 1e12
        rec["read_TBps"] = kv_bytes(x, fp8) / (t.median_us * 1e-6) / 1e12
        out_copy = out.clone()
    except Exception as e:  # a config that does not compile or run
        rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        out_copy = None
    rec["wall_s"] = round(time.time() - t0, 1)
    RESULTS.append(rec)
    print(
        json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in rec.items() if k != "config"}),
        rec.get("config"),
        flush=True,
    )
    OUT.write_text(json.dumps(dict(results=RESULTS, meta=META), indent=1))
    return out_copy


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


META = dict(torch=torch.__version__, gpu=torch.cuda.get_device_name())
import triton  # noqa: E402

META["triton"] = triton.__version__
META["read_GBps"] = measure_read_bandwidth(DEV)
print("read ceiling GB/s", META["read_GBps"], flush=True)

SHAPES = {
    "32x16k": [16384] * 32,
    "64x8k": [8192] * 64,
    "8x32k": [32768] * 8,
}
LLAMA = None
try:
    from harness.suite_files import resolve_case_arg

    from harness.cases import load_case_file

    (case,) = [c for c in load_case_file(resolve_case_arg("variants")) if c.name == "llama3_8b_decode_fp8"]
    SHAPES["llama3_8b_decode"] = list(case.seq_lens)
except Exception as e:
    print("llama case not loaded:", e)

C = TileConfig
DECODE_CONFIGS = [
    C(16, 1, 128, 4, 4),
    C(16, 1, 128, 4, 2),
    C(16, 1, 128, 8, 3),
    C(16, 1, 64, 4, 3),
    C(16, 1, 64, 4, 4),
    C(16, 1, 256, 8, 3),
    C(16, 1, 256, 8, 2),
]
SPLIT_CONFIGS = [C(16, 1, 32, 4, 4), C(16, 1, 64, 4, 3), C(16, 1, 64, 4, 4), C(16, 1, 128, 4, 3), C(16, 1, 64, 8, 3)]
for shape, lens in SHAPES.items():
    x = make(lens)
    ref = None
    if "base" in MODS:
        measure(shape, x, "base", False, None, "bf16 base")
        ref = measure(shape, x, "base", True, None, "fp8 base")
    measure(shape, x, "new", True, None, "fp8 new", ref)
    configs = SPLIT_CONFIGS if shape == "8x32k" else DECODE_CONFIGS
    for cfg in configs:
        measure(shape, x, "new", True, cfg, f"fp8 new t{cfg.tile_n} w{cfg.num_warps} s{cfg.num_stages}", ref)
    if "base" in MODS:  # repeat the pair: the spread between two timings of the same thing
        measure(shape, x, "base", False, None, "bf16 base (again)")
        measure(shape, x, "new", True, None, "fp8 new (again)", ref)
    del x
    torch.cuda.empty_cache()
print("done")
