"""The code under test: paged-attention backends sharing one contract (docs/contract.md). Importing this package
does not import Triton (``paged_attention_triton`` loads on first use), so ``use_interpreter_if_no_gpu()`` can
still choose Triton's CPU interpreter.
"""

from .cache import CacheFullError, PagedKVCache, StepMetadata
from .cascade import cascade_attention, merge_attention_states
from .contract import CHECK_ENV, checks_enabled
from .dispatch import (
    BACKEND_ENV,
    BackendUnavailableError,
    has_triton,
    paged_attention_dispatch,
    select_backend,
    triton_unavailable_reason,
    use_interpreter_if_no_gpu,
)
from .reference import paged_attention_reference
from .tlsim import paged_attention_tlsim


def _triton_missing(*args, **kwargs):
    """Stand-in when Triton is missing: says so instead of failing at import."""
    raise BackendUnavailableError("paged_attention_triton needs Triton: pip install triton")


def __getattr__(name: str):
    """``kernels.paged_attention_triton``, imported (with Triton) on first access."""
    if name == "paged_attention_triton":
        if not has_triton():
            return _triton_missing
        from .triton_paged import paged_attention_triton

        globals()[name] = paged_attention_triton  # later lookups skip this function
        return paged_attention_triton
    raise AttributeError(f"module 'kernels' has no attribute {name!r}")


__all__ = [
    "BACKEND_ENV", "CHECK_ENV", "BackendUnavailableError", "CacheFullError", "PagedKVCache", "StepMetadata",
    "cascade_attention", "checks_enabled", "has_triton", "merge_attention_states", "paged_attention_dispatch",
    "paged_attention_reference", "paged_attention_tlsim", "paged_attention_triton", "select_backend",
    "triton_unavailable_reason", "use_interpreter_if_no_gpu",
]  # fmt: skip
