"""MLA decode (absorbed, DeepSeek-V3 style) under the wide tiling (kernels.tiling.WIDE_HEADS) against
the 16-head tiling, side by side in one process on one GPU.

    PYTHONPATH=. python gpu_results/2026-12-01-h200-mla/probe.py OUT.json [ROUNDS]

128 q heads over one KV head, K 576 / V 512, bf16, blocks of 64, shuffled block tables; calls pass
max_q_len=1, max_seq_len=max(seq_lens) as the harness does. Candidates: "old" (WIDE_HEADS None: 16
heads a program, V whole), "new" (64 heads, V in parts of 256), "new s2" (the same, 2 stages), "new
nosplit" (no KV split: TARGET_PROGRAMS 1). Plus an 8B bf16 decode (32 / 8 heads, dim 128), which the
setting must not reach. Timing: harness.timing.timer.time_call (CUDA-graph replay, L2 flushed before
each replay, median); each candidate once a round, the order reversed every other round.
TFLOP/s = 2 * num_seqs * 128 * seq_len * (576 + 512) / time. Accuracy: ||out - ref|| / ||ref||
against float64 attention, and the largest |new - old|, in round 0.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import torch
import triton

import kernels.tiling
import kernels.triton_paged
from harness.timing.timer import time_call
from kernels import tuning
from kernels.launch_plan import clear_plans
from kernels.tuning import TileConfig

OUT = Path(sys.argv[1])
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 2
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke run (TRITON_INTERPRET=1)


def make(num_seqs, seq_len, hq, hkv, d, dv, bs, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    per = -(-seq_len // bs)
    total = num_seqs * per
    bt = torch.randperm(total, generator=g, device=DEV).to(torch.int32).view(num_seqs, per)
    k = torch.randn((total, bs, hkv, d), generator=g, device=DEV, dtype=torch.bfloat16)
    v = torch.randn((total, bs, hkv, dv), generator=g, device=DEV, dtype=torch.bfloat16)
    q = torch.randn(num_seqs, hq, d, generator=g, device=DEV, dtype=torch.bfloat16)
    sl = torch.full((num_seqs,), seq_len, dtype=torch.int32, device=DEV)
    qsl = torch.arange(num_seqs + 1, dtype=torch.int32, device=DEV)
    return dict(q=q, k=k, v=v, bt=bt, sl=sl, qsl=qsl, n=num_seqs, L=seq_len, hq=hq, hkv=hkv, d=d, dv=dv, bs=bs)


def reference(x, seqs=4):
    """float64 attention of the first ``seqs`` sequences: [seqs, hq, dv]."""
    out = []
    g = x["hq"] // x["hkv"]
    for i in range(seqs):
        k = x["k"][x["bt"][i].long()].reshape(-1, x["hkv"], x["d"])[: x["L"]].double()
        v = x["v"][x["bt"][i].long()].reshape(-1, x["hkv"], x["dv"])[: x["L"]].double()
        q = x["q"][i].double().view(x["hkv"], g, x["d"])
        s = torch.einsum("hgd,nhd->hgn", q, k) / math.sqrt(x["d"])
        out.append(torch.einsum("hgn,nhd->hgd", torch.softmax(s, -1), v).reshape(x["hq"], x["dv"]))
    return torch.stack(out)


RESULTS = []
META = dict(
    torch=torch.__version__, triton=triton.__version__, gpu=torch.cuda.get_device_name() if DEV == "cuda" else DEV
)


def measure(shape, x, cand, rnd, refs):
    label, wide, config, target = cand
    rec = dict(shape=shape, label=label, round=rnd)
    t0 = time.time()
    saved = kernels.tiling.WIDE_HEADS, kernels.tiling.TARGET_PROGRAMS
    kernels.tiling.WIDE_HEADS = wide
    kernels.tiling.TARGET_PROGRAMS = target or saved[1]
    clear_plans()
    try:
        with tuning.override(config) if config is not None else _Null():
            out = torch.empty(x["n"], x["hq"], x["dv"], dtype=torch.bfloat16, device=DEV)

            def run():
                return kernels.triton_paged.paged_attention_triton(
                    x["q"], x["k"], x["v"], x["bt"], x["sl"], x["qsl"], out=out, max_q_len=1, max_seq_len=x["L"]
                )

            out.fill_(float("nan"))
            run()
            torch.cuda.synchronize() if DEV == "cuda" else None
            t = [p for p in kernels.triton_paged.PLANS.plans()][-1].plan.tiling
            rec.update(block_m=t.BLOCK_M, splits=t.NUM_SPLITS, tile_n=t.TILE_N, warps=t.NUM_WARPS, stages=t.NUM_STAGES)
            rec["nan"] = bool(out.isnan().any())
            if rnd == 0:
                ref = refs["ref"]
                rec["rel_err_vs_fp64"] = float((out[: len(ref)].double() - ref).norm() / ref.norm())
                if "first" in refs:
                    rec["max_abs_diff_vs_first"] = float((out.float() - refs["first"].float()).abs().max())
                else:
                    refs["first"] = out.clone()
            tc = time_call(run, DEV)
        rec["us"] = tc.median_us
        rec["TFLOPs"] = 2 * x["n"] * x["hq"] * x["L"] * (x["d"] + x["dv"]) / (tc.median_us * 1e-6) / 1e12
    except Exception as e:  # a candidate that does not compile or run: recorded, the others go on
        rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    finally:
        kernels.tiling.WIDE_HEADS, kernels.tiling.TARGET_PROGRAMS = saved
        clear_plans()
    rec["wall_s"] = round(time.time() - t0, 1)
    RESULTS.append(rec)
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rec.items()}), flush=True)
    OUT.write_text(json.dumps(dict(results=RESULTS, meta=META), indent=1))


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


S2 = TileConfig(max_rows=64, max_tokens=1, tile_n=32, num_warps=8, num_stages=2)
MLA = [("old", None, None, None), ("new", 64, None, None), ("new s2", 64, S2, None), ("new nosplit", 64, None, 1)]
B128 = [("old", None, None, None), ("new", 64, None, None)]
SHAPES = [  # name, (num_seqs, seq_len, hq, hkv, d, dv, block_size), candidates
    ("mla 32x8k", (32, 8192, 128, 1, 576, 512, 64), MLA),
    ("mla 128x2k", (128, 2048, 128, 1, 576, 512, 64), MLA),
    ("mla 64x4k", (64, 4096, 128, 1, 576, 512, 64), MLA),
    ("8b bf16 32x8k", (32, 8192, 32, 8, 128, 128, 16), B128),
]
if DEV == "cpu":  # the smoke run: a tiny shape, every candidate
    SHAPES = [("mla tiny", (2, 70, 128, 1, 576, 512, 16), MLA)]
for shape, dims, cands in SHAPES:
    x = make(*dims)
    refs = dict(ref=reference(x, min(4, x["n"])))
    for rnd in range(ROUNDS):
        for cand in cands if rnd % 2 == 0 else cands[::-1]:
            measure(shape, x, cand, rnd, refs)
    del x, refs
    torch.cuda.empty_cache() if DEV == "cuda" else None

print(f"{'shape':<16}{'candidate':<14}{'M':>4}{'splits':>7}{'us (rounds)':>22}{'TFLOP/s':>9}{'x old':>7}")
for shape, _, cands in SHAPES:
    rows = {c[0]: [r for r in RESULTS if r["shape"] == shape and r["label"] == c[0] and "us" in r] for c in cands}
    best = {label: min((r["us"] for r in recs), default=float("nan")) for label, recs in rows.items()}
    for label, recs in rows.items():
        if not recs:
            print(f"{shape:<16}{label:<14}error")
            continue
        tf = recs[0]["TFLOPs"] * recs[0]["us"] / best[label]
        us = ", ".join(f"{r['us']:.1f}" for r in recs)
        print(
            f"{shape:<16}{label:<14}{recs[0]['block_m']:>4}{recs[0]['splits']:>7}"
            f"{us:>22}{tf:>9.1f}{best[label] / best['old']:>7.3f}"
        )
print("done")
