"""Derived metrics: pure functions of a case and a measured latency."""

from __future__ import annotations

from .cases import Case


def bytes_moved(case: Case) -> int:
    """Fewest bytes a paged-attention call must move through device memory.

    bytes = elt * (2 * sum(seq_len for sequences with q_len > 0) * num_kv_heads * head_dim
                   + 2 * num_tokens * num_q_heads * head_dim)
    KV of every sequence that has queries is read once (K and V), q is read once and out
    written once. Block tables and lengths (a few KB) are left out; a sequence with
    q_len 0 reads nothing.
    """
    elt = case.element_bytes
    kv_tokens = sum(n for n, q in zip(case.seq_lens, case.q_lens, strict=True) if q > 0)
    num_tokens = sum(case.q_lens)
    return elt * (2 * kv_tokens * case.num_kv_heads * case.head_dim + 2 * num_tokens * case.num_q_heads * case.head_dim)


def gbps(num_bytes: int, latency_us: float) -> float:
    """Achieved bandwidth: bytes / latency, in GB/s (1e9 bytes per second)."""
    return num_bytes / (latency_us * 1e3)


def pct_of_ceiling(achieved_gbps: float, ceiling_gbps: float) -> float:
    """100 * achieved / ceiling, the ceiling being the measured copy bandwidth."""
    return 100.0 * achieved_gbps / ceiling_gbps
