"""The attention-variant cases of the kernel tests: a kernel case of tests/kernels/kernel_cases.py plus the
variant keywords of its calls (sliding_window, logit_softcap, sinks, alibi_slopes)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.backends.builtin import REGISTRY
from harness.cases.spec import expand_spec
from harness.cases.variants import standard_alibi_slopes
from harness.cases.vocab import DEFAULT_TOLERANCES
from harness.execute.local import run_cases
from harness.run.runner import RunConfig
from tests.kernels.kernel_cases import CASES_BY_NAME, KernelCase

SINKS_8 = (30.0, -30.0, 5.0, -1000.0, 0.0, 2.0, 100.0, -5.0)


@dataclass(frozen=True)
class VariantCase:
    """A kernel case plus the variant keywords of its calls (sinks/alibi as host tuples)."""

    name: str
    base: KernelCase
    options: dict = field(default_factory=dict, hash=False, compare=False)

    def __str__(self) -> str:
        return self.name

    def kwargs(self, device: str = "cpu") -> dict:
        """The options as call keywords: tuples become [num_q_heads] fp32 tensors on ``device``."""
        return {k: torch.tensor(v, dtype=torch.float32, device=device) if isinstance(v, tuple) else v
                for k, v in self.options.items()}  # fmt: skip


def _case(name: str, base: str, **options) -> VariantCase:
    return VariantCase(name, CASES_BY_NAME[base], options)


def _slopes(n: int) -> tuple[float, ...]:
    return tuple(standard_alibi_slopes(n))


SINKS_SPLIT = tuple(float(x) for x in torch.linspace(-3, 8, 8))
CAP_AND_SLOPES = {"logit_softcap": 20.0, "alibi_slopes": _slopes(8)}
VARIANT_CASES = [
    _case("window1_decode", "base", sliding_window=1),
    _case("window5_spec_verify", "spec_verify", sliding_window=5),
    _case("window_equal_context", "prefill_full", sliding_window=37),
    _case("window_wider_than_context", "base", sliding_window=1000),
    # Windows of 1200 and 1000 keep the split (it is sized for W + the queries' span, 32 tokens in the
    # prefill case). With 1000 the first sequence's early rows still see no key of its second split,
    # and the second's window starts inside its first tile.
    _case("window_split_kv_decode", "split_kv_decode", sliding_window=1200),
    _case("window_split_kv_prefill", "split_kv_prefill_early_rows", sliding_window=1000),
    # A window of 1200, not a narrow one: narrow windows here can put one p on the other side of a bf16
    # rounding from the kernel's (the dots' summation order), past the two-ulp closeness bound.
    _case("window_bfloat16_split_kv", "bfloat16_split_kv", sliding_window=1200),
    _case("softcap50_large_logits", "large_logits", logit_softcap=50.0),
    _case("softcap2_prefill", "prefill_chunk_many_tiles", logit_softcap=2.0),
    _case("softcap_bfloat16", "bfloat16_large_logits", logit_softcap=30.0),
    _case("sinks_extreme", "base", sinks=SINKS_8),
    _case("sinks_split_kv", "split_kv_decode", sinks=SINKS_SPLIT),
    _case("sinks_float16", "float16_prefill", sinks=tuple(float(x) for x in torch.linspace(-2, 2, 8))),
    _case("alibi_gqa_group6", "gqa_group6", alibi_slopes=_slopes(12)),
    _case("alibi_prefill", "prefill_chunk_many_tiles", alibi_slopes=_slopes(4)),
    _case("alibi_split_kv", "split_kv_decode", alibi_slopes=_slopes(8)),
    _case("all_four_spec_verify", "spec_verify", sliding_window=9, sinks=SINKS_8, **CAP_AND_SLOPES),
    _case("all_four_split_kv", "split_kv_decode", sliding_window=1200, sinks=SINKS_SPLIT, **CAP_AND_SLOPES),
]
BY_NAME = {c.name: c for c in VARIANT_CASES}
# Graded against the oracle only, like kernel_cases.FP32_PRECISION_CASES: a cap of 50 over logits of ~36 std
# lets each q . k's fp32 summation order reach the output, past the tlsim-vs-kernel closeness bound.
ORACLE_ONLY = {"softcap50_large_logits"}


def tolerance(case: VariantCase) -> tuple[float, float]:
    """The (atol, rtol) of the case's dtype."""
    return DEFAULT_TOLERANCES[case.base.dtype]


def graded_rows(case, *backends):
    """The CPU run's rows, by backend, of one case (or spec dict) through ``backends`` (names or Backends), untimed."""
    if isinstance(case, dict):
        (case,) = expand_spec(case, "t.toml")
    chosen = [REGISTRY[backend] if isinstance(backend, str) else backend for backend in backends]
    frame = run_cases([case], RunConfig(device="cpu", backends=chosen, timing=False, progress=False))
    return frame.set_index("backend")
