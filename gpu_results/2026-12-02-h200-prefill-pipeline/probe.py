"""Prefill tile-loop candidates side by side in one process on one GPU (kernels.tuning.override).

    PYTHONPATH=. python gpu_results/2026-12-02-h200-prefill-pipeline/probe.py OUT.json ROUNDS HEAD_KERNEL.py

HEAD_KERNEL.py: kernels/triton_paged.py of the commit before the change, imported as kernels._probe_head
and timed as "head" under the same config as "base t128 s2" (the tile loops were refactored into helpers:
the lag-off build of the new file differs from it by a few instructions of scheduling, sass_prefill.py).

Cases: the prefill, chunked-prefill and verify cases of cases/gpu_peers.toml, cases/gpu.toml and
cases/gpu_long.toml named in CASES, built by the harness (harness.run.runner.case_inputs) and called
through the registry's ``triton`` backend, hints and all, as ``harness run`` calls them. Candidates
are TileConfigs of the ("half", 128, "prefill") key, each the working tree's kernel under
kernels.tuning.override: "base" is today's entry (128-key tiles, 2 stages, no lag), whose launch
compiles to the same SASS as the kernel before this change (sass_prefill.py --sass-out). The verify
cases take their own key, which no candidate touches (base only, a control). SDPA (``sdpa_contiguous``,
cuDNN where it runs) is timed in each round as the peer. Timing: harness.timing.timer.time_call
(CUDA-graph replay, L2 flushed before each replay, median); each candidate once a round, the order
reversed every other round. Accuracy: each candidate's largest |out - base| and whether it is
bit-identical to the candidate with the same tiles (the lag must not move a bit).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import torch
import triton

import kernels
from harness.backends.builtin import resolve_backends
from harness.cases.spec import load_case_file
from harness.run.runner import case_inputs
from harness.timing.timer import time_call
from kernels import tuning
from kernels.launch_plan import clear_plans
from kernels.tuning import TileConfig

OUT = Path(sys.argv[1])
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 2
_spec = importlib.util.spec_from_file_location("kernels._probe_head", sys.argv[3])
sys.modules["kernels._probe_head"] = HEAD = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(HEAD)
NEW_ENTRY = kernels.paged_attention_triton
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke run of the script (TRITON_INTERPRET=1)
CANDIDATES = {
    "head": TileConfig(128, 32, 128, 8, 2),  # today's entry, the kernel file before the change
    "base t128 s2": TileConfig(128, 32, 128, 8, 2),
    "t64 s2": TileConfig(128, 32, 64, 8, 2),
    "lag t64 s2": TileConfig(128, 32, 64, 8, 2, pv_lag=True),
    "lag t64 s3": TileConfig(128, 32, 64, 8, 3, pv_lag=True),
}
SAME_TILES = {"base t128 s2": "head", "lag t64 s2": "t64 s2", "lag t64 s3": "t64 s2"}
# Not timed: 128-key tiles with the lag (the loop spills 296 bytes a thread on sm_90, sass_prefill.py).
CASES = [
    ("cases/gpu_peers.toml", "prefill_4x4k", "all"),
    ("cases/gpu_peers.toml", "prefill_1x8k", "all"),
    ("cases/gpu_peers.toml", "prefill_16x1k", "all"),
    ("cases/gpu_peers.toml", "prefill_8x2k", "all"),
    ("cases/gpu_peers.toml", "chunked_8x512_over_2k_6k", "all"),
    ("cases/gpu.toml", "llama3_8b_chunked_prefill", "all"),
    ("cases/gpu_peers.toml", "spec_verify_32x4k/q_lens=8", "base"),
    ("cases/gpu_long.toml", "llama3_8b_prefill_chunk_at_100k", "all"),
]
if DEV == "cpu":
    CASES = [(sys.argv[4], sys.argv[5], "all")]
RESULTS: list[dict] = []
META = dict(torch=torch.__version__, triton=triton.__version__, gpu=torch.cuda.get_device_name() if DEV == "cuda" else DEV,
            candidates={k: repr(v) for k, v in CANDIDATES.items()})  # fmt: skip


def record(rec: dict) -> None:
    RESULTS.append(rec)
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rec.items()}), flush=True)
    OUT.write_text(json.dumps(dict(results=RESULTS, meta=META), indent=1))


def run_case(path: str, name: str, which: str) -> None:
    case = next(c for c in load_case_file(Path(path)) if c.id == name)
    inputs = case_inputs(case, DEV)
    triton_backend, sdpa = resolve_backends(["triton", "sdpa_contiguous"])
    labels = list(CANDIDATES) if which == "all" else ["head", "base t128 s2"]
    prepared, outputs = {}, {}
    for label in labels:
        clear_plans()
        kernels.paged_attention_triton = HEAD.paged_attention_triton if label == "head" else NEW_ENTRY
        with tuning.override(CANDIDATES[label]):
            try:
                ready = triton_backend.prepare(case, inputs, torch.full_like(inputs.q, float("nan")))
                outputs[label] = ready.to_packed(ready.run()).float().clone()
                prepared[label] = ready
            except Exception as e:  # a candidate that does not compile or run: recorded, the others go on
                record(dict(case=name, label=label, error=f"{type(e).__name__}: {str(e)[:300]}"))
    peer = sdpa.prepare(case, inputs, torch.full_like(inputs.q, float("nan")))
    ref = outputs.get("head")
    for label, out in outputs.items():
        rec = dict(case=name, label=label, nan=bool(out.isnan().any()))
        if ref is not None:
            rec["max_abs_diff_vs_head"] = float((out - ref).abs().max())
        if label in SAME_TILES and SAME_TILES[label] in outputs:
            rec["bitwise_equal_to_" + SAME_TILES[label].replace(" ", "_")] = bool(
                torch.equal(out, outputs[SAME_TILES[label]])
            )
        peer_out = peer.to_packed(peer.run()).float()
        rec["max_abs_diff_vs_sdpa"] = float((out - peer_out).abs().max())
        record(rec)
    order = [*prepared, "sdpa"]
    for rnd in range(ROUNDS):
        for label in order if rnd % 2 == 0 else order[::-1]:
            t0 = time.time()
            if label == "sdpa":
                us = time_call(peer.run, DEV).median_us
            else:
                clear_plans()
                kernels.paged_attention_triton = HEAD.paged_attention_triton if label == "head" else NEW_ENTRY
                with tuning.override(CANDIDATES[label]):
                    us = time_call(prepared[label].run, DEV).median_us
            record(dict(case=name, label=label, round=rnd, us=us, wall_s=round(time.time() - t0, 1)))
    del inputs, prepared, outputs, peer
    torch.cuda.empty_cache() if DEV == "cuda" else None


for path, name, which in CASES:
    try:
        run_case(path, name, which)
    except Exception as e:
        record(dict(case=name, error=f"{type(e).__name__}: {str(e)[:400]}"))

kernels.paged_attention_triton = NEW_ENTRY
print(f"\n{'case':<34}{'candidate':<14}{'us (rounds)':>24}{'best':>9}{'x head':>8}{'x sdpa':>8}")
for _, name, _ in CASES:
    rows = [r for r in RESULTS if r.get("case") == name and "us" in r]
    best = {}
    for r in rows:
        best.setdefault(r["label"], []).append(r["us"])
    base, peer = min(best.get("head", [float("nan")])), min(best.get("sdpa", [float("nan")]))
    for label, us in best.items():
        print(
            f"{name:<34}{label:<14}{' / '.join(f'{u:.1f}' for u in us):>24}{min(us):>9.1f}"
            f"{min(us) / base:>8.3f}{min(us) / peer:>8.3f}"
        )
