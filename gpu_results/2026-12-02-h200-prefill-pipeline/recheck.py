"""The re-check call: tlsim against the kernel on the GPU for a bf16 prefill at head dim 128 (the case
bfloat16_prefill_hd128 that call 1 had in tests/kernel_cases.py, left out of the suite since), under the
prefill entry (128-key tiles), under 64-key tiles and under 64-key tiles with the lag; the gap against
test_tlsim_predicts_triton's bound (two output ulps).

    PYTHONPATH=. python gpu_results/2026-12-02-h200-prefill-pipeline/recheck.py
"""

from __future__ import annotations

from dataclasses import replace

import torch

import kernels
from kernels import tuning
from kernels.launch_plan import clear_plans
from tests.kernel_cases import BASE

case = replace(
    BASE, name="bfloat16_prefill_hd128", dtype="bfloat16", head_dim=128, seq_lens=(200, 90), q_lens=(200, 40)
)
inputs = case.inputs("cuda" if torch.cuda.is_available() else "cpu")
for label, config in [("entry t128", None), ("t64", tuning.TileConfig(128, 32, 64, 8, 2)),
                      ("lag t64", tuning.TileConfig(128, 32, 64, 8, 2, pv_lag=True))]:  # fmt: skip
    clear_plans()
    with tuning.override(config) if config else torch.no_grad():  # tlsim takes the same tiling
        sim = kernels.paged_attention_tlsim(*inputs.args()).double()
        real = kernels.paged_attention_triton(*inputs.args()).double()
    gap = (sim - real).abs()
    allowed = 2 * torch.finfo(inputs.q.dtype).eps * real.abs().clamp_min(2**-6)
    print(
        f"{label}: max gap {float(gap.max()):.3g}, max gap / bound {float((gap / allowed).max()):.3f}, "
        f"elements past the bound {int((gap > allowed).sum())} of {gap.numel()}"
    )
