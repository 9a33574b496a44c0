"""The tiling shared by the Triton kernel and tlsim (both call :func:`tiling_for`, so the model cannot drift
from the kernel): tile sizes, the KV split, the heads a program takes and the pieces of a wide head."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .contract import PagedCall, fail
from .tuning import query_class, tile_config

SINGLE_DOT_HEAD_DIM = 256  # above it, K is loaded as two pieces and the heads of a group are tiled
# The wide tiling (:func:`_wide`): a program holds up to WIDE_HEADS heads and V_PART_DIM of V's dims (FlashMLA's
# split). None: the 16-head tiling always.
WIDE_HEADS: int | None = 64
V_PART_DIM = 256
# MLA's latent cache (one cache of 576 columns, V its first 512; :func:`latent_kv`): half the bytes and shared
# memory. False: two tensors always.
LATENT_KV = True


def window_tile_start(first_q_pos, sliding_window: int, tile_n: int):
    """First KV position (a multiple of TILE_N) whose tile a row at ``first_q_pos`` or later can see: the query at
    p sees keys p - W + 1 .. p, so ``max(p0 - W + 1, 0)`` rounded down to a tile. Ints or integer tensors."""
    lowest = first_q_pos - sliding_window + 1
    lowest = lowest.clamp(min=0) if isinstance(lowest, torch.Tensor) else max(lowest, 0)
    return lowest // tile_n * tile_n


@dataclass(frozen=True)
class Tiling:
    """How the kernel cuts the work: one program owns one (query tile, KV head, KV split).

    A query tile is BLOCK_Q tokens of one sequence times the group's query heads: BLOCK_M rows, row r = token
    r // group_size, head r % group_size, so a KV tile is loaded once for the whole group. KV is walked TILE_N
    key positions at a time, independent of block_size.

    The query tiles are numbered without reading query_start_loc on the host: sequence s owns tiles
    first_tile(s) .. first_tile(s + 1) - 1, first_tile(s) = (query_start_loc[s] + s * (BLOCK_Q - 1)) // BLOCK_Q,
    and NUM_Q_TILES = (num_tokens + num_seqs * (BLOCK_Q - 1)) // BLOCK_Q: exactly num_seqs for decode. Example:
    BLOCK_Q 4, q_lens [5, 0, 3]: first_tile = [0, 2, 3], NUM_Q_TILES 4; sequence 1 owns no tile.

    When too few programs would fill the GPU, each sequence's KV range is cut into NUM_SPLITS pieces of
    SPLIT_SIZE positions (a multiple of TILE_N; the last takes the rest), combined in a second pass. Under the
    device split (:func:`device_splits`) each sequence takes its own number of splits, decided on the device
    from the lengths, so a ragged batch's longest sequences are cut instead of running alone at the end.
    """

    BLOCK_M: int
    BLOCK_Q: int
    TILE_N: int
    NUM_Q_TILES: int = 1  # grid axis 0
    NUM_SPLITS: int = 1
    SPLIT_SIZE: int = 0  # 0 when NUM_SPLITS == 1 or under the device split
    NUM_WARPS: int = 4  # launch settings (no effect on numerics)
    NUM_STAGES: int = 3
    TUNING_KEY: tuple[str, int, str] = ("half", 0, "")  # the kernels.tuning key the config came from
    # An fp8 cache under fp16 / bf16 q in a decode launch: the dots run in fp16 (bf16 q scaled into
    # fp16, p rounded to fp16; kernels.triton_paged._q_to_fp16, V_PAIRS). Other launches keep q's dtype.
    FP8_DOTS_FP16: bool = False
    # The device split's (piece_mul, piece_div, piece_min, piece_mean) (:func:`device_splits`), or None.
    DEVICE_SPLIT: tuple[int, int, int, int] | None = None


# Programs the split aims for: two waves of an H100/H200's 132 SMs. A constant, not the device's SM count, so
# that tlsim makes the same split (and so the same numerics) anywhere.
TARGET_PROGRAMS = 264
MIN_TILES_PER_SPLIT = 8
MAX_SPLITS = 64
# A split decode whose splits cover more than this many keys looks up "decode_split_long".
LONG_SPLIT_KEYS = 1024
# The device split (device_splits; measurements: docs/performance.md, "fp8 KV caches"): at most
# DEVICE_SPLIT_MAX_SEQS sequences (every program reads them all), no window. DEVICE_SPLIT_SLACK is a ratio of ints
# (the rule runs in integers, the same on the device and in tlsim). Past LONGEST_FIRST_MAX_SEQS the programs keep
# the grid's order (each one sorts the lengths, and the sort's code grows with the lanes).
LONGEST_FIRST_MAX_SEQS = 128
DEVICE_SPLIT = True
DEVICE_SPLIT_MAX_SEQS = 1024
DEVICE_SPLIT_MAX_SPLITS = 4  # the grid's splits a (sequence, KV head), a power of two (the combine's arange)
# The floor: lower, short uniform batches would enter the split and pay for its idle programs.
DEVICE_SPLIT_MIN_KEYS = 4096  # no sequence is cut into pieces of fewer keys than this target
DEVICE_SPLIT_SLACK = (5, 4)
# A piece is also at least DEVICE_SPLIT_MEAN_FACTOR times the batch's mean length, so only a sequence past twice
# the mean is cut and a uniform batch never is (the slack alone cuts a uniform batch of 132-211 programs in two).
DEVICE_SPLIT_MEAN_FACTOR = 2


def choose_tiling(head_dim: int, group_size: int, max_q_len: int, num_seqs: int = 1, num_kv_heads: int = 1,
                  max_seq_len: int = 0, fp32: bool = False, num_tokens: int | None = None, kv_fp8: bool = False,
                  latent: bool = False, windowed: bool = False) -> Tiling:  # fmt: skip
    """Tile sizes, query-tile count and KV split for :func:`tiling_for`'s host-known sizes: ``max_q_len`` sets the
    tile height, ``max_seq_len`` (an upper bound of the KV lengths; 0: no split) the split. ``num_tokens``
    defaults to num_seqs * max_q_len; ``windowed`` keeps a decode out of the device split.
    """
    if group_size > 128:
        fail(f"group_size (num_q_heads // num_kv_heads) {group_size} is above the kernel's limit of 128")
    max_q_len = max(max_q_len, 1)
    num_tokens = num_seqs * max_q_len if num_tokens is None else num_tokens
    head_dim_padded = max(16, next_pow2(head_dim))
    precision = "fp32" if fp32 else ("half_fp8" if kv_fp8 else ("half_latent" if latent else "half"))
    q_class = query_class(max_q_len)
    config = tile_config(precision, head_dim_padded, q_class)
    if group_size >= 16:  # one token's heads already fill tl.dot's minimum M of 16
        block_m = next_pow2(group_size)
    else:  # decode pads the group up to 16 rows; prefill packs up to max_tokens tokens
        tokens = min(max_q_len, config.max_tokens)
        block_m = min(config.max_rows, max(16, next_pow2(group_size * tokens)))
    block_q = block_m // group_size
    num_q_tiles = (num_tokens + num_seqs * (block_q - 1)) // block_q
    programs = max(num_kv_heads * num_q_tiles, 1)
    if q_class == "decode" and programs < TARGET_PROGRAMS // 2 and max_seq_len > 0:
        # A decode that will split its KV has its own key (one token a program: the tile height
        # does not depend on it): kernels.tuning, "decode_split".
        q_class = "decode_split"
        config = tile_config(precision, head_dim_padded, q_class)
    tile_n = config.tile_n
    num_splits = 1
    device_split = None
    if programs < TARGET_PROGRAMS // 2:
        by_work = next_pow2(cdiv(TARGET_PROGRAMS, programs))
        by_length = max_seq_len // (MIN_TILES_PER_SPLIT * tile_n)
        while num_splits * 2 <= min(by_work, by_length, MAX_SPLITS):
            num_splits *= 2
    elif (
        q_class == "decode"
        and DEVICE_SPLIT
        and not windowed
        and num_seqs <= DEVICE_SPLIT_MAX_SEQS
        and num_tokens <= num_seqs  # a decode by its shapes, not only by its max_q_len hint
        and max_seq_len > DEVICE_SPLIT_MIN_KEYS
    ):
        # The device split: a piece (device_splits) of at least C * len_i * num_kv_heads / TARGET_PROGRAMS keys
        # and DEVICE_SPLIT_MIN_KEYS bounds every sequence's count; NUM_SPLITS is the power of two at or above it.
        slack_num, slack_den = DEVICE_SPLIT_SLACK
        piece_mul, piece_div = num_kv_heads * slack_num, TARGET_PROGRAMS * slack_den
        most = min(cdiv(piece_div, piece_mul), cdiv(max_seq_len, DEVICE_SPLIT_MIN_KEYS))
        num_splits = min(next_pow2(most), DEVICE_SPLIT_MAX_SPLITS)
        if num_splits > 1:
            device_split = (piece_mul, piece_div, DEVICE_SPLIT_MIN_KEYS, DEVICE_SPLIT_MEAN_FACTOR)
    # Each split covers ceil(max_seq_len / num_splits) positions, rounded up to whole tiles. Splits of
    # more than LONG_SPLIT_KEYS take their own key (kernels.tuning, "decode_split_long"): the number
    # of splits stays, each split's range is cut in that key's tiles.
    keys_a_split = cdiv(max_seq_len, num_splits)
    if q_class == "decode_split" and cdiv(keys_a_split, tile_n) * tile_n > LONG_SPLIT_KEYS:
        q_class = "decode_split_long"
        config = tile_config(precision, head_dim_padded, q_class)
        tile_n = config.tile_n
    split_size = cdiv(keys_a_split, tile_n) * tile_n if num_splits > 1 and device_split is None else 0
    return Tiling(
        BLOCK_M=block_m, BLOCK_Q=block_q, TILE_N=tile_n, NUM_Q_TILES=num_q_tiles, NUM_SPLITS=num_splits,
        SPLIT_SIZE=split_size,
        NUM_WARPS=config.num_warps or (4 if block_m * head_dim_padded <= 64 * 128 else 8),
        NUM_STAGES=config.num_stages, TUNING_KEY=(precision, head_dim_padded, q_class),
        FP8_DOTS_FP16=kv_fp8 and not fp32 and query_class(max_q_len) == "decode",  # every decode key
        DEVICE_SPLIT=device_split,
    )  # fmt: skip


def tiling_for(call: PagedCall, max_q_len: int | None = None, max_seq_len: int | None = None) -> Tiling:
    """The tiling of one call from host-known sizes only (no tensor value): what the launcher runs and tlsim models.

    The query length picks only the tile height: the max_q_len hint, else 1 without query_start_loc, else the
    mean q_len. The KV bound that sets the split: the max_seq_len hint, else the table's capacity, and under a
    window W at most W + the longest q_len (the keys a program walks). A wrong hint costs speed, never
    correctness: the last KV split runs to the end of the sequence.
    """
    if call.given_query_start_loc is None:
        q_len = 1
    elif max_q_len is not None:
        q_len = min(int(max_q_len), call.num_tokens)
    else:
        q_len = cdiv(call.num_tokens, max(call.num_seqs, 1))
    kv_bound = call.table_capacity if max_seq_len is None else min(int(max_seq_len), call.table_capacity)
    if call.sliding_window is not None:  # a program walks at most W + its queries' span keys
        longest_q = 1 if call.given_query_start_loc is None else int(max_q_len or call.num_tokens)
        kv_bound = min(kv_bound, call.sliding_window + min(longest_q, call.num_tokens))
    # Past SINGLE_DOT_HEAD_DIM a program holds heads_per_program heads of its group, on 16-row tiles (the fp32
    # rule: a [64, 512] fp32 accumulator would spill), unless the wide tiling cuts the accumulator by V_PART_DIM.
    heads = heads_per_program(call)
    large = max(call.head_dim, call.head_dim_v) > SINGLE_DOT_HEAD_DIM and not _wide(call)
    return choose_tiling(
        call.head_dim, heads, q_len, call.num_seqs, call.num_kv_heads * cdiv(call.group_size, heads) * v_parts(call),
        kv_bound, fp32=call.q.dtype == torch.float32 or large, num_tokens=call.num_tokens, kv_fp8=call.kv_fp8,
        latent=latent_kv(call), windowed=call.sliding_window is not None,
    )  # fmt: skip


def device_splits(seq_lens: torch.Tensor, num_splits: int, tile_n: int, piece_mul: int, piece_div: int,
                  piece_min: int, piece_mean: int) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The device split's rule (Tiling.DEVICE_SPLIT): each sequence's splits and the keys a split covers.

    seq_lens [num_seqs] (any integer dtype) -> (splits [num_seqs] int64 in [1, num_splits], split_size
    [num_seqs] int64, a multiple of tile_n). A piece is at least C times a program slot's even share of the
    batch's keys (piece_mul / piece_div = C * num_kv_heads / TARGET_PROGRAMS), piece_min, and piece_mean times
    the mean length; a sequence takes one split a piece, the last split running to its end, and its splits past
    that run no program. The kernel's ``_device_piece`` and ``_device_splits`` are this, line for line, in int64.
    """
    lens = seq_lens.long().clamp(min=0)
    total = lens.sum()
    piece = ((total * piece_mul + piece_div - 1) // piece_div).clamp(min=piece_min)
    piece = piece.clamp(min=(total * piece_mean + len(lens) - 1) // len(lens))
    splits = ((lens + piece - 1) // piece).clamp(1, num_splits)
    keys = (lens + splits - 1) // splits
    split_size = (keys + tile_n - 1) // tile_n * tile_n
    return splits, split_size


def heads_per_program(call: PagedCall) -> int:
    """Query heads of a KV head's group that one program holds (grid axis 1: num_kv_heads * ceil(group_size /
    heads) * :func:`v_parts`): the whole group, except past SINGLE_DOT_HEAD_DIM with a group past 16, where a
    program holds 16 (MLA's 128 heads over one KV head: [16, 512] fp32 accumulators, not one [128, 512] that no
    register file holds), or up to WIDE_HEADS under the wide tiling (:func:`_wide`)."""
    if _wide(call):
        return min(call.group_size, WIDE_HEADS)
    if max(call.head_dim, call.head_dim_v) > SINGLE_DOT_HEAD_DIM and call.group_size > 16:
        return 16
    return call.group_size


def v_parts(call: PagedCall) -> int:
    """Programs that share one head tile's rows, each V_PART_DIM of V's padded dims (grid axis 1's fastest
    part): next_pow2(head_dim_v) // V_PART_DIM under the wide tiling, else 1 (and 1 for a latent cache, whose
    program holds V whole: :func:`latent_kv`)."""
    if not _wide(call) or latent_kv(call):
        return 1
    return max(1, max(16, next_pow2(call.head_dim_v)) // V_PART_DIM)


def latent_kv(call: PagedCall) -> bool:
    """Whether the call's V is read from its K tiles (the kernel's SHARED_KV): LATENT_KV on, the wide tiling,
    head_dim_v equal to K's first piece (MLA: 512 of 576), and v_cache a view of k_cache's first head_dim_v
    columns (:func:`is_latent_view`, metadata only: no device sync). Every V element the kernel would load is
    then the K element it loaded at the same (key, dim), so the output is that of two tensors holding those
    values (tests/kernels/test_variants_mla.py)."""
    return (
        LATENT_KV
        and _wide(call)
        and head_dim_pieces(call.head_dim)[0] == call.head_dim_v
        and is_latent_view(call.k_cache, call.v_cache)
    )


def is_latent_view(k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether v_cache is k_cache[..., :head_dim_v], from metadata alone (no device sync)."""
    return (
        v_cache.data_ptr() == k_cache.data_ptr()
        and v_cache.dtype == k_cache.dtype
        and v_cache.device == k_cache.device
        and v_cache.shape[:3] == k_cache.shape[:3]
        and v_cache.stride()[:3] == k_cache.stride()[:3]
        and v_cache.stride(-1) == k_cache.stride(-1) == 1
        and v_cache.shape[-1] <= k_cache.shape[-1]
    )


def _wide(call: PagedCall) -> bool:
    """The wide tiling: head dims past SINGLE_DOT_HEAD_DIM, fp16 / bf16 q, a half-precision cache
    (fp32 dots would spill a [64, 256] accumulator; an fp8 cache keeps its measured 16-head tiling)."""
    return (
        WIDE_HEADS is not None
        and max(call.head_dim, call.head_dim_v) > SINGLE_DOT_HEAD_DIM
        and call.q.dtype in (torch.float16, torch.bfloat16)
        and not call.kv_fp8
    )


def head_dim_pieces(head_dim: int) -> tuple[int, int]:
    """(main, tail): K's head dim as the kernel loads it, each a power of two (tail 0: none): up to
    SINGLE_DOT_HEAD_DIM one piece, past it the largest power of two below and the rest padded (576 = 512 + 64,
    300 = 256 + 64; docs/contract.md, "V's head dim (MLA)", says why)."""
    if head_dim <= SINGLE_DOT_HEAD_DIM:
        return max(16, next_pow2(head_dim)), 0
    main = 2 ** int(math.log2(head_dim))
    rest = head_dim - main
    return main, (max(16, next_pow2(rest)) if rest else 0)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (same as triton.next_power_of_2, without importing Triton)."""
    return 1 if n <= 1 else 2 ** math.ceil(math.log2(n))
