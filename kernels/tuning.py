"""The Triton kernel's tile sizes, warps and pipeline stages, chosen by measured tuning.

A launch's shape is looked up by (precision, padded head dim, query class):

    precision        "half" (fp16 / bf16: tensor-core dots), "half_fp8" (the same with an fp8
                     cache), "half_latent" (the same with V read from K's tiles: MLA's latent cache,
                     kernels.tiling.latent_kv; each falls back to "half"'s key it lacks) or "fp32"
                     (IEEE fp32 dots)
    head_dim_padded  the head dim rounded up to a power of two (at least 16)
    query class      "decode" (one query per sequence), "decode_split" (a decode with too
                     few programs to fill the GPU, whose KV is split), "decode_split_long" (such a
                     split whose pieces cover more than 1024 keys), "verify" (2-8:
                     speculative verification), "prefill" (more)

and gives a :class:`TileConfig`. Keys not in :data:`TUNED` take :func:`default_config`,
the rule the kernel used before any tuning. ``scripts/tune_tiles.py`` measures candidate
configs on the GPU at hand and prints the table to paste into :data:`TUNED` (how to
re-tune on a new GPU: README, "Tuning the kernel").

TILE_N moves the order of the online softmax (tlsim follows it through
``kernels.tiling.tiling_for``); BLOCK_M, warps and stages change only speed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class TileConfig:
    """max_rows: the cap on BLOCK_M (rows = query tokens x the group's query heads, for
    groups under 16 heads; a group of 16 or more takes one token a tile); max_tokens: the
    query tokens a tile packs at most; tile_n: KV positions a loop step loads; num_warps
    (0: 4, or 8 past 64 x 128 tile elements) and num_stages: Triton launch settings."""

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
    """The untuned rule: up to 16 tokens in tiles of at most 64 rows for tensor cores (16 for
    fp32, whose 64-row tiles spill registers: 46 ms against 3.7 ms at head dim 128,
    gpu_results/2026-11-29-h200-tile-probe), 64 keys a step (32 past head dim 128), warps
    by tile size, 3 stages (Triton's own default on CUDA)."""
    max_rows = 16 if precision == "fp32" else 64
    tile_n = 64 if head_dim_padded <= 128 else 32
    return TileConfig(max_rows, 16, tile_n, 0, 3)


# Measured entries; every other key takes default_config. Measured on one H200 (torch 2.11,
# Triton 3.6, bf16, shuffled blocks of 16) with `python scripts/tune_tiles.py --class C`,
# the time of the chosen config against the default on the cases of cases/gpu_peers.toml it reached
# (the runs: gpu_results/2026-11-30-h200-*):
TUNED: dict[tuple[str, int, str], TileConfig] = {
    # decode_32x4k (block 16/32/64), 64q8kv: 0.93x; hd64: 0.80x (decode_32x4k_hd64). A decode whose
    # KV is split has its own key: 128-key tiles halve the splits a short context allows, and cost
    # 8q1kv 35.6 -> 42.2 us, 4x16k 83 -> 91, 1x128k 144 -> 156 (gpu_results/2026-11-30-h200-tuned-vs-peers).
    # Its winner (`tune_tiles.py --class decode_split`, six candidates,
    # gpu_results/2026-11-30-h200-variants-split-tiles/tune_split.json): 32-key tiles, 0.88x the default
    # (64-key tiles) over 8q1kv 36.2 -> 35.0 us, 4x16k 103.8 -> 87.7, 1x128k 188.7 -> 158.3.
    ("half", 128, "decode"): TileConfig(max_rows=16, max_tokens=1, tile_n=128, num_warps=4, num_stages=3),
    ("half", 128, "decode_split"): TileConfig(max_rows=16, max_tokens=1, tile_n=32, num_warps=4, num_stages=3),
    # Splits of more than 1024 keys: 128-key tiles. The split decode cases of the GPU suites, 32-key
    # against 128-key tiles side by side (gpu_results/2026-12-01-h200-split-tiles): 8 x 32k (4096-key
    # splits) 296.2 -> 282.7 us, 70B TP8 (64 ragged sequences up to 16k, 1 KV head; 2016) 90.1 -> 62.6,
    # 4 x 128k (8192) 571.9 -> 539.5, 8 x 128k at 1 KV head (2048) 153.4 -> 153.5, 1 x 128k (2048)
    # 153.4 -> 155.7. Shorter splits keep 32: 128-key tiles cost 32 x 4k at 8q1kv (256) 34.7 -> 42.2
    # and 4 x 16k (1024) 88.4 -> 90.2.
    ("half", 128, "decode_split_long"): TileConfig(max_rows=16, max_tokens=1, tile_n=128, num_warps=4, num_stages=3),
    # An fp8 cache's decode: per key the loop does more than bf16's (the fp8 -> fp16 conversions), so it
    # takes longer tiles, or a deeper pipeline where the KV is split. Unsplit: 256-key tiles, 3 stages;
    # bf16 q, e4m3 cache, against 128-key tiles: 32 x 16k 345 -> 300 us, 64 x 8k 377 -> 305, the 64
    # lognormal lengths of llama3_8b_decode_fp8 660 -> 565 (bf16 twin 510 / 513 / 865). Split: 128-key
    # tiles, 5 stages (two K / V buffers in shared memory; 3 and 4 stages give one): 8 x 32k 202 -> 174
    # (twin 297). At 32 keys (the bf16 split winner) 8 x 32k took 444 us with the earlier fp8 path.
    # (gpu_results/2026-12-01-h200-fp8-round2, probe 2; gpu_results/2026-12-01-h200-fp8-decode.)
    ("half_fp8", 128, "decode"): TileConfig(max_rows=16, max_tokens=1, tile_n=256, num_warps=4, num_stages=3),
    ("half_fp8", 128, "decode_split"): TileConfig(max_rows=16, max_tokens=1, tile_n=128, num_warps=4, num_stages=5),
    # The fp8 split of more than 1024 keys takes the fp8 split's config (8 x 32k, timed above, has 4096-key splits).
    ("half_fp8", 128, "decode_split_long"): TileConfig(
        max_rows=16, max_tokens=1, tile_n=128, num_warps=4, num_stages=5
    ),
    # decode_32x4k_hd64: 256-key tiles, 2 stages, 86.6 us against 90.9 with 128-key tiles, 3 stages (0.95x;
    # SDPA 76.1; gpu_results/2026-11-30-h200-prefill-probe, the table-check change in both).
    ("half", 64, "decode"): TileConfig(max_rows=16, max_tokens=1, tile_n=256, num_warps=4, num_stages=2),
    # gemma2_9b_hd256_decode (16 q / 8 KV heads, 32 sequences of 500-4000): 64-key tiles, 4 stages, 189.6 us
    # against 232.0 with the default 32-key tiles, 3 stages (0.82x; the best of 13 configs,
    # gpu_results/2026-12-01-h200-split-tiles/check). Measured on that one case only.
    ("half", 256, "decode"): TileConfig(max_rows=16, max_tokens=1, tile_n=64, num_warps=4, num_stages=4),
    # spec_verify_32x4k, q_len 4 and 8 and its third point: 0.83x (geometric mean). Re-measured after the
    # table check left the tile loop (gpu_results/2026-11-30-h200-prefill-probe): 3 stages, q_len 2 / 4 / 8
    # 143.1 / 143.0 / 152.0 us against 144.1 / 144.2 / 155.7 with 2 (q_len 8 was 191.5 before the change).
    ("half", 128, "verify"): TileConfig(max_rows=64, max_tokens=8, tile_n=128, num_warps=4, num_stages=3),
    # prefill_4x4k 0.86x (1726 us against 1999), prefill_1x8k 0.87x (best there: tile_n 128, 3 stages). With the
    # table check out of the tile loop and the multiply-add exp2 (the same probe): 128-key tiles, 2 stages,
    # 0.94x the 64-key config before the change over the five prefill cases of cases/gpu_peers.toml
    # (4x4k 1727 -> 1596 us, 1x8k 1656 -> 1527, 16x1k 608 -> 627, 8x2k 970 -> 948, chunked 931 -> 788).
    # FlashAttention-3's intra-warpgroup overlap (tile j's p @ v issued after tile j + 1's QK^T, beside the softmax; the
    # kernel of commit ad69fb0) measured against this entry (gpu_results/2026-12-02-h200-prefill-pipeline): 0.80-1.00x
    # the plain loop at equal tiles, but at 128 keys it spills 296 bytes a thread (sm_90, Triton 3.6), and with 64-key
    # tiles it lost to this entry: 4x4k 1655 us against 1597, 1x8k 1581 against 1528 (16x1k 593 against 626).
    ("half", 128, "prefill"): TileConfig(max_rows=128, max_tokens=32, tile_n=128, num_warps=8, num_stages=2),
    # MLA's latent cache (kernels.tiling.latent_kv: 64 heads a program, V whole and taken from the K tile), 64-key
    # tiles, 8 warps, 2 stages (216 KB of shared memory; the separate V of the same tiles does not fit). DeepSeek-V3
    # decode, 128 heads, bf16: 32-key tiles took 32 x 8k 940.9 -> 519.4 us against the wide tiling over two tensors,
    # 128 x 2k 948.5 -> 481.1, 64 x 4k 907.7 -> 517.4; 64-key tiles 417 / 354 us there
    # (gpu_results/2026-12-02-h200-mla-latent), and on deepseek_v3_mla_decode_latent, with the trimmed tile loop,
    # 304.4 -> 219.3 us against 32-key tiles (gpu_results/2026-12-02-h200-tile-loop).
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
