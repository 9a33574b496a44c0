"""The README's worked example, examples/triton_paged_plugin.py: a Triton paged-attention kernel written
outside this project, with a plan step, declared limits and variants, passes its cases through the CLI
(on the CPU under Triton's interpreter, bf16 included; on a GPU compiled)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import kernels

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "triton_paged_plugin.py"


@pytest.mark.timeout(120)
def test_the_example_triton_plugin_passes_its_cases_and_skips_the_one_outside_its_limits(tmp_path):
    if not kernels.has_triton():
        pytest.skip("the example is a Triton kernel: pip install triton")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(EXAMPLE), "--no-timing", "--no-progress", "--out", str(tmp_path / "run")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=110)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = pd.read_parquet(tmp_path / "run" / "results.parquet").set_index("case")
    skipped = rows[rows["status"] == "skip"]
    assert list(skipped.index) == ["block_size_8"]
    assert skipped["reason"].iloc[0] == "example_triton limits block_size to multiples of 16; the case's is 8"
    passed = rows[rows["status"] == "pass"]
    assert len(passed) == len(rows) - 1, rows[["status", "reason"]]
    assert {"float32", "float16", "bfloat16"} <= set(passed["dtype"])
    assert "--- output of" not in done.stderr
