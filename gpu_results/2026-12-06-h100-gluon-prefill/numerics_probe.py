"""Probe: Hopper's prefill against the Triton kernel and tlsim on tests/kernels/test_gluon_prefill.py's cases (bf16 ulps)."""
import sys; from pathlib import Path; sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch, kernels
from kernels import gluon_prefill, triton_paged
from kernels.launch_plan import clear_plans
from harness.run.oracle import paged_attention_oracle
from harness.cases.vocab import DEFAULT_TOLERANCES
from harness.run.grading import grade
from tests.kernels.test_gluon_prefill import CASES
def ulps(a, b, dt):
    eps = torch.finfo(dt).eps
    return float(((a.double() - b.double()).abs() / (eps * b.double().abs().clamp_min(2**-6))).max())
for case in CASES:
    inputs = case.inputs("cuda")
    sim = kernels.paged_attention_tlsim(*inputs.args())
    outs = {}
    for enabled in (True, False):
        gluon_prefill.ENABLED = enabled; clear_plans()
        outs[enabled] = kernels.paged_attention_triton(*inputs.args(), out=inputs.new_out())
    exp = paged_attention_oracle(*inputs.args())
    tol = DEFAULT_TOLERANCES[case.dtype]
    g = grade(outs[True], exp, *tol)
    print(f"{case.name:32s} oracle {g.passed} ratio {g.tol_ratio:.2f} | ulps gluon-tlsim {ulps(outs[True], sim, sim.dtype):.2f} triton-tlsim {ulps(outs[False], sim, sim.dtype):.2f} gluon-triton {ulps(outs[True], outs[False], sim.dtype):.2f} nan {int(outs[True].isnan().sum())}", flush=True)
