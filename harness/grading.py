"""Grading a backend's output against the float64 oracle: an accuracy record, not a bool.

Default tolerances, per dtype, are the ones the kernels are held to (allclose rule:
``|out - expected| <= atol + rtol * |expected|`` elementwise, and no NaN anywhere):

* float32  atol 1e-5, rtol 1e-4: the kernel's fp32 contract. Streaming softmax only
  reassociates fp32 sums (errors ~1e-7 on O(1) outputs), so this leaves 100x headroom
  while still catching TF32 (~1e-3) and any real indexing or masking bug.
* float16  atol 1e-3, rtol 1e-3: the output is rounded to fp16 (half an ulp at 1.0 is
  4.9e-4) and p is rounded to fp16 before ``p @ v``; 1e-3 is about two ulps, the figure
  FlashInfer's and vLLM's fp16 attention tests use.
* bfloat16 atol 1e-2, rtol 1e-2: bf16 has 8 bits of mantissa (half an ulp at 1.0 is
  3.9e-3, at 2.0 it is 7.8e-3); 1e-2 is the usual bf16 attention tolerance.

A case file may override either number per dtype; the report keeps the ones used.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-5, 1e-4),
    "float16": (1e-3, 1e-3),
    "bfloat16": (1e-2, 1e-2),
}


@dataclass(frozen=True)
class Grade:
    """How far one output is from the oracle.

    max_abs_err  max |out - expected|
    max_rel_err  max |out - expected| / max(|expected|, atol): relative error where the
                 expected value is not tiny, and absolute error in atol units where it is
    rel_l2_err   ||out - expected||_2 / ||expected||_2
    nan_count    elements of out that are NaN or inf (never pass)
    tol_ratio    max |out - expected| / (atol + rtol * |expected|): the margin to the
                 tolerance (<= 1 passes; 0.1 means ten times inside it)
    passed       nan_count == 0 and every element within atol + rtol * |expected|
    worst_index  (token, head, dim) of the largest violation of the allclose rule
    """

    max_abs_err: float
    max_rel_err: float
    rel_l2_err: float
    nan_count: int
    tol_ratio: float
    atol: float
    rtol: float
    passed: bool
    worst_index: tuple[int, ...]

    @property
    def reason(self) -> str:
        """Empty when passed; otherwise why, in words a person can act on."""
        if self.passed:
            return ""
        if self.nan_count:
            return f"{self.nan_count} NaN/inf outputs (unwritten rows, or a read of an unowned slot)"
        return (
            f"max abs err {self.max_abs_err:.3g} at (token, head, dim) {self.worst_index} "
            f"exceeds atol {self.atol:g} + rtol {self.rtol:g} * |expected|"
        )


def grade(out: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float) -> Grade:
    """Compare ``out`` (any dtype, any device) with ``expected`` (float64) elementwise."""
    actual = out.detach().to(expected.device, torch.float64)
    if actual.shape != expected.shape:
        raise ValueError(f"output shape {tuple(actual.shape)} differs from expected {tuple(expected.shape)}")
    finite = torch.isfinite(actual)
    nan_count = int((~finite).sum())
    diff = torch.where(finite, (actual - expected).abs(), torch.inf)
    if diff.numel() == 0:
        return Grade(0.0, 0.0, 0.0, 0, 0.0, atol, rtol, True, ())
    allowed = atol + rtol * expected.abs()
    excess = diff - allowed
    worst = tuple(int(i) for i in torch.unravel_index(torch.argmax(excess), excess.shape))
    finite_diff = torch.where(finite, diff, 0.0)
    ref_norm = float(torch.linalg.vector_norm(expected))
    return Grade(
        max_abs_err=float(finite_diff.max()) if nan_count == 0 else float("inf"),
        max_rel_err=float((finite_diff / expected.abs().clamp_min(atol)).max()) if nan_count == 0 else float("inf"),
        rel_l2_err=float(torch.linalg.vector_norm(finite_diff)) / ref_norm if ref_norm else 0.0,
        nan_count=nan_count,
        tol_ratio=float((diff / allowed).max()),
        atol=atol,
        rtol=rtol,
        passed=nan_count == 0 and bool((excess <= 0).all()),
        worst_index=worst,
    )
