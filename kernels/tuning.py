"""The Triton kernel's tile sizes, warps and pipeline stages, chosen by measured tuning.

A launch's shape is looked up by (precision, padded head dim, query class):

    precision        "half" (fp16 / bf16: tensor-core dots), "half_fp8" (the same with an fp8 cache),
                     "half_latent" (the same with V read from K's tiles: kernels.tiling.latent_kv; each falls
                     back to "half"'s key it lacks) or "fp32" (IEEE fp32 dots)
    head_dim_padded  the head dim rounded up to a power of two (at least 16)
    query class      "decode" (one query per sequence), "decode_split" (a decode with too few programs to fill
                     the GPU, whose KV is split), "decode_split_long" (such a split whose pieces cover more than
                     1024 keys), "verify" (2-8: speculative verification), "prefill" (more)

and gives a :class:`TileConfig`. Keys not in :data:`TUNED` take :func:`default_config`, the untuned rule.
``scripts/tune_tiles.py`` measures candidate configs on the GPU at hand and prints the table to paste into
:data:`TUNED` (docs/performance.md, "Tuning the kernel").

TILE_N moves the order of the online softmax (tlsim follows it through ``kernels.tiling.tiling_for``); BLOCK_M,
warps and stages change only speed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class TileConfig:
    """max_rows: the cap on BLOCK_M (rows = query tokens x the group's query heads, for groups under 16 heads;
    a group of 16 or more takes one token a tile); max_tokens: the query tokens a tile packs at most; tile_n: KV
    positions a loop step loads; num_warps (0: 4, or 8 past 64 x 128 tile elements) and num_stages: Triton's."""

    max_rows: int
    max_tokens: int
    tile_n: int
    num_warps: int
    num_stages: int


def query_class(q_len: int) -> str:
    """ "decode" for 1 query, "verify" for 2-8 (speculative decoding), "prefill" beyond."""
    if q_len <= 1:
        return "decode"
    return "verify" if q_len <= 8 else "prefill"


def default_config(precision: str, head_dim_padded: int, q_class: str) -> TileConfig:
    """The untuned rule: up to 16 tokens in tiles of at most 64 rows for tensor cores (16 for fp32, whose dots
    run on CUDA cores and whose 64-row tiles spill), 64 keys a step (32 past head dim 128), warps by tile size,
    3 stages (Triton's own default on CUDA)."""
    max_rows = 16 if precision == "fp32" else 64
    tile_n = 64 if head_dim_padded <= 128 else 32
    return TileConfig(max_rows, 16, tile_n, 0, 3)


# Measured entries; every other key takes default_config. Each is the fastest candidate, against the default
# config, of `python scripts/tune_tiles.py --class C` on one H200 (torch 2.11, Triton 3.6, bf16, shuffled blocks
# of 16) over the cases of the GPU suites that the key reaches.
TUNED: dict[tuple[str, int, str], TileConfig] = {
    # Unsplit decode: 128-key tiles. A decode whose KV is split keeps 32-key tiles while its pieces are
    # short (128-key tiles would halve the splits a short context allows), 128 past 1024 keys a piece.
    ("half", 128, "decode"): TileConfig(max_rows=16, max_tokens=1, tile_n=128, num_warps=4, num_stages=3),
    ("half", 128, "decode_split"): TileConfig(max_rows=16, max_tokens=1, tile_n=32, num_warps=4, num_stages=3),
    ("half", 128, "decode_split_long"): TileConfig(max_rows=16, max_tokens=1, tile_n=128, num_warps=4, num_stages=3),
    # An fp8 cache's decode does more per key than bf16's (the fp8 -> fp16 conversions): longer tiles unsplit
    # (256 keys), and a deeper pipeline when split (5 stages: two K / V buffers in shared memory, 3 and 4 give one).
    ("half_fp8", 128, "decode"): TileConfig(max_rows=16, max_tokens=1, tile_n=256, num_warps=4, num_stages=3),
    ("half_fp8", 128, "decode_split"): TileConfig(max_rows=16, max_tokens=1, tile_n=128, num_warps=4, num_stages=5),
    ("half_fp8", 128, "decode_split_long"): TileConfig(
        max_rows=16, max_tokens=1, tile_n=128, num_warps=4, num_stages=5
    ),
    # decode_32x4k_hd64.
    ("half", 64, "decode"): TileConfig(max_rows=16, max_tokens=1, tile_n=256, num_warps=4, num_stages=2),
    # gemma2_9b_hd256_decode (16 q / 8 KV heads, 32 sequences of 500-4000), the only hd256 case measured.
    ("half", 256, "decode"): TileConfig(max_rows=16, max_tokens=1, tile_n=64, num_warps=4, num_stages=4),
    # chunked_8x512_gemma2_softcap (16 q / 8 KV heads, softcap): 128-row tiles of 64 tokens, 64-key tiles.
    ("half", 256, "prefill"): TileConfig(max_rows=128, max_tokens=64, tile_n=64, num_warps=8, num_stages=2),
    # spec_verify_32x4k, q_len 2, 4 and 8.
    ("half", 128, "verify"): TileConfig(max_rows=64, max_tokens=8, tile_n=128, num_warps=4, num_stages=3),
    # The five prefill cases of cases/gpu_peers.toml. 128-key tiles at 2 stages leave no registers for
    # FlashAttention-3's intra-warpgroup overlap (it spills at 128 keys; its 64-key tiles lose to these).
    ("half", 128, "prefill"): TileConfig(max_rows=128, max_tokens=32, tile_n=128, num_warps=8, num_stages=2),
    # MLA's decode over two tensors (deepseek_v3_mla_decode: 64 heads and 256 of V's dims a program, split in
    # pieces of 1984 keys): 32-key tiles at 2 stages, measured on an H100 against the default's 3.
    ("half", 1024, "decode_split_long"): TileConfig(max_rows=64, max_tokens=1, tile_n=32, num_warps=8, num_stages=2),
    # MLA's latent cache (kernels.tiling.latent_kv: 64 heads a program, V whole and taken from the K tile): 64-key
    # tiles, 8 warps, 2 stages in 216 KB of shared memory, which a separate V of the same tiles would not fit.
    ("half_latent", 1024, "decode"): TileConfig(max_rows=64, max_tokens=1, tile_n=64, num_warps=8, num_stages=2),
    ("half_latent", 1024, "decode_split"): TileConfig(max_rows=64, max_tokens=1, tile_n=64, num_warps=8, num_stages=2),
    ("half_latent", 1024, "decode_split_long"): TileConfig(
        max_rows=64, max_tokens=1, tile_n=64, num_warps=8, num_stages=2
    ),
}

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
