"""Derived metrics: pure functions of a case and a measured latency (one formula each)."""

from harness.cases.spec import Case


def kv_tokens_read(case: Case) -> int:
    """Distinct KV positions (per KV head) the call must read: per sequence with queries, seq_len minus the
    earliest key any of its queries sees (0, or with a window W the first query's oldest key,
    seq_len - q_len - W + 1); a "shared_prefix" layout's prefix counts once."""
    window = case.sliding_window
    prefix = case.prefix_blocks * case.block_size
    own, prefix_start = 0, prefix
    for n, q in zip(case.seq_lens, case.q_lens, strict=True):
        if q == 0:
            continue
        first = 0 if window is None else max(0, n - q - window + 1)
        own += n - max(first, prefix)
        prefix_start = min(prefix_start, first)
    return own + (prefix - prefix_start)


def bytes_moved(case: Case) -> int:
    """Fewest bytes a paged-attention call must move through device memory: the KV it reads (:func:`kv_tokens_read`),
    q and the output; block tables and lengths left out."""
    elt = case.element_bytes
    num_tokens = sum(case.q_lens)
    dims = case.head_dim + case.head_dim_v
    kv_dims = case.head_dim if case.latent_kv else dims  # a latent cache: V is K's first columns, read once
    return (case.kv_element_bytes * kv_tokens_read(case) * case.num_kv_heads * kv_dims
            + elt * num_tokens * case.num_q_heads * dims)  # fmt: skip


def attended_pairs(case: Case) -> int:
    """(query, key) pairs the causal rule (and a sliding window) lets attend, summed over sequences: query j
    sits at p = seq_len - q_len + j and sees p + 1 keys (with a window W, min(p + 1, W))."""
    window = case.sliding_window
    total = 0
    for n, q in zip(case.seq_lens, case.q_lens, strict=True):
        if window is None:
            total += q * (n - q) + q * (q + 1) // 2
        else:  # positions below W see p + 1 keys (an arithmetic series), the rest W each
            low, split = n - q, min(max(window, n - q), n)
            total += (split * (split + 1) - low * (low + 1)) // 2 + (n - split) * window
    return total


def flops(case: Case) -> int:
    """Useful floating-point operations, 2 * attended_pairs * num_q_heads * (head_dim + head_dim_v): no softmax."""
    return 2 * attended_pairs(case) * case.num_q_heads * (case.head_dim + case.head_dim_v)


def gbps(num_bytes: int, latency_us: float) -> float:
    """Achieved bandwidth: bytes / latency, in GB/s (1e9 bytes per second)."""
    return num_bytes / (latency_us * 1e3)


def tflops(num_flops: int, latency_us: float) -> float:
    """Achieved rate: flops / latency, in TFLOP/s (1e12 per second)."""
    return num_flops / (latency_us * 1e6)


def case_cost(case: Case) -> int:
    """Estimated work of a case, flops + bytes_moved: cases go out longest first by it, and shards deal it round robin."""
    return flops(case) + bytes_moved(case)
