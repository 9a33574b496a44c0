"""Split-decode candidates against today's kernel and SDPA, side by side in one process on one GPU.

    PYTHONPATH=. python gpu_results/2026-12-02-h200-split-decode/probe.py OUT.json BASE_KERNEL.py [ROUNDS]

Kernels: "base" is BASE_KERNEL.py (kernels/triton_paged.py of the base commit, imported as a module of its
own); the working tree's kernels/triton_paged.py with FUSED_COMBINE off ("A": the split start spelled a
multiple of TILE_N and unsigned block column / slot) and on ("AB": A + the combine fused into the split
launch); "AB_T132" / "AB_T528": AB under kernels.tiling.TARGET_PROGRAMS 132 / 528 (264 is today's).
Every candidate runs under the working tree's tiling (base and A/AB have the same split choice at 264).
Shapes: the split decodes of the GPU suites and two unsplit decodes (bf16, shuffled blocks of 16, random
q / K / V); "sdpa" is SDPA over a contiguous [B, H, L, D] copy, no mask, enable_gqa (the peer suite's
best peer for these equal-length decodes). Timing: harness.timing.timer.time_call (CUDA-graph replay, L2
flushed before each replay, median), every candidate of a shape once per round, ROUNDS rounds (default 3).
The plans are cleared around each measurement, so a TARGET_PROGRAMS change takes effect. Correctness: each
output against base's (max abs difference, bitwise equality), and, after the timing's replays, one more
call compared with the first (the fused combine's tickets must come back to zero).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

import kernels.triton_paged as new_mod
from harness.timing.ceilings import measure_read_bandwidth
from harness.timing.timer import time_call
from kernels import tiling
from kernels.launch_plan import clear_plans

OUT = Path(sys.argv[1])
BASE_FILE = sys.argv[2]
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
DEV, D, BS = "cuda", 128, 16


def load_module(name, path):
    spec = importlib.util.spec_from_file_location(f"kernels.{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


base_mod = load_module("_probe_base", BASE_FILE)
# (label, module, FUSED_COMBINE, TARGET_PROGRAMS)
CANDS = [("base", base_mod, False, 264), ("A", new_mod, False, 264), ("AB", new_mod, True, 264),
         ("AB_T132", new_mod, True, 132), ("AB_T528", new_mod, True, 528)]  # fmt: skip
# (name, num_seqs, seq_len, q heads, KV heads)
SHAPES = [
    ("decode_32x4k_tp8_8q1kv", 32, 4096, 8, 1),
    ("decode_4x16k", 4, 16384, 32, 8),
    ("decode_1x128k", 1, 131072, 32, 8),
    ("llama3_8b_decode_32k", 8, 32768, 32, 8),
    ("llama3_8b_decode_128k", 4, 131072, 32, 8),
    ("llama3_70b_tp8_decode_128k", 8, 131072, 8, 1),
    ("decode_32x4k (unsplit)", 32, 4096, 32, 8),
    ("decode_64x8k (unsplit)", 64, 8192, 32, 8),
]
RESULTS, META = [], dict(torch=torch.__version__, triton=triton.__version__, gpu=torch.cuda.get_device_name())


def make(n, seq_len, hq, hkv, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    per = seq_len // BS
    total = n * per
    bt = torch.randperm(total, generator=g, device=DEV).to(torch.int32).view(n, per)
    k = torch.randn((total, BS, hkv, D), generator=g, device=DEV, dtype=torch.bfloat16)
    v = torch.randn((total, BS, hkv, D), generator=g, device=DEV, dtype=torch.bfloat16)
    q = torch.randn(n, hq, D, generator=g, device=DEV, dtype=torch.bfloat16)
    sl = torch.full((n,), seq_len, dtype=torch.int32, device=DEV)
    qsl = torch.arange(n + 1, dtype=torch.int32, device=DEV)
    return dict(q=q, k=k, v=v, bt=bt, sl=sl, qsl=qsl, n=n, seq_len=seq_len, hkv=hkv,
                bytes=2 * n * seq_len * hkv * D * 2)  # fmt: skip


def measure(shape, x, cand, rnd, refs):
    label, mod, fused, target = cand
    rec = dict(shape=shape, label=label, round=rnd)
    t0 = time.time()
    tiling.TARGET_PROGRAMS = target
    new_mod.FUSED_COMBINE = fused
    clear_plans()
    try:
        out = torch.empty_like(x["q"])

        def run():
            return mod.paged_attention_triton(x["q"], x["k"], x["v"], x["bt"], x["sl"], x["qsl"], out=out, max_q_len=1,
                                              max_seq_len=x["seq_len"])  # fmt: skip

        out.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
        plan = mod.PLANS.plans()[-1].plan
        rec.update(splits=plan.tiling.NUM_SPLITS, tile_n=plan.tiling.TILE_N, fused=bool(getattr(plan, "fused", False)))
        first = out.clone()
        if label == "base":
            refs.setdefault("base", first)
        if "base" in refs:
            rec["max_abs_diff_vs_base"] = float((first.float() - refs["base"].float()).abs().max())
            rec["bitwise_eq_base"] = bool(torch.equal(first, refs["base"]))
        rec["nan"] = bool(first.isnan().any())
        t = time_call(run, DEV)
        out.fill_(float("nan"))
        run()
        torch.cuda.synchronize()
        rec["same_after_replays"] = bool(torch.equal(out, first))
        rec["us"] = t.median_us
        rec["TBps"] = x["bytes"] / (t.median_us * 1e-6) / 1e12
    except Exception as e:  # a candidate that does not compile or run: recorded, the others go on
        rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    finally:
        tiling.TARGET_PROGRAMS = 264
        new_mod.FUSED_COMBINE = True
        clear_plans()
    rec["wall_s"] = round(time.time() - t0, 1)
    RESULTS.append(rec)
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rec.items()}), flush=True)
    OUT.write_text(json.dumps(dict(results=RESULTS, meta=META), indent=1))


def measure_sdpa(shape, x, rnd, sdpa_in):
    q, k, v = sdpa_in
    t = time_call(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), DEV)
    rec = dict(shape=shape, label="sdpa", round=rnd, us=t.median_us, TBps=x["bytes"] / (t.median_us * 1e-6) / 1e12)
    RESULTS.append(rec)
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rec.items()}), flush=True)


META["read_GBps"] = measure_read_bandwidth(DEV)
print("read ceiling GB/s", META["read_GBps"], flush=True)
for name, n, seq_len, hq, hkv in SHAPES:
    x = make(n, seq_len, hq, hkv)
    kc = torch.randn(n, hkv, seq_len, D, device=DEV, dtype=torch.bfloat16)
    sdpa_in = (x["q"].view(n, hq, 1, D), kc, torch.randn_like(kc))
    refs = {}
    for rnd in range(ROUNDS):
        order = CANDS if rnd % 2 == 0 else CANDS[::-1]
        for cand in order:
            measure(name, x, cand, rnd, refs)
        measure_sdpa(name, x, rnd, sdpa_in)
    del x, kc, sdpa_in, refs
    torch.cuda.empty_cache()
OUT.write_text(json.dumps(dict(results=RESULTS, meta=META), indent=1))
