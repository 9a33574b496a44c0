"""tlsim against the kernel on the bf16 MLA kernel case, in output ulps: the latent view, the same view run
as two tensors (LATENT_KV off: V in 2 parts), and V a tensor of its own (a copy).

    PYTHONPATH=. python gpu_results/2026-12-02-h200-mla-latent/tlsim_gap.py
"""

from __future__ import annotations

import dataclasses

import torch

import kernels
from kernels import tiling
from kernels.launch_plan import clear_plans
from tests.kernel_cases import KERNEL_CASES

DEV = "cuda" if torch.cuda.is_available() else "cpu"
case = next(c for c in KERNEL_CASES if c.name == "bfloat16_mla_latent")
for label, latent_on, copy in [("latent view", True, False), ("view, LATENT_KV off", False, False),
                               ("V a copy", True, True)]:  # fmt: skip
    tiling.LATENT_KV = latent_on
    clear_plans()
    inputs = case.inputs(DEV)
    if copy:
        inputs = dataclasses.replace(inputs, v_cache=inputs.v_cache.contiguous())
    sim = kernels.paged_attention_tlsim(*inputs.args()).double()
    real = kernels.paged_attention_triton(*inputs.args()).double()
    ulps = (sim - real).abs() / (torch.finfo(torch.bfloat16).eps * real.abs().clamp_min(2**-6))
    print(f"{label:<22} max gap {float((sim - real).abs().max()):.3g}, {float(ulps.max()):.2f} ulps "
          f"(the test allows 2), elements over 2: {int((ulps > 2).sum())} of {ulps.numel()}")  # fmt: skip
tiling.LATENT_KV = True
