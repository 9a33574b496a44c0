"""The code under test: paged-attention backends sharing one contract (see DESIGN.md).

out = fn(q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, scale=None, out=None)
"""

from .cache import CacheFullError, PagedKVCache
from .dispatch import (
    BACKEND_ENV,
    BackendUnavailableError,
    has_triton,
    paged_attention_dispatch,
    select_backend,
    triton_unavailable_reason,
)
from .reference import paged_attention_reference
from .tlsim import paged_attention_tlsim

if has_triton():
    from .triton_paged import paged_attention_triton
else:

    def paged_attention_triton(*args, **kwargs):
        """Stand-in when Triton is missing: says so instead of failing at import."""
        raise BackendUnavailableError("paged_attention_triton needs Triton: pip install triton")


__all__ = [
    "BACKEND_ENV",
    "BackendUnavailableError",
    "CacheFullError",
    "PagedKVCache",
    "has_triton",
    "paged_attention_dispatch",
    "paged_attention_reference",
    "paged_attention_tlsim",
    "paged_attention_triton",
    "select_backend",
    "triton_unavailable_reason",
]
