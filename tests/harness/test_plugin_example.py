"""The README's examples/triton_paged_plugin.py passes its cases through the CLI (interpreted on a CPU)."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest

import kernels
from tests.fresh_python import ROOT, needs_ptxas, run_fresh

EXAMPLE = ROOT / "examples" / "triton_paged_plugin.py"
# The example's kernel compiled for sm_90 (through ptxas), as a GPU launch of each dtype would compile it.
COMPILE = r"""
import importlib.util, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

spec = importlib.util.spec_from_file_location("example_plugin", "examples/triton_paged_plugin.py")
example = importlib.util.module_from_spec(spec)
sys.modules["example_plugin"] = example
spec.loader.exec_module(example)
fn = example._paged_attention_kernel
INT_PTRS = ("block_table_ptr", "seq_lens_ptr", "query_start_loc_ptr")
for dtype, decode, variants, head_dim, head_dim_v, block_size, block_m in [
    ("bf16", True, False, 128, 128, 16, 16), ("fp16", False, True, 64, 32, 32, 64), ("fp32", False, False, 256, 256, 16, 16)
]:
    constexprs = dict(GROUP=4, HEAD_DIM=head_dim, HEAD_DIM_V=head_dim_v, BLOCK_SIZE=block_size, BLOCK_M=block_m,
                      ONE_QUERY_PER_SEQ=decode, USE_SOFTCAP=variants, USE_WINDOW=variants,
                      DOT_PRECISION="ieee" if dtype == "fp32" else "tf32")
    signature = {p.name: "constexpr" if p.is_constexpr else ("*i32" if p.name in INT_PTRS else "*" + dtype)
                 if p.name.endswith("_ptr") else "fp32" if p.name in ("scale", "softcap") else "i32" for p in fn.params}
    source = ASTSource(fn=fn, signature=signature, constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
    triton.compile(source, target=GPUTarget("cuda", 90, 32))
print("compiled")
"""


@pytest.mark.slow  # a harness run of the example in a fresh interpreter
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


@pytest.mark.slow  # a fresh interpreter compiles through ptxas
@needs_ptxas
def test_the_example_kernel_compiles_for_sm90_without_a_gpu():
    """The interpreter accepts programs the compiler rejects: the example's kernel goes through ptxas for an H200."""
    result = run_fresh("-c", COMPILE)
    assert result.returncode == 0 and result.stdout.strip() == "compiled", result.stderr[-3000:]
