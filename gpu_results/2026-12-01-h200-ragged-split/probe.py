"""The ragged split (kernels.tiling.RAGGED_SPLIT_KEYS) side by side in one process on one GPU.

    PYTHONPATH=. python gpu_results/2026-12-01-h200-ragged-split/probe.py OUT.json [ROUNDS]

8B-style decode (32 q heads, 8 KV heads, head dim 128, blocks of 16, shuffled block tables), bf16 q;
bf16 pools drawn on the GPU and their e4m3 quantization with one amax scale per pool (as
gpu_results/2026-12-01-h200-fp8-round2/probe.py makes them). Each candidate sets
RAGGED_SPLIT_KEYS (off: 10**9, no ragged split) and optionally a launch config
(kernels.tuning.override) or the kernel with the split index reversed ("rev": program_id(2) = 0 runs
the last split, so the pieces only long sequences have are dispatched first); the launch plans are
cleared around each candidate. Calls pass max_q_len=1, max_seq_len=max(seq_lens) as the harness
does. Timing: harness.timing.timer.time_call (CUDA-graph replay, L2 flushed before each replay,
median); every candidate of a shape once a round, the order reversed every other round. Accuracy:
||out - ref|| / ||ref|| against float64 attention over the (dequantized) cache, on the llama lengths.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import time
from pathlib import Path

import torch
import triton

import kernels.tiling
import kernels.triton_paged
from harness.timing.ceilings import measure_read_bandwidth
from harness.timing.timer import time_call
from kernels import tuning
from kernels.launch_plan import clear_plans
from kernels.tuning import TileConfig

OUT = Path(sys.argv[1])
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 2
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke run of this script (TRITON_INTERPRET=1)
HQ, HKV, D, BS = 32, 8, 128, 16
OFF = 10**9

_src = Path(kernels.triton_paged.__file__).read_text()
_line = "    split = tl.program_id(2)\n"
assert _src.count(_line) == 1
_rev = Path(__file__).with_name("_probe_rev.py")
_rev.write_text(_src.replace(_line, "    split = NUM_SPLITS - 1 - tl.program_id(2)\n"))
_spec = importlib.util.spec_from_file_location("kernels._probe_rev", _rev)
_mod = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _mod
_spec.loader.exec_module(_mod)
MODS = {"cur": kernels.triton_paged, "rev": _mod}


def make(seq_lens, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    n = len(seq_lens)
    blocks_per = [-(-s // BS) for s in seq_lens]
    total = sum(blocks_per)
    perm = torch.randperm(total, generator=g, device=DEV).to(torch.int32)
    bt = torch.full((n, max(blocks_per)), -1, dtype=torch.int32, device=DEV)
    start = 0
    for i, b in enumerate(blocks_per):
        bt[i, :b] = perm[start : start + b]
        start += b
    k = torch.randn((total, BS, HKV, D), generator=g, device=DEV, dtype=torch.bfloat16)
    v = torch.randn((total, BS, HKV, D), generator=g, device=DEV, dtype=torch.bfloat16)
    q = torch.randn(n, HQ, D, generator=g, device=DEV, dtype=torch.bfloat16)
    fp8 = torch.float8_e4m3fn
    k_scale = float(k.float().abs().amax()) / 448.0
    v_scale = float(v.float().abs().amax()) / 448.0
    k8 = (k.float() / k_scale).clamp(-448, 448).to(fp8)
    v8 = (v.float() / v_scale).clamp(-448, 448).to(fp8)
    sl = torch.tensor(seq_lens, dtype=torch.int32, device=DEV)
    qsl = torch.arange(n + 1, dtype=torch.int32, device=DEV)
    return dict(q=q, k=k, v=v, k8=k8, v8=v8, k_scale=k_scale, v_scale=v_scale, bt=bt, sl=sl, qsl=qsl,
                lens=list(seq_lens), tokens=sum(seq_lens), max_len=max(seq_lens))  # fmt: skip


def reference(x, fp8):
    """float64 attention of every sequence over its (dequantized) cache: [num_seqs, HQ, D]."""
    out = torch.empty(len(x["lens"]), HQ, D, dtype=torch.float64, device=DEV)
    kc, vc = (x["k8"], x["v8"]) if fp8 else (x["k"], x["v"])
    ks, vs = (x["k_scale"], x["v_scale"]) if fp8 else (1.0, 1.0)
    for i, n in enumerate(x["lens"]):
        blocks = x["bt"][i, : -(-n // BS)].long()
        k = kc[blocks].reshape(-1, HKV, D)[:n].double() * ks
        v = vc[blocks].reshape(-1, HKV, D)[:n].double() * vs
        q = x["q"][i].double().view(HKV, HQ // HKV, D)
        s = torch.einsum("hgd,nhd->hgn", q, k) / math.sqrt(D)
        out[i] = torch.einsum("hgn,nhd->hgd", torch.softmax(s, -1), v).reshape(HQ, D)
    return out


def call_of(mod, x, fp8):
    out = torch.empty_like(x["q"])
    k, v = (x["k8"], x["v8"]) if fp8 else (x["k"], x["v"])
    extra = dict(k_scale=x["k_scale"], v_scale=x["v_scale"]) if fp8 else {}

    def run():
        return mod.paged_attention_triton(x["q"], k, v, x["bt"], x["sl"], x["qsl"], out=out, max_q_len=1,
                                          max_seq_len=x["max_len"], **extra)  # fmt: skip

    return run, out


RESULTS = []
META = dict(
    torch=torch.__version__, triton=triton.__version__, gpu=torch.cuda.get_device_name() if DEV == "cuda" else DEV
)


def measure(shape, x, cand, rnd, refs):
    label, side, fp8, ragged, config = cand
    rec = dict(shape=shape, label=label, round=rnd, kernel=side, kv="fp8" if fp8 else "bf16", ragged_keys=ragged)
    t0 = time.time()
    saved = kernels.tiling.RAGGED_SPLIT_KEYS
    kernels.tiling.RAGGED_SPLIT_KEYS = ragged
    clear_plans()
    try:
        with tuning.override(config) if config is not None else _Null():
            run, out = call_of(MODS[side], x, fp8)
            out.fill_(float("nan"))
            run()
            torch.cuda.synchronize() if DEV == "cuda" else None
            plan = [p for p in MODS[side].PLANS.plans()][-1].plan.tiling
            rec.update(splits=plan.NUM_SPLITS, split_size=plan.SPLIT_SIZE, tile_n=plan.TILE_N, stages=plan.NUM_STAGES)
            rec["unwritten_or_nan"] = bool(out.isnan().any())
            if "ref_fp8" in refs and rnd == 0:
                ref = refs["ref_fp8" if fp8 else "ref_bf16"]
                rec["rel_err_vs_fp64"] = float((out.double() - ref).norm() / ref.norm())
                key = "out_fp8" if fp8 else "out_bf16"
                if key in refs:
                    rec["max_abs_diff_vs_first"] = float((out.float() - refs[key].float()).abs().max())
                else:
                    refs[key] = out.clone()
            tc = time_call(run, DEV)
        rec["us"] = tc.median_us
        rec["fp8_TBps"] = x["tokens"] * HKV * D * 2 / (tc.median_us * 1e-6) / 1e12
    except Exception as e:  # a candidate that does not compile or run: recorded, the others go on
        rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    finally:
        kernels.tiling.RAGGED_SPLIT_KEYS = saved
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


def cfg(tile_n, warps, stages):
    return TileConfig(max_rows=16, max_tokens=1, tile_n=tile_n, num_warps=warps, num_stages=stages)


META["read_GBps"] = measure_read_bandwidth(DEV) if DEV == "cuda" else float("nan")
print("read ceiling GB/s", META["read_GBps"], flush=True)


def both(keys):
    """bf16 twin and fp8 at each RAGGED_SPLIT_KEYS value (off first)."""
    out = []
    for fp8 in (False, True):
        for k in keys:
            name = "off" if k == OFF else f"{k // 1024}k"
            out.append((f"{'fp8' if fp8 else 'bf16'} {name}", "cur", fp8, k, None))
    return out


LLAMA = [
    *both([OFF, 4096, 8192, 16384]),
    ("bf16 8k rev", "rev", False, 8192, None),
    ("fp8 8k rev", "rev", True, 8192, None),
    ("fp8 4k rev", "rev", True, 4096, None),
    ("fp8 8k t128s5", "cur", True, 8192, cfg(128, 4, 5)),
    ("fp8 8k t256s4", "cur", True, 8192, cfg(256, 4, 4)),
]
SHAPES = [
    ("llama3_8b_decode", json.loads(Path(__file__).with_name("llama_lens.json").read_text()), LLAMA, True),
    ("32x16k", [16384] * 32, [*both([OFF, 4096, 8192]), ("fp8 8k rev", "rev", True, 8192, None)], False),
    ("64x8k", [8192] * 64, both([OFF, 4096]), False),
    ("64x32k", [32768] * 64, [*both([OFF, 8192, 16384]), ("fp8 8k rev", "rev", True, 8192, None)], False),
]
if DEV == "cpu":  # the smoke run: tiny shapes, every code path (a 40-key piece splits the 100-key sequence)
    SHAPES = [("tiny", [100, 7, 40], [("bf16 off", "cur", False, OFF, None), ("fp8 off", "cur", True, OFF, None),
                                      ("fp8 32", "rev", True, 40, None)], True)]  # fmt: skip
    kernels.tiling.TARGET_PROGRAMS = 8
for shape, lens, cands, with_ref in SHAPES:
    x = make(lens)
    refs = {}
    if with_ref:
        refs.update(ref_fp8=reference(x, True), ref_bf16=reference(x, False))
    for rnd in range(ROUNDS):
        order = cands if rnd % 2 == 0 else cands[::-1]
        for cand in order:
            measure(shape, x, cand, rnd, refs)
    del x, refs
    torch.cuda.empty_cache()

# Each candidate's best over rounds; "x bf16 off": over the bf16 twin unsplit, "x bf16 same": over the bf16 twin
# at the same RAGGED_SPLIT_KEYS (and kernel); % of the read ceiling counted in fp8 bytes.
print(f"{'shape':<18}{'candidate':<16}{'splits':>7}{'us (rounds)':>22}{'x bf16 off':>11}{'x bf16 same':>12}"
      f"{'fp8 TB/s':>9}{'% ceil':>7}")  # fmt: skip
for shape, _, cands, _ in SHAPES:
    rows = {c[0]: [r for r in RESULTS if r["shape"] == shape and r["label"] == c[0] and "us" in r] for c in cands}
    best = {label: min((r["us"] for r in recs), default=float("nan")) for label, recs in rows.items()}
    for label, recs in rows.items():
        if not recs:
            print(f"{shape:<18}{label:<16}error")
            continue
        us = [r["us"] for r in recs]
        twin_same = best.get("bf16 " + label.split(" ", 1)[1].split(" t")[0], float("nan"))
        tb = recs[0]["fp8_TBps"] * recs[0]["us"] / best[label]
        print(f"{shape:<18}{label:<16}{recs[0]['splits']:>7}{', '.join(f'{u:.1f}' for u in us):>22}"
              f"{best[label] / best['bf16 off']:>11.3f}{best[label] / twin_same:>12.3f}{tb:>9.2f}"
              f"{100 * tb * 1e3 / META['read_GBps']:>7.1f}")  # fmt: skip
print("done")
