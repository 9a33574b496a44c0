"""The other launches the fp8 change reaches, base against new: an fp8 prefill (bf16 q) and an fp8
decode under fp16 q (V_PAIRS without FP16_DOTS), each with its bf16 / fp16 twin.

    PYTHONPATH=. python gpu_results/2026-12-01-h200-fp8-round2/probe3.py OUT.json BASE_KERNEL.py

Reuses probe.py's inputs, candidates' runner and timer (its module body up to its shapes), with
the working tree's tuning (no override).
"""
# ruff: noqa: F821  (make, measure, MODS, torch come from probe.py's body)

import json
import sys
from pathlib import Path

import torch

sys.argv = [*sys.argv[:3], "1"]  # one round: base and new side by side, twice below
src = (Path(__file__).with_name("probe.py")).read_text()
exec(compile(src.split("TWIN, BASE, NEW = (")[0], "probe.py", "exec"))


def as_prefill(x, q_len):
    """x's sequences each with q_len queries at the end of its keys: q [num_seqs * q_len, HQ, D]."""
    n = len(x["lens"])
    g = torch.Generator(device=DEV).manual_seed(1)
    x["q"] = torch.randn(n * q_len, HQ, D, generator=g, device=DEV, dtype=torch.bfloat16)
    x["qsl"] = torch.arange(n + 1, dtype=torch.int32, device=DEV) * q_len
    return x


_call_of = call_of


def call_of(mod, x, fp8):  # the probe's runner with max_q_len taken from x
    if x.get("q_len", 1) == 1:
        return _call_of(mod, x, fp8)
    out = torch.empty_like(x["q"])
    k, v = (x["k8"], x["v8"]) if fp8 else (x["k"], x["v"])
    extra = dict(k_scale=x["k_scale"], v_scale=x["v_scale"]) if fp8 else {}

    def run():
        return mod.paged_attention_triton(x["q"], k, v, x["bt"], x["sl"], x["qsl"], out=out, max_q_len=x["q_len"],
                                          max_seq_len=x["max_len"], **extra)  # fmt: skip

    return run, out


CANDS = [
    ("twin", "base", False, None, None),
    ("fp8 base", "base", True, None, None),
    ("fp8 new", "new", True, None, None),
]
x = as_prefill(make([4096] * 4), 4096)
x["q_len"] = 4096
outs = {}
for rnd in range(2):
    for cand in CANDS if rnd == 0 else CANDS[::-1]:
        measure("prefill_4x4k bf16 q", x, cand, rnd, outs)
del x
x = make([16384] * 32)
for key in ("q", "k", "v"):
    x[key] = x[key].to(torch.float16)
outs = {}
for rnd in range(2):
    for cand in CANDS if rnd == 0 else CANDS[::-1]:
        measure("32x16k fp16 q", x, cand, rnd, outs)
print(json.dumps([(r["shape"], r["label"], round(r.get("us", 0), 1), r.get("error")) for r in RESULTS]))
