"""MLA decode (tma_cases.toml) timed through the triton backend: descriptor or pointer loads, tile configs.

Run from the repository root: python gpu_results/2026-12-06-h100-kernel-leads/mla_probe.py [splits]"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch

import kernels.tiling as tiling
import kernels.triton_paged as tp
from harness.backends.builtin import resolve_backends
from harness.cases.loading import load_cases
from harness.cases.packaged import resolve_case_arg
from harness.run.runner import case_inputs
from harness.timing.timer import time_call
from kernels.launch_plan import clear_plans
from kernels.tuning import TileConfig, override

cases = {c.name: c for c in load_cases([resolve_case_arg(str(Path(__file__).with_name("tma_cases.toml")))])}
(backend,) = resolve_backends(["triton"])
T = TileConfig
CONFIGS = {
    "mla_latent": [
        ("default (tma)", {}, None),
        ("pointer loads", {"KV_TMA": False}, None),
        ("64h t32 w8 s3", {}, T(64, 1, 32, 8, 3)),
    ],
    "mla_two_tensors": [
        ("default (tma)", {}, None),
        ("pointer loads", {"KV_TMA": False}, None),
        ("64h t64 w8 s2", {}, T(64, 1, 64, 8, 2)),
        ("64h t32 w8 s4", {}, T(64, 1, 32, 8, 4)),
        ("64h t32 w8 s2", {}, T(64, 1, 32, 8, 2)),
    ],
}
SPLITS = {  # more KV splits through the tiling's program target (and fewer tiles a split)
    "mla_latent": [
        ("default", {}, None),
        ("target 528", {"TARGET_PROGRAMS": 528}, None),
        ("target 1056 min4", {"TARGET_PROGRAMS": 1056, "MIN_TILES_PER_SPLIT": 4}, None),
        ("target 528 min4", {"TARGET_PROGRAMS": 528, "MIN_TILES_PER_SPLIT": 4}, None),
    ],
    "mla_two_tensors": [
        ("default", {}, None),
        ("target 528", {"TARGET_PROGRAMS": 528}, None),
        ("target 1056 min4", {"TARGET_PROGRAMS": 1056, "MIN_TILES_PER_SPLIT": 4}, None),
    ],
}
VARIANTS = SPLITS if sys.argv[1:] == ["splits"] else CONFIGS
for name, variants in VARIANTS.items():
    case = cases[name]
    inputs = case_inputs(case, "cuda")
    flop = 2 * case.num_q_heads * sum(case.seq_lens) * (case.head_dim + case.head_dim_v)
    expected = None
    for label, consts, config in variants:
        saved = {k: getattr(tp if k == "KV_TMA" else tiling, k) for k in consts}
        for k, v in consts.items():
            setattr(tp if k == "KV_TMA" else tiling, k, v)
        clear_plans()
        try:
            with override(config):
                prepared = backend.prepare(case, inputs, inputs.new_out())
                got = prepared.to_packed(prepared.run()).float()
                us = time_call(prepared.run, "cuda", target_s=0.3).median_us
            if expected is None:
                expected = got
            ok = torch.allclose(got, expected, atol=case.atol, rtol=case.rtol)
            print(
                f"{name:16s} {label:18s} {us:8.1f} us {flop / us / 1e6:6.1f} TFLOP/s {'' if ok else 'OUTPUT DIFFERS'}",
                flush=True,
            )
        except Exception as error:
            print(
                f"{name:16s} {label:18s} failed: {type(error).__name__}: {str(error).splitlines()[0][:150]}", flush=True
            )
        finally:
            for k, v in saved.items():
                setattr(tp if k == "KV_TMA" else tiling, k, v)
            clear_plans()
