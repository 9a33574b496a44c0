"""fp8 decode candidates against the bf16 twin, side by side in one process on one GPU.

    PYTHONPATH=. python gpu_results/2026-12-01-h200-fp8-round2/probe.py OUT.json BASE_KERNEL.py [ROUNDS] [OPS_KERNEL.py]

Kernels: "base" is BASE_KERNEL.py (the kernel file of the base commit, imported as a module of
its own: its fp8 path widens e4m3 -> fp32 -> bf16 and dots in bf16), "new" the working tree's
kernels/triton_paged.py (bf16 q over an fp8 cache: q scaled per row by a power of two into fp16,
e4m3 -> fp16 in one conversion, dots and p in fp16; V read as uint16 pairs of dims, V_PAIRS),
"nopairs" the same without V_PAIRS (written next to this file), "ops" OPS_KERNEL.py when given (the
working tree's kernel with V's bytes split by Triton's integer ops instead of _split_pairs' PTX).
All run under the working tree's tiling. Probe 1 ran the first four candidates' kernels before
_split_pairs existed: its "new" is what "ops" is in probe 2.
Candidates differ in kernel and launch config (kernels.tuning.override: tile_n, num_warps,
num_stages) and Triton's register cap (maxnreg). Shapes: 8B-style decode (32 q heads, 8 KV heads,
head dim 128, blocks of 16, shuffled block tables), bf16 q; bf16 pools drawn on the GPU and their
e4m3 quantization with one amax scale per pool. Timing: harness.timing.timer.time_call (CUDA-graph
replay, L2 flushed before each replay, median), every candidate of a shape once per round, ROUNDS
rounds (default 2). Accuracy: ||out - ref|| / ||ref|| against a float64 attention over the
dequantized fp8 cache (the bf16 twin against its own bf16 cache), on the 64 x 8k shape.
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

import kernels.triton_paged
from harness.timing.ceilings import measure_read_bandwidth
from harness.timing.timer import time_call
from kernels import tuning
from kernels.launch_plan import clear_plans
from kernels.tuning import TileConfig

OUT = Path(sys.argv[1])
BASE_FILE = sys.argv[2]
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 2
OPS_FILE = sys.argv[4] if len(sys.argv) > 4 else None
DEV = "cuda"
HQ, HKV, D, BS = 32, 8, 128, 16


def load_module(name, path):
    spec = importlib.util.spec_from_file_location(f"kernels.{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


MODS = {"new": kernels.triton_paged, "base": load_module("_probe_base", BASE_FILE)}
# "nopairs": the working tree's kernel with V read as fp8 (one dot, V_PAIRS off): the fp16 dots alone
_src = Path(kernels.triton_paged.__file__).read_text()
_off = "v_pairs = (call.kv_fp8 and"
assert _src.count(_off) == 1
_path = Path(__file__).with_name("_probe_nopairs.py")
_path.write_text(_src.replace(_off, "v_pairs = False and (call.kv_fp8 and"))
MODS["nopairs"] = load_module("_probe_nopairs", _path)
if OPS_FILE:
    MODS["ops"] = load_module("_probe_ops", OPS_FILE)
CAP = {"maxnreg": None}
for _mod in MODS.values():  # Triton's register cap as a launch option, when a candidate sets one
    _init = _mod.TritonPlan.__init__

    def _init_with_cap(self, *args, _init=_init, **kwargs):
        _init(self, *args, **kwargs)
        if CAP["maxnreg"] and getattr(self, "main", None) is not None:
            self.main.options = {**self.main.options, "maxnreg": CAP["maxnreg"]}

    _mod.TritonPlan.__init__ = _init_with_cap


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
        k = kc[blocks].reshape(-1, HKV, D)[:n].double() * ks  # [n, HKV, D]
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
META = dict(torch=torch.__version__, triton=triton.__version__, gpu=torch.cuda.get_device_name())


def measure(shape, x, cand, rnd, refs):
    label, side, fp8, config, maxnreg = cand
    rec = dict(shape=shape, label=label, round=rnd, kernel=side, kv="fp8" if fp8 else "bf16", maxnreg=maxnreg,
               config=None if config is None else config.__dict__)  # fmt: skip
    t0 = time.time()
    CAP["maxnreg"] = maxnreg
    clear_plans()
    try:
        with tuning.override(config) if config is not None else _Null():
            run, out = call_of(MODS[side], x, fp8)
            out.fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            rec["unwritten_or_nan"] = bool(out.isnan().any())
            if "ref" in refs and rnd == 0:
                ref = refs["ref_fp8" if fp8 else "ref_bf16"]
                rec["rel_err_vs_fp64"] = float((out.double() - ref).norm() / ref.norm())
            if fp8 and rnd == 0:
                base_out = refs.setdefault("fp8_base_out", out.clone()) if side == "base" else refs.get("fp8_base_out")
                if base_out is not None:
                    rec["max_abs_diff_vs_base_fp8"] = float((out.float() - base_out.float()).abs().max())
                new_out = refs.setdefault("fp8_new_out", out.clone()) if side == "new" else refs.get("fp8_new_out")
                if side != "base" and new_out is not None:
                    rec["max_abs_diff_vs_new_default"] = float((out.float() - new_out.float()).abs().max())
            t = time_call(run, DEV)
        rec["us"] = t.median_us
        rec["fp8_TBps"] = x["tokens"] * HKV * D * 2 / (t.median_us * 1e-6) / 1e12
    except Exception as e:  # a candidate that does not compile or run: recorded, the others go on
        rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    finally:
        CAP["maxnreg"] = None
        clear_plans()
    rec["wall_s"] = round(time.time() - t0, 1)
    RESULTS.append(rec)
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rec.items() if k != "config"}),
          flush=True)  # fmt: skip
    OUT.write_text(json.dumps(dict(results=RESULTS, meta=META), indent=1))


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def cfg(tile_n, warps, stages):
    return TileConfig(max_rows=16, max_tokens=1, tile_n=tile_n, num_warps=warps, num_stages=stages)


META["read_GBps"] = measure_read_bandwidth(DEV)
print("read ceiling GB/s", META["read_GBps"], flush=True)

# (label, kernel, fp8, config or None for the tuned default, maxnreg)
TWIN, BASE, NEW = (
    ("bf16 twin", "base", False, None, None),
    ("fp8 base", "base", True, None, None),
    ("fp8 new", "new", True, None, None),
)
NEW_S5 = ("fp8 new s5", "new", True, cfg(128, 4, 5), None)
if OPS_FILE:  # probe 2
    UNSPLIT = [
        TWIN,
        BASE,
        NEW,
        NEW_S5,
        ("fp8 new t256", "new", True, cfg(256, 4, 3), None),
        ("fp8 ops", "ops", True, None, None),
    ]
    SPLIT = [TWIN, BASE, NEW, NEW_S5, ("fp8 new t256", "new", True, cfg(256, 4, 3), None)]
else:  # probe 1
    UNSPLIT = [
        TWIN, BASE, ("fp8 base s5", "base", True, cfg(128, 4, 5), None), ("fp8 f16 nopairs", "nopairs", True, None, None),
        NEW, NEW_S5, ("fp8 new t64", "new", True, cfg(64, 4, 3), None), ("fp8 new w8 r128", "new", True, cfg(128, 8, 3), 128),
    ]  # fmt: skip
    SPLIT = [TWIN, BASE, NEW, NEW_S5]  # 8 x 32k takes the split decode ("half_fp8", 128, "decode_split")
SHAPES = [
    ("64x8k", [8192] * 64, UNSPLIT, True),
    ("32x16k", [16384] * 32, UNSPLIT, False),
    ("llama3_8b_decode", json.loads(Path(__file__).with_name("llama_lens.json").read_text()), UNSPLIT, False),
    ("8x32k", [32768] * 8, SPLIT, False),
]
for shape, lens, cands, with_ref in SHAPES:
    x = make(lens)
    refs = {}
    if with_ref:
        refs.update(ref=True, ref_fp8=reference(x, True), ref_bf16=reference(x, False))
    for rnd in range(ROUNDS):
        order = cands if rnd % 2 == 0 else cands[::-1]
        for cand in order:
            measure(shape, x, cand, rnd, refs)
    del x, refs
    torch.cuda.empty_cache()

# The table: each candidate's median over rounds, and its ratio to the bf16 twin of its shape.
print(f"{'shape':<18}{'candidate':<22}{'us (rounds)':<26}{'x bf16':>8}{'fp8 TB/s':>10}{'% ceil':>8}")
for shape, _, cands, _ in SHAPES:
    rows = {c[0]: [r for r in RESULTS if r["shape"] == shape and r["label"] == c[0] and "us" in r] for c in cands}
    twin = min((r["us"] for r in rows["bf16 twin"]), default=float("nan"))
    for label, recs in rows.items():
        if not recs:
            print(f"{shape:<18}{label:<22}error")
            continue
        us = sorted(r["us"] for r in recs)
        best = us[0]
        tb = recs[0]["fp8_TBps"] * recs[0]["us"] / best
        print(f"{shape:<18}{label:<22}{', '.join(f'{u:.1f}' for u in us):<26}{best / twin:>8.3f}{tb:>10.2f}"
              f"{100 * tb * 1e3 / META['read_GBps']:>8.1f}")  # fmt: skip
print("done")
