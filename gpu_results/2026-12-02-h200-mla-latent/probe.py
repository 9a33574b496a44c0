"""MLA decode (absorbed, DeepSeek-V3 style) candidates against today's wide tiling, side by side in one process.

    PYTHONPATH=. python gpu_results/2026-12-02-h200-mla-latent/probe.py OUT.json [ROUNDS]
    PYTHONPATH=. python gpu_results/2026-12-02-h200-mla-latent/probe.py --warm LABEL   (compile one candidate)

128 q heads over one KV head, K 576 / V 512, bf16, blocks of 64, shuffled block tables; calls pass
max_q_len=1, max_seq_len=seq_len. Two input layouts with the same values: "sep", K [.., 576] and V a
tensor of its own [.., 512] (V = K's first 512 columns, copied); "view", V = k_cache[..., :512] (one
latent cache, as vLLM's MLA and FlashMLA store it). Candidates set kernels.tiling.WIDE_HEADS,
V_PART_DIM, LATENT_KV, TARGET_PROGRAMS and a tuning override (tile_n, warps, stages). Timing:
harness.timing.timer.time_call (CUDA-graph replay, L2 flushed before each replay, median); each
candidate once a round, the order reversed every other round. TFLOP/s = 2 * num_seqs * 128 * seq_len
* (576 + 512) / time. Accuracy (round 0): ||out - ref|| / ||ref|| against float64 attention over the
first 4 sequences, and the largest |out - base out|.
"""

from __future__ import annotations

import json
import math
import os
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

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke run (TRITON_INTERPRET=1)


def cfg(tile_n, stages, warps=8):
    return TileConfig(max_rows=128, max_tokens=1, tile_n=tile_n, num_warps=warps, num_stages=stages)


# label, inputs, WIDE_HEADS, V_PART_DIM, LATENT_KV, tuning override (None: the committed keys), TARGET_PROGRAMS
CANDIDATES = [
    ("base", "sep", 64, 256, False, None, None),  # today: 64 heads, V in 2 parts, t32 w8 s3
    ("base view", "view", 64, 256, False, None, None),  # the same kernel on the latent view (V loads hit K's lines)
    ("vwhole t16s3", "sep", 64, 512, False, cfg(16, 3), None),  # logits once, separate V
    ("latent t16s2", "view", 64, 512, True, cfg(16, 2), None),  # logits once, V taken from the K tile
    ("latent t16s3", "view", 64, 512, True, cfg(16, 3), None),
    ("latent t32s2", "view", 64, 512, True, cfg(32, 2), None),
    ("latent t16s3 nosplit", "view", 64, 512, True, cfg(16, 3), 1),
    ("128h t16s2", "sep", 128, 256, False, cfg(16, 2), None),  # 128 heads a program (a warpgroup 64), V in 2 parts
    ("128h t16s2 view", "view", 128, 256, False, cfg(16, 2), None),
]
SHAPES = [("mla 32x8k", 32, 8192), ("mla 128x2k", 128, 2048), ("mla 64x4k", 64, 4096)]
if os.environ.get("PROBE_SET") == "recheck":  # the second call: the committed latent keys (no override) and two more
    CANDIDATES = [
        CANDIDATES[0],
        ("latent committed", "view", 64, 512, True, None, None),  # kernels.tuning's "half_latent" keys: t32 w8 s2
        ("latent t32s3", "view", 64, 512, True, cfg(32, 3), None),
        ("latent t64s2", "view", 64, 512, True, cfg(64, 2), None),
    ]
    SHAPES = SHAPES[:2]
if DEV == "cpu":
    SHAPES = [("mla tiny", 2, 70)]


def make(num_seqs, seq_len, bs=64, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    per = -(-seq_len // bs)
    total = num_seqs * per
    bt = torch.randperm(total, generator=g, device=DEV).to(torch.int32).view(num_seqs, per)
    k = torch.randn((total, bs, 1, 576), generator=g, device=DEV, dtype=torch.bfloat16)
    q = torch.randn(num_seqs, 128, 576, generator=g, device=DEV, dtype=torch.bfloat16)
    sl = torch.full((num_seqs,), seq_len, dtype=torch.int32, device=DEV)
    qsl = torch.arange(num_seqs + 1, dtype=torch.int32, device=DEV)
    return dict(
        q=q, k=k, view=k[..., :512], sep=k[..., :512].contiguous(), bt=bt, sl=sl, qsl=qsl, n=num_seqs, L=seq_len
    )


def reference(x, seqs=4):
    out = []
    for i in range(seqs):
        k = x["k"][x["bt"][i].long()].reshape(-1, 576)[: x["L"]].double()
        q = x["q"][i].double()
        p = torch.softmax(q @ k.T / math.sqrt(576), -1)
        out.append(p @ k[:, :512])
    return torch.stack(out)


def run_candidate(x, cand, rnd, refs, timed=True):
    label, layout, wide, vpart, latent, config, target = cand
    rec = dict(label=label, round=rnd)
    t0 = time.time()
    saved = (kernels.tiling.WIDE_HEADS, kernels.tiling.V_PART_DIM, kernels.tiling.LATENT_KV,
             kernels.tiling.TARGET_PROGRAMS)  # fmt: skip
    kernels.tiling.WIDE_HEADS, kernels.tiling.V_PART_DIM, kernels.tiling.LATENT_KV = wide, vpart, latent
    kernels.tiling.TARGET_PROGRAMS = target or saved[3]
    clear_plans()
    try:
        with tuning.override(config) if config is not None else _Null():
            out = torch.empty(x["n"], 128, 512, dtype=torch.bfloat16, device=DEV)

            def run():
                return kernels.triton_paged.paged_attention_triton(
                    x["q"], x["k"], x[layout], x["bt"], x["sl"], x["qsl"], out=out, max_q_len=1, max_seq_len=x["L"]
                )

            out.fill_(float("nan"))
            run()
            if DEV == "cuda":
                torch.cuda.synchronize()
            t = list(kernels.triton_paged.PLANS.plans())[-1].plan.tiling
            rec.update(block_m=t.BLOCK_M, splits=t.NUM_SPLITS, tile_n=t.TILE_N, warps=t.NUM_WARPS,
                       stages=t.NUM_STAGES, key=list(t.TUNING_KEY))  # fmt: skip
            rec["nan"] = bool(out.isnan().any())
            if rnd == 0 and refs is not None:
                ref = refs["ref"]
                rec["rel_err_vs_fp64"] = float((out[: len(ref)].double() - ref).norm() / ref.norm())
                if "base" in refs:
                    rec["max_abs_diff_vs_base"] = float((out.float() - refs["base"].float()).abs().max())
                    rec["equal_to"] = [k for k, v in refs["outs"].items() if torch.equal(v, out)]
                else:
                    refs["base"] = out.clone()
                refs["outs"][label] = out.clone()
            if timed:
                tc = time_call(run, DEV)
                rec["us"] = tc.median_us
                rec["TFLOPs"] = 2 * x["n"] * 128 * x["L"] * (576 + 512) / (tc.median_us * 1e-6) / 1e12
    except Exception as e:  # a candidate that does not compile or run: recorded, the others go on
        rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    finally:
        (kernels.tiling.WIDE_HEADS, kernels.tiling.V_PART_DIM, kernels.tiling.LATENT_KV,
         kernels.tiling.TARGET_PROGRAMS) = saved  # fmt: skip
        clear_plans()
    rec["wall_s"] = round(time.time() - t0, 1)
    return rec


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def main() -> None:
    if sys.argv[1] == "--warm":  # compile one candidate's launches (run in parallel before the timed run)
        cand = next(c for c in CANDIDATES if c[0] == sys.argv[2])
        for _, n, length in SHAPES:
            rec = run_candidate(make(n, length), cand, 1, None, timed=False)
            print(json.dumps(rec), flush=True)
        return
    out_path, rounds = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 2
    meta = dict(torch=torch.__version__, triton=triton.__version__,
                gpu=torch.cuda.get_device_name() if DEV == "cuda" else DEV)  # fmt: skip
    results = []
    for shape, n, length in SHAPES:
        x = make(n, length)
        refs = dict(ref=reference(x, min(4, n)), outs={})
        for rnd in range(rounds):
            for cand in CANDIDATES if rnd % 2 == 0 else CANDIDATES[::-1]:
                rec = dict(shape=shape, **run_candidate(x, cand, rnd, refs if rnd == 0 else None))
                results.append(rec)
                print(json.dumps({k: (round(v, 5) if isinstance(v, float) else v) for k, v in rec.items()}), flush=True)
                out_path.write_text(json.dumps(dict(results=results, meta=meta), indent=1))
        del x, refs
        if DEV == "cuda":
            torch.cuda.empty_cache()
    print(f"{'shape':<12}{'candidate':<22}{'M':>4}{'tile':>5}{'st':>3}{'splits':>7}{'us (rounds)':>20}{'TFLOP/s':>9}"
          f"{'x base':>8}")  # fmt: skip
    for shape, _, _ in SHAPES:
        recs = {c[0]: [r for r in results if r["shape"] == shape and r["label"] == c[0] and "us" in r]
                for c in CANDIDATES}  # fmt: skip
        best = {label: min((r["us"] for r in rs), default=float("nan")) for label, rs in recs.items()}
        for label, rs in recs.items():
            if not rs:
                print(f"{shape:<12}{label:<22}error")
                continue
            r = rs[0]
            us = ", ".join(f"{x['us']:.1f}" for x in rs)
            tf = r["TFLOPs"] * r["us"] / best[label]
            print(f"{shape:<12}{label:<22}{r['block_m']:>4}{r['tile_n']:>5}{r['stages']:>3}{r['splits']:>7}{us:>20}"
                  f"{tf:>9.1f}{best[label] / best['base']:>8.3f}")  # fmt: skip
    print("done")


if __name__ == "__main__":
    main()
