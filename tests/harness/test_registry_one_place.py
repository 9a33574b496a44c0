"""Adding a backend is one registration: the CLI, pytest's case suite and the benchmarks all pick it up."""

from __future__ import annotations

import pytest

from tests.fresh_python import run_script
from tests.tiny_cases import write_cases

TOY = """
import kernels
from harness import register_backend


def toy_paged_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, scale=None, out=None):
    return kernels.paged_attention_reference(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, out=out)


register_backend("toy", toy_paged_attention)
"""


@pytest.mark.slow  # the CLI, the case suite and the benchmarks in fresh interpreters
def test_one_registration_reaches_the_cli_the_case_suite_and_the_benchmarks(tmp_path):
    plugin = tmp_path / "toy.py"
    plugin.write_text(TOY)

    cases = write_cases(tmp_path / "tiny.toml", {"name": "tiny"})
    done = run_script("-m", "harness", "run", str(cases), "--plugin", str(plugin), "--backend", "toy", "--no-timing",
                      "--no-progress", "--out", str(tmp_path / "run"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "toy" in done.stdout

    # one collection of both suites: each has its own conftest that loads the harness's pytest plugin
    collected = run_script("-m", "pytest", "tests/harness/test_case_suite.py", "benchmarks", "--plugin", str(plugin),
                           "--collect-only", "-q")  # fmt: skip
    assert collected.returncode == 0, collected.stdout + collected.stderr
    lines = collected.stdout.splitlines()
    for suite in ("tests/harness/test_case_suite.py::", "benchmarks/"):
        toy = [line for line in lines if line.startswith(suite) and line.endswith("-toy]")]
        assert toy, (suite, collected.stdout[-2000:])
