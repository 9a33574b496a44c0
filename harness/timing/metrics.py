"""Derived metrics: pure functions of a case and a measured latency (one formula each)."""

from __future__ import annotations

from harness.cases.spec import Case


def bytes_moved(case: Case) -> int:
    """Fewest bytes a paged-attention call must move through device memory.

    bytes = kv_elt * sum(seq_len for sequences with q_len > 0) * num_kv_heads * (head_dim + head_dim_v)
            + elt * num_tokens * num_q_heads * (head_dim + head_dim_v)
    (kv_elt: 1 for an fp8 cache, else elt; head_dim_v = head_dim but for MLA-shaped cases)
    KV of every sequence that has queries is read once (K and V), q is read once and out
    written once. Block tables and lengths (a few KB) are left out; a sequence with
    q_len 0 reads nothing.
    """
    elt = case.element_bytes
    kv_tokens = sum(n for n, q in zip(case.seq_lens, case.q_lens, strict=True) if q > 0)
    num_tokens = sum(case.q_lens)
    dims = case.head_dim + case.head_dim_v
    return case.kv_element_bytes * kv_tokens * case.num_kv_heads * dims + elt * num_tokens * case.num_q_heads * dims


def attended_pairs(case: Case) -> int:
    """(query, key) pairs the causal rule lets attend, summed over sequences.

    Query j of a sequence with q_len queries over seq_len keys sees seq_len - q_len + j + 1
    keys, so a sequence contributes q_len * (seq_len - q_len) + q_len * (q_len + 1) / 2.
    """
    return sum(q * (n - q) + q * (q + 1) // 2 for n, q in zip(case.seq_lens, case.q_lens, strict=True))


def flops(case: Case) -> int:
    """Useful floating-point operations: 2 * attended_pairs * num_q_heads * (head_dim + head_dim_v).

    A multiply-add (2 flops) per pair, head and dimension of q . k (head_dim) and of p @ v
    (head_dim_v): 4 * pairs * heads * head_dim when the two agree. Softmax exponentials and
    masked-out work are not counted.
    """
    return 2 * attended_pairs(case) * case.num_q_heads * (case.head_dim + case.head_dim_v)


def gbps(num_bytes: int, latency_us: float) -> float:
    """Achieved bandwidth: bytes / latency, in GB/s (1e9 bytes per second)."""
    return num_bytes / (latency_us * 1e3)


def tflops(num_flops: int, latency_us: float) -> float:
    """Achieved rate: flops / latency, in TFLOP/s (1e12 per second)."""
    return num_flops / (latency_us * 1e6)


def pct_of_ceiling(achieved_gbps: float, ceiling_gbps: float) -> float:
    """100 * achieved / ceiling, the ceiling being the measured read bandwidth (a decode kernel only reads)."""
    return 100.0 * achieved_gbps / ceiling_gbps


def pct_of_peak(achieved_tflops: float, peak_tflops: float) -> float:
    """100 * achieved / peak, the peak being the dtype's dense datasheet rate (or the measured matmul)."""
    return 100.0 * achieved_tflops / peak_tflops


def case_cost(case: Case) -> int:
    """Estimated work of a case, flops + bytes_moved: cases go out longest first by it, and shards deal it round robin."""
    return flops(case) + bytes_moved(case)
