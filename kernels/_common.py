"""Argument checks, the value-check opt-in, and the tiling shared by the Triton kernel and
its torch model.

Both ``paged_attention_triton`` and ``paged_attention_tlsim`` call :func:`prepare_call`
and :func:`tiling_for`, so the model can never drift from the kernel's tile sizes, its
KV split or its view of the inputs. (The Triton entry keeps what they decided in a launch
plan, kernels/launch_plan.py, and a repeated call with the same key reuses it; the plan's
tiling is tiling_for's, tests/test_launch_plans.py.)

Two kinds of checks. Cheap ones (shapes, dtypes, devices) read only metadata and always
run (on a launch-plan hit they ran for that key already: the key holds all they read). Value checks read tensor values (q_len <= seq_len, query_start_loc well formed,
lengths within the table, block ids within the pool): on a GPU each is a device-to-host
sync (hundreds of microseconds, and forbidden inside a CUDA-graph capture), so they run
only when asked: ``check=True``, or ``check=None`` with ``PAGED_ATTENTION_CHECK=1`` in the
environment. The test suite turns them on (tests/conftest.py).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from .tuning import query_class, tile_config

# The dtypes every kernel takes, by the names case files and report rows give them.
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
SUPPORTED_DTYPES = tuple(DTYPES.values())
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)  # KV caches only; q stays fp32/fp16/bf16
MIN_HEAD_DIM, MAX_HEAD_DIM = 32, 576  # 576: MLA's K (512 latent + 64 rope); V may differ (head_dim_v)
SINGLE_DOT_HEAD_DIM = 256  # above it, K is loaded as two pieces and the heads of a group are tiled
MIN_BLOCK_SIZE, MAX_BLOCK_SIZE = 1, 256
CHECK_ENV = "PAGED_ATTENTION_CHECK"
# The keyword options prepare_call checks into a PagedCall (return_lse and the hints are the entry's).
CALL_OPTIONS = ("sliding_window", "logit_softcap", "sinks", "alibi_slopes", "k_scale", "v_scale")


def getenv(name: str) -> str | None:
    """``os.environ.get(name)``, read straight from the mapping's own dict where it is CPython's ``os._Environ``.

    The same answer at any moment (``os.environ[...] = ...``, ``del`` and pytest's monkeypatch
    all write that dict), for ~0.05 us instead of ~1 us (``Mapping.get``, then encoding the
    name and decoding the value in Python): a plan hit reads the environment twice.
    """
    env = os.environ
    try:
        raw = env._data.get(_ENV_KEYS[name])
    except (AttributeError, KeyError):  # another mapping in os.environ, or a name not encoded yet
        if type(env) is not os._Environ:
            return env.get(name)
        _ENV_KEYS[name] = env.encodekey(name)
        return env.get(name)
    return None if raw is None else env.decodevalue(raw)


_ENV_KEYS: dict[str, object] = {}  # name -> os.environ.encodekey(name)


def contiguous_strides(shape) -> tuple[int, ...]:
    """The strides of a contiguous tensor of ``shape`` (torch's rule, size-1 dims included; on the meta device)."""
    return torch.empty(shape, device="meta").stride()


def checks_enabled(check: bool | None = None) -> bool:
    """Whether a call runs its value checks: ``check`` when given, else ``$PAGED_ATTENTION_CHECK == "1"``."""
    if check is None:
        return getenv(CHECK_ENV) == "1"
    return bool(check)


@dataclass(frozen=True)
class PagedCall:
    """A validated paged-attention call, with the derived sizes every backend needs.

    q               [num_tokens, num_q_heads, head_dim]
    k_cache         [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache         [num_blocks, block_size, num_kv_heads, head_dim_v] (head_dim_v may differ: MLA)
    block_table     [num_seqs, max_blocks_per_seq] int32, contiguous
    seq_lens        [num_seqs] int32, contiguous
    given_query_start_loc [num_seqs + 1] int32, contiguous, or None: one query per sequence
    """

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    given_query_start_loc: torch.Tensor | None
    scale: float
    num_seqs: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    head_dim_v: int = 0  # V's head dim (the output's); 0 given means head_dim
    # The attention variants (docs/contract.md, "Attention variants"); None: off.
    sliding_window: int | None = None
    logit_softcap: float | None = None
    sinks: torch.Tensor | None = None  # [num_q_heads] fp32, contiguous
    alibi_slopes: torch.Tensor | None = None  # [num_q_heads] fp32, contiguous
    # An fp8 cache's dequantization scales, [num_kv_heads] fp32 (a per-tensor scale repeated); None: not fp8.
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None

    @property
    def kv_fp8(self) -> bool:
        """Whether the pools are fp8: K = k_cache.float() * k_scale[kv_head] (and V likewise)."""
        return self.k_scale is not None

    @property
    def num_tokens(self) -> int:
        return self.q.shape[0]

    @property
    def num_blocks(self) -> int:
        return self.k_cache.shape[0]

    @property
    def group_size(self) -> int:
        """Query heads that share one KV head (1 = MHA, num_q_heads = MQA)."""
        return self.num_q_heads // self.num_kv_heads

    @property
    def query_start_loc(self) -> torch.Tensor:
        """[num_seqs + 1] int32: the given offsets, or arange(num_seqs + 1) for one query per sequence."""
        if self.given_query_start_loc is not None:
            return self.given_query_start_loc
        return torch.arange(self.num_seqs + 1, dtype=torch.int32, device=self.q.device)

    @property
    def q_lens(self) -> torch.Tensor:
        """[num_seqs] int64: queries of each sequence."""
        starts = self.query_start_loc
        return (starts[1:] - starts[:-1]).long()

    @property
    def table_capacity(self) -> int:
        """max_blocks_per_seq * block_size: the longest sequence the table can describe (host-known)."""
        return self.block_table.shape[1] * self.block_size


def _fail(msg: str) -> None:
    raise ValueError(f"paged attention: {msg}")


def prepare_call(q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, scale=None, check=None, **options):
    """Check a call against the contract; fill in defaults; return the :class:`PagedCall`.

    Reads no tensor value unless checking (``check``: bool or None, see :func:`checks_enabled`).
    ``options`` are the contract's keyword options that shape the call, by name (CALL_OPTIONS:
    sliding_window, logit_softcap, sinks, alibi_slopes, k_scale, v_scale; see
    :func:`contract_entry` for their meaning); another name is a TypeError.

    Raises ValueError naming the offending argument. Shapes, dtypes and devices are always
    checked, and the index tensors (block_table, seq_lens, query_start_loc) are made
    contiguous. Values are checked when :func:`checks_enabled` says so (see the module
    docstring): see :func:`check_values` for the list.
    """
    if q.dim() != 3:
        _fail(f"q must be [num_tokens, num_q_heads, head_dim], got shape {tuple(q.shape)}")
    if k_cache.dim() != 4 or v_cache.dim() != 4 or k_cache.shape[:3] != v_cache.shape[:3]:
        _fail(
            "k_cache must be [num_blocks, block_size, num_kv_heads, head_dim] and v_cache "
            f"[num_blocks, block_size, num_kv_heads, head_dim_v], got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    num_tokens, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, kv_head_dim = k_cache.shape
    if kv_head_dim != head_dim:
        _fail(f"head_dim of q ({head_dim}) and of the caches ({kv_head_dim}) differ")
    if num_q_heads % num_kv_heads:
        _fail(f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    kv_fp8 = k_cache.dtype in FP8_DTYPES
    if q.dtype not in SUPPORTED_DTYPES or k_cache.dtype not in (q.dtype, *FP8_DTYPES) or v_cache.dtype != k_cache.dtype:
        _fail(
            "q, k_cache, v_cache must share one of fp32/fp16/bf16 (or k_cache and v_cache both one fp8 "
            f"dtype: float8_e4m3fn, float8_e5m2), got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}"
        )
    if block_table.dim() != 2 or seq_lens.dim() != 1 or block_table.shape[0] != seq_lens.shape[0]:
        _fail(
            "block_table must be [num_seqs, max_blocks_per_seq] and seq_lens [num_seqs], "
            f"got {tuple(block_table.shape)} and {tuple(seq_lens.shape)}"
        )
    if block_table.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        _fail(f"block_table and seq_lens must be int32, got {block_table.dtype} and {seq_lens.dtype}")
    num_seqs = seq_lens.shape[0]
    devices = {t.device for t in (q, k_cache, v_cache, block_table, seq_lens)}
    if query_start_loc is None:
        if num_tokens != num_seqs:
            _fail(
                f"query_start_loc=None means one query per sequence, but q has {num_tokens} rows for {num_seqs} sequences"
            )
    else:
        devices.add(query_start_loc.device)
        if query_start_loc.shape != (num_seqs + 1,) or query_start_loc.dtype != torch.int32:
            _fail(
                f"query_start_loc must be int32 [num_seqs + 1] = [{num_seqs + 1}], got {query_start_loc.dtype} {tuple(query_start_loc.shape)}"
            )
        query_start_loc = query_start_loc.contiguous()
    if len(devices) != 1:
        _fail(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    scale = float(head_dim**-0.5 if scale is None else scale)
    if not (scale > 0 and math.isfinite(scale)):
        _fail(f"scale must be a positive finite number, got {scale}")
    if unknown := sorted(set(options) - set(CALL_OPTIONS)):
        raise TypeError(f"paged attention got unexpected keyword argument(s) {unknown}; options: {CALL_OPTIONS}")
    sliding_window, logit_softcap = _check_scalar_options(options.get("sliding_window"), options.get("logit_softcap"))
    sinks = _check_head_vector("sinks", options.get("sinks"), num_q_heads, q.device)
    alibi_slopes = _check_head_vector("alibi_slopes", options.get("alibi_slopes"), num_q_heads, q.device)
    k_scale = check_kv_scale("k_scale", options.get("k_scale"), kv_fp8, num_kv_heads, q.device)
    v_scale = check_kv_scale("v_scale", options.get("v_scale"), kv_fp8, num_kv_heads, q.device)
    call = PagedCall(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        block_table=block_table.contiguous(),
        seq_lens=seq_lens.contiguous(),
        given_query_start_loc=query_start_loc,
        scale=scale,
        num_seqs=num_seqs,
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        head_dim_v=v_cache.shape[3],
        sliding_window=sliding_window,
        logit_softcap=logit_softcap,
        sinks=sinks,
        alibi_slopes=alibi_slopes,
        k_scale=k_scale,
        v_scale=v_scale,
    )
    if checks_enabled(check):
        check_values(call)
    return call


def _check_scalar_options(sliding_window, logit_softcap) -> tuple[int | None, float | None]:
    """sliding_window: a host int >= 1 (or None); logit_softcap: a positive finite float (or None)."""
    if sliding_window is not None and (
        isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 1
    ):
        _fail(
            f"sliding_window must be an int >= 1 (keys a query sees, itself included) or None, got {sliding_window!r}"
        )
    if logit_softcap is not None:
        logit_softcap = float(logit_softcap)
        if not (logit_softcap > 0 and math.isfinite(logit_softcap)):
            _fail(f"logit_softcap must be a positive finite number or None, got {logit_softcap}")
    return sliding_window, logit_softcap


def _check_head_vector(name: str, value, num_q_heads: int, device: torch.device) -> torch.Tensor | None:
    """sinks / alibi_slopes: None, or a [num_q_heads] float32 tensor on q's device (made contiguous)."""
    if value is None:
        return None
    if not isinstance(value, torch.Tensor) or value.shape != (num_q_heads,) or value.dtype != torch.float32:
        got = f"{value.dtype} {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
        _fail(f"{name} must be a float32 tensor [num_q_heads] = [{num_q_heads}], got {got}")
    if value.device != device:
        _fail(f"{name} must be on q's device ({device}), got {value.device}")
    return value.contiguous()


def check_kv_scale(name: str, value, kv_fp8: bool, num_kv_heads: int, device: torch.device) -> torch.Tensor | None:
    """k_scale / v_scale of an fp8 cache as a [num_kv_heads] fp32 tensor on q's device; None for another cache.

    Accepted: None (1.0), a positive finite host float (per tensor), or an fp32 tensor of
    1 or num_kv_heads elements (per tensor, or per KV head). A device tensor is used as it
    is (no value is read: no sync); a host float becomes a device fill, also sync-free.
    """
    if not kv_fp8:
        if value is not None:
            _fail(f"{name} applies to an fp8 cache (float8_e4m3fn, float8_e5m2) only; this cache is not fp8")
        return None
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        value = 1.0 if value is None else float(value)
        if not (value > 0 and math.isfinite(value)):
            _fail(f"{name} must be a positive finite number, got {value}")
        return torch.full((num_kv_heads,), value, dtype=torch.float32, device=device)
    if not isinstance(value, torch.Tensor) or value.dtype != torch.float32 or value.numel() not in (1, num_kv_heads):
        got = f"{value.dtype} {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
        _fail(f"{name} must be a float or a float32 tensor of 1 or num_kv_heads = {num_kv_heads} elements, got {got}")
    if value.device != device:
        _fail(f"{name} must be on q's device ({device}), got {value.device}")
    return value.reshape(-1).expand(num_kv_heads).contiguous()


def quantize_kv(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What an fp8 cache stores for x [..., num_kv_heads, head_dim]: x / scale, saturated, in ``dtype``.

    scale [num_kv_heads] fp32. The kernels read it back as ``stored.float() * scale`` (vLLM's
    convention). Saturating at the format's largest finite value (448 for e4m3fn, 57344 for
    e5m2) keeps an outlier finite; NaN stays NaN (the poisoned slots).
    """
    limit = torch.finfo(dtype).max
    return (x.float() / scale[:, None]).clamp(-limit, limit).to(dtype)


def dequantize_kv(stored: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """stored [..., num_kv_heads, head_dim] dequantized: ``stored.float() * scale`` in ``dtype`` (the
    reference passes fp32: exact); unchanged when scale is None (not fp8). The Triton kernel and
    tlsim do not round this per element: they widen the fp8 values and scale outside the dots."""
    if scale is None:
        return stored
    return (stored.float() * scale[:, None]).to(dtype)


def window_tile_start(first_q_pos, sliding_window: int | None, tile_n: int):
    """First KV position (a multiple of TILE_N) whose tile a row at ``first_q_pos`` or later can see.

    With a window of W the query at position p sees keys p - W + 1 .. p, so a program whose
    rows start at position p0 needs no tile before ``max(p0 - W + 1, 0)``, rounded down to a
    tile boundary: the tile loop starts there and decode costs W keys, not seq_len. Works on
    ints and on integer tensors (tlsim); the kernel spells the same arithmetic in Triton.
    Example: TILE_N 64, W 100, decode at position 1000: the loop starts at 896 (901 // 64 * 64),
    walking 2 tiles instead of 16.
    """
    if sliding_window is None:
        return first_q_pos * 0
    lowest = first_q_pos - sliding_window + 1
    lowest = lowest.clamp(min=0) if isinstance(lowest, torch.Tensor) else max(lowest, 0)
    return lowest // tile_n * tile_n


def check_values(call: PagedCall) -> None:
    """The value checks (each reads device values: a sync on a GPU). Raises ValueError naming the argument.

    query_start_loc[0] == 0, non-decreasing, query_start_loc[-1] == num_tokens; 0 <= seq_len
    <= max_blocks_per_seq * block_size; q_len <= seq_len; and every block id a sequence uses
    (the first ceil(seq_len / block_size) entries of its row) within [0, num_blocks).
    """
    if call.given_query_start_loc is not None:
        starts = call.given_query_start_loc
        if int(starts[0]) != 0:
            _fail(f"query_start_loc[0] must be 0, got {int(starts[0])}")
        if int(starts[-1]) != call.num_tokens:
            _fail(f"query_start_loc[-1] ({int(starts[-1])}) must equal num_tokens ({call.num_tokens})")
    q_lens, seq_lens = call.q_lens, call.seq_lens.long()
    if bool((q_lens < 0).any()):
        _fail("query_start_loc must be non-decreasing (every sequence needs 0 <= q_len <= seq_len)")
    if bool((seq_lens < 0).any()):
        _fail("seq_lens must be >= 0")
    if bool((q_lens > seq_lens).any()):
        _fail("every sequence needs 0 <= q_len <= seq_len (query_start_loc against seq_lens)")
    if call.num_seqs and int(seq_lens.max()) > call.table_capacity:
        _fail(
            f"a seq_len exceeds max_blocks_per_seq * block_size = {call.table_capacity} (seq_lens against block_table)"
        )
    used = (
        torch.arange(call.block_table.shape[1], device=seq_lens.device)[None, :]
        < cdiv_tensor(seq_lens, call.block_size)[:, None]
    )
    bad = used & ((call.block_table < 0) | (call.block_table >= call.num_blocks))
    if bool(bad.any()):
        seq, index = (int(i) for i in bad.nonzero()[0])
        _fail(
            f"block_table[{seq}, {index}] = {int(call.block_table[seq, index])} is outside [0, num_blocks = "
            f"{call.num_blocks}), and sequence {seq} uses it (seq_len {int(seq_lens[seq])})"
        )


def cdiv_tensor(a: torch.Tensor, b: int) -> torch.Tensor:
    """Elementwise ceil(a / b) for a non-negative integer tensor."""
    return (a + b - 1) // b


def prepare_lse(call: PagedCall, return_lse: bool) -> torch.Tensor | None:
    """[num_tokens, num_q_heads] fp32 for the log-sum-exp when ``return_lse`` (a bool), else None.

    lse[t, h] = ln(S + sum_{j visible} exp(l_j)): the natural log of the softmax's
    denominator, the sink's term S included (docs/contract.md, "The log-sum-exp").
    """
    if not isinstance(return_lse, bool):
        _fail(f"return_lse must be True or False, got {return_lse!r}")
    if not return_lse:
        return None
    return torch.empty((call.num_tokens, call.num_q_heads), dtype=torch.float32, device=call.q.device)


def with_lse(out: torch.Tensor, lse: torch.Tensor | None):
    """What a call returns: ``out``, or ``(out, lse)`` when the log-sum-exp was asked for."""
    return out if lse is None else (out, lse)


def prepare_out(call: PagedCall, out: torch.Tensor | None) -> torch.Tensor:
    """Return ``out`` after checking it is [num_tokens, num_q_heads, head_dim_v] in q's dtype, or a fresh one."""
    shape = (*call.q.shape[:2], call.head_dim_v)
    if out is None:
        return call.q.new_empty(shape)
    if out.shape != shape or out.dtype != call.q.dtype or out.device != call.q.device:
        _fail(f"out must be {shape} in q's dtype ({call.q.dtype}), got {tuple(out.shape)}, {out.dtype}")
    return out


@dataclass(frozen=True)
class Tiling:
    """How the kernel cuts the work.

    One program owns one (query tile, KV head, KV split). A query tile is BLOCK_Q query
    tokens of one sequence times the group's query heads: BLOCK_M rows, row r = token
    r // group_size, head r % group_size, so a KV tile is loaded once and used by every
    query head of its group. KV is walked in TILE_N key positions at a time, independent
    of block_size, with an online softmax across tiles.

    The query tiles are numbered without reading query_start_loc on the host. Sequence s
    owns tiles first_tile(s) .. first_tile(s + 1) - 1, with

        first_tile(s) = (query_start_loc[s] + s * (BLOCK_Q - 1)) // BLOCK_Q,

    at least ceil(q_len_s / BLOCK_Q) of them, and NUM_Q_TILES = first_tile(num_seqs) =
    (num_tokens + num_seqs * (BLOCK_Q - 1)) // BLOCK_Q in all: exactly num_seqs for
    decode (one query each), and within num_seqs of num_tokens / BLOCK_Q for prefill.
    A program finds its sequence by a binary search over query_start_loc (vLLM's
    unified-attention kernel does the same with first_tile(s) = query_start_loc[s] //
    BLOCK_Q + s, which over-launches decode by num_seqs / BLOCK_Q programs).
    Example: BLOCK_Q 4, q_lens [5, 0, 3] (query_start_loc [0, 5, 5, 8]): first_tile =
    [0, 2, 3], NUM_Q_TILES = (8 + 3 * 3) // 4 = 4; sequence 0 owns tiles 0-1, sequence 1
    none, sequence 2 tile 3.

    When there are too few programs to fill the GPU (long contexts, few sequences, one
    KV head per GPU), each sequence's KV range is cut into NUM_SPLITS pieces of
    SPLIT_SIZE positions (a multiple of TILE_N, so tile boundaries do not move; the last
    piece takes whatever is left); each piece keeps its own (max, sum, accumulator) and a
    second pass combines them.

    Example: GQA 32/8 heads (group 4), BLOCK_M 16 gives BLOCK_Q = 4 tokens a program;
    decode of 4 sequences of 131072 tokens is 4 * 8 = 32 programs, so the range is cut
    in 16 splits of 8192 positions (512 programs).
    """

    BLOCK_M: int
    BLOCK_Q: int
    TILE_N: int
    HEAD_DIM_PADDED: int
    NUM_Q_TILES: int = 1  # grid axis 0
    NUM_SPLITS: int = 1
    SPLIT_SIZE: int = 0  # 0 when NUM_SPLITS == 1
    NUM_WARPS: int = 4  # launch settings (no effect on numerics)
    NUM_STAGES: int = 3
    TUNING_KEY: tuple[str, int, str] = ("half", 0, "")  # the kernels.tuning key the config came from


# Programs the split aims for: two waves of an H100/H200's 132 SMs. A constant, not the
# device's SM count, so that tlsim makes the same split (and so the same numerics) anywhere.
TARGET_PROGRAMS = 264
MIN_TILES_PER_SPLIT = 8
MAX_SPLITS = 64


def choose_tiling(
    head_dim: int,
    group_size: int,
    max_q_len: int,
    num_seqs: int = 1,
    num_kv_heads: int = 1,
    max_seq_len: int = 0,
    fp32: bool = False,
    num_tokens: int | None = None,
    kv_fp8: bool = False,
) -> Tiling:
    """Tile sizes, query-tile count and KV split; the kernel launcher and tlsim both use exactly these.

    ``max_q_len`` (a typical query length: it sets the tile height) and ``max_seq_len``
    (an upper bound of the KV lengths: it sets the split) are host-known, derived from
    shapes and hints by :func:`tiling_for`. ``max_seq_len`` 0 means no split. ``num_tokens`` defaults to num_seqs * max_q_len. ``fp32`` inputs keep BLOCK_M
    at 16: their dots run in IEEE fp32 on CUDA cores, and a 64-row tile spills registers
    (measured on an H200, gpu_results/2026-11-29-h200-tile-probe: prefill at head_dim 128
    took 46 ms with BLOCK_M 64 and 3.7 ms with 16). Half-precision tiles keep 64 rows for
    tensor cores.
    """
    if group_size > 128:
        _fail(f"group_size (num_q_heads // num_kv_heads) {group_size} is above the kernel's limit of 128")
    max_q_len = max(max_q_len, 1)
    num_tokens = num_seqs * max_q_len if num_tokens is None else num_tokens
    head_dim_padded = max(16, next_pow2(head_dim))
    precision, q_class = "fp32" if fp32 else ("half_fp8" if kv_fp8 else "half"), query_class(max_q_len)
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
    if programs < TARGET_PROGRAMS // 2:
        by_work = next_pow2(cdiv(TARGET_PROGRAMS, programs))
        by_length = max_seq_len // (MIN_TILES_PER_SPLIT * tile_n)
        while num_splits * 2 <= min(by_work, by_length, MAX_SPLITS):
            num_splits *= 2
    # Each split covers ceil(max_seq_len / num_splits) positions, rounded up to whole tiles.
    split_size = cdiv(cdiv(max_seq_len, num_splits), tile_n) * tile_n if num_splits > 1 else 0
    return Tiling(
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        TILE_N=tile_n,
        HEAD_DIM_PADDED=head_dim_padded,
        NUM_Q_TILES=num_q_tiles,
        NUM_SPLITS=num_splits,
        SPLIT_SIZE=split_size,
        NUM_WARPS=config.num_warps or (4 if block_m * head_dim_padded <= 64 * 128 else 8),
        NUM_STAGES=config.num_stages,
        TUNING_KEY=(precision, head_dim_padded, q_class),
    )


def tiling_for(call: PagedCall, max_q_len: int | None = None, max_seq_len: int | None = None) -> Tiling:
    """The tiling of one call, from host-known sizes only: what the launcher runs and tlsim models.

    Nothing here reads a tensor value. The query length only picks the tile height (the
    grid covers every token whatever it is): the max_q_len hint when given, else 1 when
    query_start_loc is None, else the mean q_len ceil(num_tokens / num_seqs), so a decode
    batch given as offsets gets decode tiles and 16 prefills of 1024 get prefill tiles.
    max_seq_len, an upper bound that sets the KV split, is the hint when given, else the
    table's capacity max_blocks_per_seq * block_size; with a sliding window W it is at most
    W + the longest q_len (max_q_len, else 1 for decode, else num_tokens): the keys a
    program walks, since the kernel cuts its splits from the window's first tile. So a
    windowed decode at 128k splits like a decode of W keys. A wrong hint costs speed, never
    correctness: the last KV split runs to the end of the sequence whatever max_seq_len said.
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
    # Past SINGLE_DOT_HEAD_DIM a program holds heads_per_program heads of its group: to the
    # tiling, num_kv_heads * head_tiles groups of that size. Such dims also take the 16-row
    # tiles (choose_tiling's fp32 rule): a [64, 512] fp32 accumulator would spill registers.
    heads = heads_per_program(call)
    large = max(call.head_dim, call.head_dim_v) > SINGLE_DOT_HEAD_DIM
    return choose_tiling(
        call.head_dim,
        heads,
        q_len,
        call.num_seqs,
        call.num_kv_heads * cdiv(call.group_size, heads),
        kv_bound,
        fp32=call.q.dtype == torch.float32 or large,
        num_tokens=call.num_tokens,
        kv_fp8=call.kv_fp8,
    )


def heads_per_program(call: PagedCall) -> int:
    """Query heads of a KV head's group that one program holds: the whole group, except when
    head_dim or head_dim_v passes SINGLE_DOT_HEAD_DIM and the group passes 16, where a program
    holds 16 (MLA's 128 heads over one KV head: 8 programs a token, each a [16, 512] fp32
    accumulator instead of one [128, 512] that no register file holds). The kernel's grid
    axis 1 is then num_kv_heads * ceil(group_size / 16)."""
    if max(call.head_dim, call.head_dim_v) > SINGLE_DOT_HEAD_DIM and call.group_size > 16:
        return 16
    return call.group_size


def head_dim_pieces(head_dim: int) -> tuple[int, int]:
    """(main, tail): K's head dim as the kernel loads it, each a power of two (tail 0: none).

    Up to SINGLE_DOT_HEAD_DIM one piece, next_pow2(head_dim) (at least 16). Past it, the
    largest power of two below, then the rest padded: 576 (MLA) = 512 + 64 in two dots
    instead of one padded to 1024 (which would double the loads and the shared memory);
    300 = 256 + 64 (44 used).
    """
    if head_dim <= SINGLE_DOT_HEAD_DIM:
        return max(16, next_pow2(head_dim)), 0
    main = 2 ** int(math.log2(head_dim))
    rest = head_dim - main
    return main, (max(16, next_pow2(rest)) if rest else 0)


CONTRACT_DOC = """
    The contract (docs/contract.md); every tensor on one device:

    q               [num_tokens, num_q_heads, head_dim], fp32/fp16/bf16
    k_cache         [num_blocks, block_size, num_kv_heads, head_dim], q's dtype or fp8
    v_cache         [num_blocks, block_size, num_kv_heads, head_dim_v] (head_dim_v = head_dim but for MLA)
    block_table     [num_seqs, max_blocks_per_seq] int32; entries past a sequence's end ignored
    seq_lens        [num_seqs] int32, KV length of each sequence including its new tokens
    query_start_loc [num_seqs + 1] int32 or None (one query per sequence)
    scale           softmax scale (> 0), default head_dim ** -0.5
    out             optional [num_tokens, num_q_heads, head_dim_v] buffer in q's dtype, written and returned
    returns         [num_tokens, num_q_heads, head_dim_v] in q's dtype; (out, lse) with return_lse

    max_q_len       host int hint, an upper bound of every q_len (tile height; never the result)
    max_seq_len     host int hint, an upper bound of every seq_len (the KV split; never the result)
    check           run the value checks (device syncs); None: $PAGED_ATTENTION_CHECK == "1"
    sliding_window  host int W >= 1: a query sees its W most recent keys, itself included
    logit_softcap   host float cap > 0: scaled logits z -> cap * tanh(z / cap)
    sinks           [num_q_heads] fp32: a per-head logit in the denominator only
    alibi_slopes    [num_q_heads] fp32: slope_h * (key_pos - query_pos) added to the logits
    return_lse      also return lse [num_tokens, num_q_heads] fp32, ln of each row's softmax
                    denominator, the sink included
    k_scale/v_scale an fp8 cache's scales (host float, or fp32 [1] / [num_kv_heads] on the device):
                    K = k_cache.float() * k_scale
"""


def contract_entry(impl=None, *, plans=None):
    """Turn ``impl(call, out, lse, max_q_len, max_seq_len)`` into a function with the contract's signature.

    The one place the contract's arguments are spelled: the returned function checks the call
    (:func:`prepare_call`), allocates or checks ``out`` and the lse buffer, lets ``impl`` fill
    them, and returns ``out`` or ``(out, lse)``. It keeps impl's name and module, and its
    docstring followed by :data:`CONTRACT_DOC`; ``inspect.signature`` and ``help()`` show the
    real signature below (no ``__wrapped__``: impl's own parameters are an implementation detail).

    ``plans`` (a :class:`kernels.launch_plan.PlanCache`; used as ``@contract_entry(plans=...)``)
    lets a repeated call skip that host work: ``impl`` then returns a plan, an object whose
    ``launch(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, out, lse, sinks,
    alibi_slopes, k_scale, v_scale)`` redoes the call from checked tensors; the cache files it
    in a recipe (``plans.recipe``) that prepares those tensors from the raw arguments, and a
    later call with the same key (kernels/launch_plan.py says what it holds) goes straight to
    ``recipe.run``. The value checks still run on every call that asks for them.
    """
    if impl is None:
        return lambda fn: contract_entry(fn, plans=plans)

    def entry(
        q,
        k_cache,
        v_cache,
        block_table,
        seq_lens,
        query_start_loc=None,
        scale=None,
        out=None,
        *,
        max_q_len: int | None = None,
        max_seq_len: int | None = None,
        check: bool | None = None,
        sliding_window: int | None = None,
        logit_softcap: float | None = None,
        sinks: torch.Tensor | None = None,
        alibi_slopes: torch.Tensor | None = None,
        return_lse: bool = False,
        k_scale: float | torch.Tensor | None = None,
        v_scale: float | torch.Tensor | None = None,
    ):
        key = None
        if plans is not None:
            key = plans.key(
                q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, out, max_q_len, max_seq_len,
                sliding_window, logit_softcap, sinks, alibi_slopes, return_lse, k_scale, v_scale,
            )  # fmt: skip
            if key is not None and (recipe := plans.get(key)) is not None:
                # checks_enabled(check), inline: value checks read the device, and are never skipped
                if check if check is not None else getenv(CHECK_ENV) == "1":
                    prepare_call(
                        q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, check=True,
                        sliding_window=sliding_window, logit_softcap=logit_softcap, sinks=sinks,
                        alibi_slopes=alibi_slopes, k_scale=k_scale, v_scale=v_scale,
                    )  # fmt: skip
                return recipe.run(
                    q, k_cache, v_cache, block_table, seq_lens, query_start_loc, out, sinks, alibi_slopes, k_scale,
                    v_scale,
                )  # fmt: skip
        call = prepare_call(
            q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, check=check,
            sliding_window=sliding_window, logit_softcap=logit_softcap, sinks=sinks, alibi_slopes=alibi_slopes,
            k_scale=k_scale, v_scale=v_scale,
        )  # fmt: skip
        out_given = out is not None
        out = prepare_out(call, out)
        lse = prepare_lse(call, return_lse)
        plan = impl(call, out, lse, max_q_len=max_q_len, max_seq_len=max_seq_len)
        if key is not None and plan is not None:
            raw_index, raw_vectors = (block_table, seq_lens, query_start_loc), (sinks, alibi_slopes)
            plans.put(key, plans.recipe(call, out_given, lse, raw_index, raw_vectors, plan))
        return with_lse(out, lse)

    entry.__name__, entry.__qualname__, entry.__module__ = impl.__name__, impl.__qualname__, impl.__module__
    entry.__doc__ = (impl.__doc__ or "").rstrip() + "\n" + CONTRACT_DOC
    return entry


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for non-negative ints."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (same as triton.next_power_of_2, without importing Triton)."""
    return 1 if n <= 1 else 2 ** math.ceil(math.log2(n))
