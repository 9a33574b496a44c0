"""The memory estimate covers the measured peak RSS (VmHWM after clear_refs) within 2.5x, and refuses misfits."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.cases.loading import load_cases
from harness.cases.memory import estimate
from harness.cases.spec import CaseFileError, load_case_file
from tests.fresh_python import ROOT
from tests.tiny_cases import write_cases

FACTOR = 2.5

PROBE = """
import json, sys
import torch
torch.set_num_threads(1)
from harness.backends.builtin import REGISTRY
from harness.cases.spec import load_case_file
from harness.cases.memory import estimate
from harness.run.runner import RunConfig, build_context, run_backend

path, backend = sys.argv[1], sys.argv[2]
tiny, case = load_case_file(path)
config = RunConfig(device="cpu", backends=[], timing=False, progress=False)

def status(field):
    with open("/proc/self/status") as lines:
        return next(int(line.split()[1]) * 1024 for line in lines if line.startswith(field))

for c in (tiny, case):
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # the high-water mark restarts at the current RSS
    base = status("VmRSS:")
    ctx = build_context(c, "cpu", "cpu")
    if backend != "none":
        row = run_backend(ctx, REGISTRY[backend], config)
        assert row["status"] == "pass", row
    del ctx
peak = status("VmHWM:") - base
need = estimate(case, [] if backend == "none" else [backend])
print(json.dumps({"measured": peak, "estimate": need.peak}))
"""

PREFILL = (
    {"name": "tiny", "seq_lens": [40], "q_lens": [8]},
    {"name": "prefill_1024", "seq_lens": [1024], "q_lens": [1024]},
)
RAGGED = ({"name": "tiny", "seq_lens": [40, 16, 16]}, {"name": "ragged_prefill", "seq_lens": [8000] + [64] * 31})
# tlsim and reference add tens of MiB on top of these, inside the noise of a small measurement.
MEASURED = [
    ("prefill_oracle", PREFILL, {"num_q_heads": 16, "num_kv_heads": 4, "head_dim": 64}, "none"),
    ("ragged_gather_sdpa", RAGGED, {"num_q_heads": 8, "num_kv_heads": 2, "head_dim": 64, "q_lens": 16}, "gather_sdpa"),
]
BIG = {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "dtype": "bfloat16"}
PREFILL_8K = {"name": "prefill_8k", "seq_lens": [8192], "q_lens": [8192]}


@pytest.mark.slow  # peak memory measured in fresh interpreters
def test_estimate_covers_the_measured_peak_within_a_factor(tmp_path):
    """Oracle-bound (1024 x 1024 prefill, 16 heads) and padded-peer-bound (a ragged batch)."""
    procs = {}
    for name, cases, defaults, backend in MEASURED:  # in parallel: each is its own process
        path = write_cases(tmp_path / f"{name}.toml", *cases, defaults=defaults)
        # A clean environment and an oracle cache of its own: nothing another test set in this
        # worker process (a cache folder, a verify fraction, thread counts) reaches the measurement.
        env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", str(tmp_path)),
               "PYTHONPATH": str(ROOT), "HARNESS_ORACLE_CACHE": str(tmp_path / f"{name}-oracle")}  # fmt: skip
        procs[name] = subprocess.Popen([sys.executable, "-c", PROBE, str(path), backend], cwd=ROOT, env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        result = json.loads(out.strip().splitlines()[-1])
        measured, estimated = result["measured"], result["estimate"]
        ratio = estimated / measured
        print(f"{name}: measured {measured / 2**20:.0f} MiB, estimated {estimated / 2**20:.0f} MiB ({ratio:.2f}x)")
        assert measured <= estimated, f"{name}: measured {measured} above the estimate {estimated}"
        assert ratio <= FACTOR, f"{name}: estimate {ratio:.2f}x the measured peak"


def test_an_8k_prefill_and_a_100k_ragged_batch_are_weighed_by_their_worst_step_and_refused_with_the_numbers(tmp_path):
    """An 8192 x 8192 prefill of 32 heads and a 1 x 100k + 4095 x 1 ragged batch."""
    path = write_cases(tmp_path / "big.toml", PREFILL_8K,
                       {"name": "ragged_100k", "seq_lens": {"count": 4096, "min": 1, "max": 1, "distribution": "fixed"}},
                       defaults=BIG)  # fmt: skip
    prefill, ragged = load_case_file(path)
    ragged = ragged.__class__(**{**ragged.__dict__, "seq_lens": (100_000,) + (1,) * 4095, "q_lens": (1,) * 4096})
    need = estimate(prefill)
    assert need.steps["oracle"] >= 4 * 8192 * 8192 * 32 * 8 and need.worst_step == "oracle"
    assert need.steps["error bound"] < 2 * 2**30, "the error bound works in chunks of query rows"
    assert need.peak > 64 * 2**30
    padded = estimate(ragged).steps["gather_sdpa"]
    assert padded >= 2 * 4096 * 8 * 100_000 * 128 * 2, "padded peers hold num_seqs x max_seq_len"
    assert estimate(ragged, ["tlsim"]).peak < padded / 100, "a backend that does not pad is not charged for it"
    with pytest.raises(CaseFileError) as info:
        load_cases([path], device="cpu")
    message = str(info.value)
    assert f"{path}: case 'prefill_8k': field 'seq_lens': too large for cpu memory: needs about" in message
    assert "then oracle" in message and "GiB available" in message
    kept = load_cases([path], device="cpu", keep=lambda case_id: case_id == "ragged_100k")
    assert [c.id for c in kept] == ["ragged_100k"], "-k picks the cases before the memory check"


def test_the_estimate_follows_the_backends_chosen(tmp_path):
    ragged = {"name": "ragged", "num_q_heads": 8, "num_kv_heads": 8, "head_dim": 128, "seq_lens": [200000] + [1] * 31}
    case = load_case_file(write_cases(tmp_path / "big.toml", ragged, defaults={}))[0]
    assert estimate(case, ["gather_sdpa"]).peak > 3 * estimate(case, ["tlsim"]).peak
    excluded = {**ragged, "exclude_backends": ["gather_sdpa", "sdpa_contiguous", "flex_attention"]}
    excluded_case = load_case_file(write_cases(tmp_path / "excluded.toml", excluded, defaults={}))[0]
    assert estimate(excluded_case).peak == estimate(case, ["reference", "tlsim", "triton", "cache"]).peak
