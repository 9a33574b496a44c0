"""scripts/sass_census.py with kernels.tiling.DEVICE_SPLIT set as asked, and the 8B decode's launches at
the lengths of its cases added (cases/gpu.toml, seed 7: 64 lognormal lengths, 1000-31024 keys).

    PYTHONPATH=<triton-3.6 site>:. python gpu_results/2026-12-02-h200-device-split/census_switch.py on|off [census args]
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import kernels.tiling  # noqa: E402
from harness.cases.spec import load_case_file  # noqa: E402

switch = sys.argv.pop(1)
assert switch in ("on", "off"), "first argument: on or off"
kernels.tiling.DEVICE_SPLIT = switch == "on"
lens = list(next(c for c in load_case_file(ROOT / "cases" / "gpu.toml") if c.name == "llama3_8b_decode_fp8").seq_lens)
census = runpy.run_path(str(ROOT / "scripts" / "sass_census.py"), run_name="census")
Launch, launches = census["Launch"], census["LAUNCHES"]
launches["llama3_8b_decode_fp8 (64 lognormal)"] = Launch(32, 8, 128, 16, lens, torch.bfloat16, torch.float8_e4m3fn)
launches["llama3_8b_decode_bf16_twin (64 lognormal)"] = Launch(32, 8, 128, 16, lens, torch.bfloat16)
census["main"]()
