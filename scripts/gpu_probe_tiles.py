"""Probe: time the Triton kernel on one case under several tilings (a launch experiment).

    python scripts/gpu_probe_tiles.py

Written to isolate why the smoke case `prefill_mqa_odd_shapes` (fp32, head_dim 80 padded
to 128, BLOCK_M 64, 4 warps) took ~390 µs on an H200 where similar tiny cases take ~10 µs.
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
    "odd_fp32_hd80_bs5": dict(
        num_q_heads=4,
        num_kv_heads=1,
        head_dim=80,
        block_size=5,
        seq_lens=[23, 7, 12],
        q_lens=[9, 0, 3],
        dtype="float32",
    ),
    "odd_bf16_hd80_bs5": dict(
        num_q_heads=4,
        num_kv_heads=1,
        head_dim=80,
        block_size=5,
        seq_lens=[23, 7, 12],
        q_lens=[9, 0, 3],
        dtype="bfloat16",
    ),
    "odd_fp32_hd64_bs16": dict(
        num_q_heads=4,
        num_kv_heads=1,
        head_dim=64,
        block_size=16,
        seq_lens=[23, 7, 12],
        q_lens=[9, 0, 3],
        dtype="float32",
    ),
    "prefill_fp32_hd128": dict(
        num_q_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=16,
        seq_lens=[2048] * 4,
        q_lens=[256] * 4,
        dtype="float32",
    ),
    "prefill_bf16_hd128": dict(
        num_q_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=16,
        seq_lens=[2048] * 4,
        q_lens=[256] * 4,
        dtype="bfloat16",
    ),
}
VARIANTS = {
    "default": {},
    "warps8": {"NUM_WARPS": 8},
    "block_m16": {"BLOCK_M": 16},
    "block_m32": {"BLOCK_M": 32},
    "block_m16_warps8": {"BLOCK_M": 16, "NUM_WARPS": 8},
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
