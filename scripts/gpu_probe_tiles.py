"""Probe: time the Triton kernel on one case under several tilings (a launch experiment).

    python scripts/gpu_probe_tiles.py

First written to isolate why the fp32 smoke case `prefill_mqa_odd_shapes` took ~390 µs
on an H200 (answer: 64-row fp32 tiles spill; see gpu_results/2026-11-29-h200-tile-probe);
now it compares larger tiles for half-precision prefill.
Each variant overrides fields of the tiling the launcher would choose; numerics are
checked against the float64 oracle for every variant, so a faster variant is also a right one.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import kernels
from harness.grading import DEFAULT_TOLERANCES, grade
from harness.inputs import make_inputs
from harness.oracle import paged_attention_oracle
from kernels import triton_paged

CASES = {
    "prefill_bf16_q256x4": dict(
        num_q_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=16,
        seq_lens=[2048] * 4,
        q_lens=[256] * 4,
        dtype="bfloat16",
    ),
    "prefill_bf16_q512x4": dict(
        num_q_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=16,
        seq_lens=[4096] * 4,
        q_lens=[512] * 4,
        dtype="bfloat16",
    ),
    "prefill_bf16_q1024_at_100k": dict(
        num_q_heads=32, num_kv_heads=8, head_dim=128, block_size=16, seq_lens=[100000], q_lens=[1024], dtype="bfloat16"
    ),
    "spec_bf16_q4x32": dict(
        num_q_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=16,
        seq_lens=[2048] * 32,
        q_lens=[4] * 32,
        dtype="bfloat16",
    ),
}
VARIANTS = {
    "default": {},
    "m128_w8": {"BLOCK_M": 128, "NUM_WARPS": 8},
    "m64_n128_w8": {"BLOCK_M": 64, "TILE_N": 128, "NUM_WARPS": 8},
    "m128_n128_w8": {"BLOCK_M": 128, "TILE_N": 128, "NUM_WARPS": 8},
    "m128_w4": {"BLOCK_M": 128, "NUM_WARPS": 4},
}


def run_variant(spec: dict, inputs, expected, fields: dict) -> str:
    """Time one tiling variant on one case; return a table line's tail."""
    original = triton_paged.choose_tiling
    group = spec["num_q_heads"] // spec["num_kv_heads"]

    def patched(*args, **kwargs):
        tiling = dataclasses.replace(original(*args, **kwargs), **fields)
        return dataclasses.replace(tiling, BLOCK_Q=max(tiling.BLOCK_M // group, 1))

    triton_paged.choose_tiling = patched
    try:
        args = inputs.args()
        ok = grade(kernels.paged_attention_triton(*args), expected, *DEFAULT_TOLERANCES[spec["dtype"]]).passed
        us = 1e3 * triton.testing.do_bench(lambda: kernels.paged_attention_triton(*args), return_mode="median")
        tiling = patched(spec["head_dim"], group, max(spec["q_lens"]))
        return f"{tiling.BLOCK_M:7d} {tiling.NUM_WARPS:5d} {us:9.1f} {'pass' if ok else 'FAIL':>6s}"
    except Exception as error:  # a variant that does not compile is a finding, not a crash
        return f"error: {type(error).__name__}: {str(error)[:80]}"
    finally:
        triton_paged.choose_tiling = original


def main() -> None:
    print(f"{'case':22s} {'variant':18s} {'BLOCK_M':>7s} {'warps':>5s} {'us':>9s} {'status':>6s}")
    for case_name, spec in CASES.items():
        inputs = make_inputs(**spec, device="cuda")
        expected = paged_attention_oracle(*inputs.args(), device="cuda")
        for variant, fields in VARIANTS.items():
            print(f"{case_name:22s} {variant:18s} {run_variant(spec, inputs, expected, fields)}")


if __name__ == "__main__":
    main()
