"""The attention variants: one row per option, naming it once for the case file, the backend
registry and the kernel call.

A case turns a variant on through its case-file field(s); a backend declares the variants it
computes by ``capability`` (``register_backend(..., options=...)``); the contract call takes
the variant's ``keywords``. A case that turns on a variant a backend does not declare is a
skip row naming the capability. docs/contract.md, "Attention variants", says what each
computes; tests/test_vocabulary_agrees.py ties the table to the case model and the contract.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Variant:
    capability: str  # what a backend declares and a case turns on
    case_fields: tuple[str, ...]  # the case file's field(s) that turn it on
    keywords: tuple[str, ...]  # the contract call's keyword(s); () for a shape (head_dim_v)
    turned_on: Callable[[Any], bool]  # case -> whether the case turns it on
    meaning: str


VARIANTS: tuple[Variant, ...] = (
    Variant("sliding_window", ("sliding_window",), ("sliding_window",), lambda c: c.sliding_window is not None,
            "each query sees only its last W keys"),
    Variant("logit_softcap", ("logit_softcap",), ("logit_softcap",), lambda c: c.logit_softcap is not None,
            "logits pass through cap * tanh(logit / cap)"),
    Variant("sinks", ("sinks",), ("sinks",), lambda c: c.sinks is not None,
            "a per-head logit that joins every softmax's denominator"),
    Variant("alibi_slopes", ("alibi",), ("alibi_slopes",), lambda c: c.alibi,
            "slope_h * (key_pos - query_pos) added to each logit"),
    Variant("return_lse", ("return_lse", "cascade"), ("return_lse",), lambda c: c.return_lse or c.cascade,
            "the log-sum-exp returned beside the output"),
    Variant("fp8_kv", ("kv_dtype", "kv_scale"), ("k_scale", "v_scale"), lambda c: c.kv_dtype is not None,
            "an fp8 KV cache with per-head scales"),
    Variant("head_dim_v", ("head_dim_v",), (), lambda c: c.head_dim_v != c.head_dim,
            "V's head size differs from K's (MLA)"),
)  # fmt: skip
CAPABILITIES: tuple[str, ...] = tuple(v.capability for v in VARIANTS)


def turned_on(case: Any) -> frozenset[str]:
    """The capabilities a case needs of a backend."""
    return frozenset(v.capability for v in VARIANTS if v.turned_on(case))
