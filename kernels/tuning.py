"""The Triton kernel's tile sizes, warps and pipeline stages, by (precision, padded head dim, query class).

precision: "half" (fp16 / bf16), "half_fp8" (with an fp8 cache), "half_latent" (V read from K's tiles; both fall
back to "half"'s key they lack) or "fp32". Query class: "decode", "decode_split" (a decode whose KV is split),
"decode_split_long" (its pieces past 1024 keys), "verify" (2-8 queries) or "prefill". Keys not in :data:`TUNED`
take :func:`default_config`; ``scripts/tune_tiles.py`` measures candidates and prints TUNED's lines
(docs/performance.md, "Tuning the kernel"). TILE_N moves the online softmax's order (tlsim follows it); the rest
change only speed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class TileConfig:
    """max_rows: the cap on BLOCK_M (query tokens x group heads); max_tokens: query tokens a tile packs at most;
    tile_n: KV positions a loop step loads; num_warps (0: 4, or 8 past 64 x 128 tile elements), num_stages."""

    max_rows: int
    max_tokens: int
    tile_n: int
    num_warps: int
    num_stages: int


def query_class(q_len: int) -> str:
    """ "decode" for 1 query, "verify" for 2-8 (speculative decoding), "prefill" beyond."""
    return "decode" if q_len <= 1 else "verify" if q_len <= 8 else "prefill"


def default_config(precision: str, head_dim_padded: int, q_class: str) -> TileConfig:
    """The untuned rule: up to 16 tokens in tiles of at most 64 rows (16 for fp32, whose 64-row tiles spill),
    64 keys a step (32 past head dim 128), warps by tile size, 3 stages."""
    max_rows = 16 if precision == "fp32" else 64
    tile_n = 64 if head_dim_padded <= 128 else 32
    return TileConfig(max_rows, 16, tile_n, 0, 3)


# Each entry: the fastest candidate of `scripts/tune_tiles.py --class C` over the GPU suites' cases the key reaches.
TUNED: dict[tuple[str, int, str], TileConfig] = {
    # A split decode keeps 32-key tiles while its pieces are short (128 would halve the splits a short context allows).
    ("half", 128, "decode"): TileConfig(max_rows=16, max_tokens=1, tile_n=128, num_warps=4, num_stages=3),
    ("half", 128, "decode_split"): TileConfig(max_rows=16, max_tokens=1, tile_n=32, num_warps=4, num_stages=3),
    ("half", 128, "decode_split_long"): TileConfig(max_rows=16, max_tokens=1, tile_n=128, num_warps=4, num_stages=3),
    # An fp8 decode does more per key (its conversions): longer tiles unsplit, 5 stages split (two K / V buffers).
    ("half_fp8", 128, "decode"): TileConfig(max_rows=16, max_tokens=1, tile_n=256, num_warps=4, num_stages=3),
    ("half_fp8", 128, "decode_split"): TileConfig(max_rows=16, max_tokens=1, tile_n=128, num_warps=4, num_stages=5),
    ("half_fp8", 128, "decode_split_long"): TileConfig(max_rows=16, max_tokens=1, tile_n=128, num_warps=4, num_stages=5),
    ("half", 64, "decode"): TileConfig(max_rows=16, max_tokens=1, tile_n=256, num_warps=4, num_stages=2),
    ("half", 256, "decode"): TileConfig(max_rows=16, max_tokens=1, tile_n=64, num_warps=4, num_stages=4),
    ("half", 256, "prefill"): TileConfig(max_rows=128, max_tokens=64, tile_n=64, num_warps=8, num_stages=2),
    ("half", 128, "verify"): TileConfig(max_rows=64, max_tokens=8, tile_n=128, num_warps=4, num_stages=3),
    # 128-key tiles at 2 stages leave no registers for intra-warpgroup overlap (it spills; 64-key tiles lose).
    ("half", 128, "prefill"): TileConfig(max_rows=128, max_tokens=32, tile_n=128, num_warps=8, num_stages=2),
    # MLA's decode over two tensors (64 heads and 256 of V's dims a program).
    ("half", 1024, "decode_split_long"): TileConfig(max_rows=64, max_tokens=1, tile_n=32, num_warps=8, num_stages=2),
    # MLA's latent cache: 2 stages of 64-key tiles fit shared memory because V is taken from the K tile.
    ("half_latent", 1024, "decode"): TileConfig(max_rows=64, max_tokens=1, tile_n=64, num_warps=8, num_stages=2),
    ("half_latent", 1024, "decode_split"): TileConfig(max_rows=64, max_tokens=1, tile_n=64, num_warps=8, num_stages=2),
    ("half_latent", 1024, "decode_split_long"): TileConfig(max_rows=64, max_tokens=1, tile_n=64, num_warps=8, num_stages=2),
}  # fmt: skip

_override: TileConfig | None = None


def tile_config(precision: str, head_dim_padded: int, q_class: str) -> TileConfig:
    """The config a launch of this kind uses: an active :func:`override`, else TUNED, else the default."""
    if _override is not None:
        return _override
    tuned = TUNED.get((precision, head_dim_padded, q_class))
    if tuned is None and precision in ("half_fp8", "half_latent"):  # the bf16 / fp16 entry unless its own
        tuned = TUNED.get(("half", head_dim_padded, q_class))
    return tuned or default_config(precision, head_dim_padded, q_class)


@contextlib.contextmanager
def override(config: TileConfig) -> Iterator[None]:
    """Every launch inside the block uses ``config`` (the tuner's candidates; not thread-safe)."""
    global _override
    saved, _override = _override, config
    try:
        yield
    finally:
        _override = saved
