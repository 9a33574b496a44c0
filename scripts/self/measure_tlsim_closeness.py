"""Print how close tlsim is to the Triton kernel on every kernel test case.

    TRITON_INTERPRET=1 python scripts/self/measure_tlsim_closeness.py   # CPU, interpreter
    python scripts/self/measure_tlsim_closeness.py                      # a CUDA machine

Columns: largest |tlsim - triton|, as a share of the tolerance, and the share of identical elements."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import kernels
from harness.cases.vocab import DEFAULT_TOLERANCES
from tests.kernels.kernel_cases import KERNEL_CASES


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="tlsim against the Triton kernel on the kernel test cases")
    parser.add_argument("--limit", type=int, help="only the first N cases (CI's dry run)")
    args = parser.parse_args(argv)
    kernels.use_interpreter_if_no_gpu()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"{'case':28s} {'max_gap':>9s} {'frac_of_tol':>11s} {'identical':>9s}   device={device}")
    for case in KERNEL_CASES[: args.limit]:
        inputs = case.inputs(device)
        sim = kernels.paged_attention_tlsim(*inputs.args()).double()
        real = kernels.paged_attention_triton(*inputs.args()).double()
        atol, rtol = DEFAULT_TOLERANCES[case.dtype]
        gap = (sim - real).abs()
        frac = float((gap / (atol + rtol * real.abs())).max())
        print(f"{case.name:28s} {float(gap.max()):9.2e} {frac:11.3f} {float((gap == 0).double().mean()):9.3f}")


if __name__ == "__main__":
    main()
