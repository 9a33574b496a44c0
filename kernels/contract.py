"""The call contract every backend keeps: argument checks, the value-check opt-in, the output and lse buffers,
and the entry decorator that documents and checks a kernel's signature.

Cheap checks (shapes, dtypes, devices) read only metadata and always run (a launch-plan hit ran them for its key).
Value checks read tensor values, a device sync each (forbidden inside a CUDA-graph capture), so they run only
when asked: ``check=True``, or ``check=None`` with ``PAGED_ATTENTION_CHECK=1`` in the environment.
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .fp8 import FP8_DTYPES

# The dtypes every kernel takes, by the names case files and report rows give them.
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
SUPPORTED_DTYPES = tuple(DTYPES.values())
MIN_HEAD_DIM, MAX_HEAD_DIM = 32, 576  # 576: MLA's K (512 latent + 64 rope); V may differ (head_dim_v)
MIN_BLOCK_SIZE, MAX_BLOCK_SIZE = 1, 256
CHECK_ENV = "PAGED_ATTENTION_CHECK"


def contiguous_strides(shape) -> tuple[int, ...]:
    """The strides of a contiguous tensor of ``shape`` (torch's rule, size-1 dims included; on the meta device)."""
    return torch.empty(shape, device="meta").stride()


def checks_enabled(check: bool | None = None) -> bool:
    """Whether a call runs its value checks: ``check`` when given, else ``$PAGED_ATTENTION_CHECK == "1"``."""
    if check is None:
        return os.environ.get(CHECK_ENV) == "1"
    return bool(check)


def fail(msg: str) -> None:
    raise ValueError(f"paged attention: {msg}")


# The keyword options' checks: (name, value, q, k_cache) -> the value the kernels get, from metadata only.


def check_int_at_least_1(name: str, value, q, k_cache) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        fail(f"{name} must be an int >= 1 or None, got {value!r}")
    return value


def positive_finite(name: str, value, or_none: str = "") -> float:
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        fail(f"{name} must be a positive finite number{or_none}, got {value}")
    return value


def check_positive_float(name: str, value, q, k_cache) -> float | None:
    return None if value is None else positive_finite(name, value, " or None")


def check_q_head_vector(name: str, value, q, k_cache) -> torch.Tensor | None:
    """None, or a [num_q_heads] float32 tensor on q's device (made contiguous)."""
    if value is None:
        return None
    num_q_heads = q.shape[1]
    if not isinstance(value, torch.Tensor) or value.shape != (num_q_heads,) or value.dtype != torch.float32:
        got = f"{value.dtype} {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
        fail(f"{name} must be a float32 tensor [num_q_heads] = [{num_q_heads}], got {got}")
    if value.device != q.device:
        fail(f"{name} must be on q's device ({q.device}), got {value.device}")
    return value.contiguous()


def check_kv_scale(name: str, value, kv_fp8: bool, num_kv_heads: int, device: torch.device) -> torch.Tensor | None:
    """k_scale / v_scale of an fp8 cache (None: 1.0) as a [num_kv_heads] fp32 tensor on q's device; None for another
    cache. No value is read (no sync): a host float becomes a device fill."""
    if not kv_fp8:
        if value is not None:
            fail(f"{name} applies to an fp8 cache (float8_e4m3fn, float8_e5m2) only; this cache is not fp8")
        return None
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        value = positive_finite(name, 1.0 if value is None else value)
        return torch.full((num_kv_heads,), value, dtype=torch.float32, device=device)
    if not isinstance(value, torch.Tensor) or value.dtype != torch.float32 or value.numel() not in (1, num_kv_heads):
        got = f"{value.dtype} {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
        fail(f"{name} must be a float or a float32 tensor of 1 or num_kv_heads = {num_kv_heads} elements, got {got}")
    if value.device != device:
        fail(f"{name} must be on q's device ({device}), got {value.device}")
    if value.shape == (num_kv_heads,) and value.is_contiguous():  # already the kernels' form: a plan hit passes it on
        return value
    return value.reshape(-1).expand(num_kv_heads).contiguous()


def check_cache_scale(name: str, value, q, k_cache) -> torch.Tensor | None:
    return check_kv_scale(name, value, k_cache.dtype in FP8_DTYPES, k_cache.shape[2], q.device)


@dataclass(frozen=True)
class OptionKind:
    """How a keyword option travels: a host option is a Python number whose value a launch plan's key holds; a
    device option is a tensor (or becomes one) whose metadata the key holds, handed to every launch."""

    name: str
    annotation: str  # its annotation in the entry's signature
    host: bool


HOST_INT = OptionKind("host int", "int | None", host=True)
HOST_FLOAT = OptionKind("host float", "float | None", host=True)
Q_HEAD_VECTOR = OptionKind("per-query-head fp32 vector", "torch.Tensor | None", host=False)
KV_SCALE = OptionKind("fp8 cache scale", "float | torch.Tensor | None", host=False)


@dataclass(frozen=True)
class CallOption:
    """One keyword option of the contract call: a row of :data:`CALL_OPTION_TABLE`."""

    name: str
    kind: OptionKind
    check: Callable[[str, Any, torch.Tensor, torch.Tensor], Any]  # (name, value, q, k_cache) -> the kernels' value
    doc: str  # its line(s) in the entry's docstring (CONTRACT_DOC)


# The keyword options that shape the attention, the one place the kernels spell them: the entry's signature and
# docstring, prepare_call's checks, PagedCall's fields, the launch-plan key and a plan hit's launch follow this
# table, in its order (harness/cases/variants.py names the same keywords; test_vocabulary_agrees.py ties them).
CALL_OPTION_TABLE: tuple[CallOption, ...] = (
    CallOption("sliding_window", HOST_INT, check_int_at_least_1,
               "host int W >= 1: a query sees its W most recent keys, itself included"),
    CallOption("logit_softcap", HOST_FLOAT, check_positive_float,
               "host float cap > 0: scaled logits z -> cap * tanh(z / cap)"),
    CallOption("sinks", Q_HEAD_VECTOR, check_q_head_vector,
               "[num_q_heads] fp32: a per-head logit in the denominator only"),
    CallOption("alibi_slopes", Q_HEAD_VECTOR, check_q_head_vector,
               "[num_q_heads] fp32: slope_h * (key_pos - query_pos) added to the logits"),
    CallOption("k_scale", KV_SCALE, check_cache_scale,
               "an fp8 cache's K scale (host float, or fp32 [1] / [num_kv_heads] on the device):\n"
               "K = k_cache.float() * k_scale"),
    CallOption("v_scale", KV_SCALE, check_cache_scale, "the same for V: V = v_cache.float() * v_scale"),
)  # fmt: skip
CALL_OPTIONS: tuple[str, ...] = tuple(option.name for option in CALL_OPTION_TABLE)
# The device options in table order: a plan's launch takes them after lse, in this order.
DEVICE_OPTIONS: tuple[str, ...] = tuple(option.name for option in CALL_OPTION_TABLE if not option.kind.host)


def _with_option_fields(cls):
    """Give the dataclass-to-be ``cls`` one field per call option, after its own, in table order (default None: off)."""
    for option in CALL_OPTION_TABLE:
        cls.__annotations__[option.name] = option.kind.annotation
        setattr(cls, option.name, None)
    return cls


@dataclass(frozen=True)
@_with_option_fields
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
    # Then a field per call option, its checked value (None: off; k_scale and v_scale [num_kv_heads] fp32).

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


def prepare_call(q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, scale=None, check=None, **options):
    """Check a call against the contract (a ValueError names the argument); fill in defaults; return the
    :class:`PagedCall`, its index tensors made contiguous. ``options``: the keyword options by name (another name
    is a TypeError). The value checks run only when :func:`checks_enabled` (``check``) says so.
    """
    if q.dim() != 3:
        fail(f"q must be [num_tokens, num_q_heads, head_dim], got shape {tuple(q.shape)}")
    if k_cache.dim() != 4 or v_cache.dim() != 4 or k_cache.shape[:3] != v_cache.shape[:3]:
        fail("k_cache must be [num_blocks, block_size, num_kv_heads, head_dim] and v_cache "
             f"[num_blocks, block_size, num_kv_heads, head_dim_v], got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")  # fmt: skip
    num_tokens, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, kv_head_dim = k_cache.shape
    if kv_head_dim != head_dim:
        fail(f"head_dim of q ({head_dim}) and of the caches ({kv_head_dim}) differ")
    if num_q_heads % num_kv_heads:
        fail(f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if q.dtype not in SUPPORTED_DTYPES or k_cache.dtype not in (q.dtype, *FP8_DTYPES) or v_cache.dtype != k_cache.dtype:
        fail("q, k_cache, v_cache must share one of fp32/fp16/bf16 (or k_cache and v_cache both one fp8 "
             f"dtype: float8_e4m3fn, float8_e5m2), got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")  # fmt: skip
    if block_table.dim() != 2 or seq_lens.dim() != 1 or block_table.shape[0] != seq_lens.shape[0]:
        fail("block_table must be [num_seqs, max_blocks_per_seq] and seq_lens [num_seqs], "
             f"got {tuple(block_table.shape)} and {tuple(seq_lens.shape)}")  # fmt: skip
    if block_table.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        fail(f"block_table and seq_lens must be int32, got {block_table.dtype} and {seq_lens.dtype}")
    num_seqs = seq_lens.shape[0]
    devices = {t.device for t in (q, k_cache, v_cache, block_table, seq_lens)}
    if query_start_loc is None:
        if num_tokens != num_seqs:
            fail(f"query_start_loc=None means one query per sequence, but q has {num_tokens} rows "
                 f"for {num_seqs} sequences")  # fmt: skip
    else:
        devices.add(query_start_loc.device)
        if query_start_loc.shape != (num_seqs + 1,) or query_start_loc.dtype != torch.int32:
            fail(f"query_start_loc must be int32 [num_seqs + 1] = [{num_seqs + 1}], "
                 f"got {query_start_loc.dtype} {tuple(query_start_loc.shape)}")  # fmt: skip
        query_start_loc = query_start_loc.contiguous()
    if len(devices) != 1:
        fail(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    scale = positive_finite("scale", head_dim**-0.5 if scale is None else scale)
    if unknown := sorted(set(options) - set(CALL_OPTIONS)):
        raise TypeError(f"paged attention got unexpected keyword argument(s) {unknown}; options: {CALL_OPTIONS}")
    checked_options = {o.name: o.check(o.name, options.get(o.name), q, k_cache) for o in CALL_OPTION_TABLE}
    call = PagedCall(
        q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table.contiguous(), seq_lens=seq_lens.contiguous(),
        given_query_start_loc=query_start_loc, scale=scale, num_seqs=num_seqs, num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size, head_dim_v=v_cache.shape[3],
        **checked_options,
    )  # fmt: skip
    if checks_enabled(check):
        check_values(call)
    return call


def check_values(call: PagedCall) -> None:
    """The value checks (each reads device values: a sync on a GPU). Raises ValueError naming the argument."""
    if call.given_query_start_loc is not None:
        starts = call.given_query_start_loc
        if int(starts[0]) != 0:
            fail(f"query_start_loc[0] must be 0, got {int(starts[0])}")
        if int(starts[-1]) != call.num_tokens:
            fail(f"query_start_loc[-1] ({int(starts[-1])}) must equal num_tokens ({call.num_tokens})")
    q_lens, seq_lens = call.q_lens, call.seq_lens.long()
    if bool((q_lens < 0).any()):
        fail("query_start_loc must be non-decreasing (every sequence needs 0 <= q_len <= seq_len)")
    if bool((seq_lens < 0).any()):
        fail("seq_lens must be >= 0")
    if bool((q_lens > seq_lens).any()):
        fail("every sequence needs 0 <= q_len <= seq_len (query_start_loc against seq_lens)")
    if call.num_seqs and int(seq_lens.max()) > call.table_capacity:
        fail(f"a seq_len exceeds max_blocks_per_seq * block_size = {call.table_capacity} "
             "(seq_lens against block_table)")  # fmt: skip
    used = (
        torch.arange(call.block_table.shape[1], device=seq_lens.device)[None, :]
        < ((seq_lens + call.block_size - 1) // call.block_size)[:, None]  # blocks each sequence uses
    )
    bad = used & ((call.block_table < 0) | (call.block_table >= call.num_blocks))
    if bool(bad.any()):
        seq, index = (int(i) for i in bad.nonzero()[0])
        fail(f"block_table[{seq}, {index}] = {int(call.block_table[seq, index])} is outside [0, num_blocks = "
             f"{call.num_blocks}), and sequence {seq} uses it (seq_len {int(seq_lens[seq])})")  # fmt: skip


def prepare_lse(call: PagedCall, return_lse: bool) -> torch.Tensor | None:
    """[num_tokens, num_q_heads] fp32 for the lse (docs/contract.md) when ``return_lse`` (a bool), else None."""
    if not isinstance(return_lse, bool):
        fail(f"return_lse must be True or False, got {return_lse!r}")
    if not return_lse:
        return None
    return torch.empty((call.num_tokens, call.num_q_heads), dtype=torch.float32, device=call.q.device)


def prepare_out(call: PagedCall, out: torch.Tensor | None) -> torch.Tensor:
    """Return ``out`` after checking it is [num_tokens, num_q_heads, head_dim_v] in q's dtype, or a fresh one."""
    shape = (*call.q.shape[:2], call.head_dim_v)
    if out is None:
        return call.q.new_empty(shape)
    if out.shape != shape or out.dtype != call.q.dtype or out.device != call.q.device:
        fail(f"out must be {shape} in q's dtype ({call.q.dtype}), got {tuple(out.shape)}, {out.dtype}")
    return out


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
    return_lse      also return lse [num_tokens, num_q_heads] fp32, ln of each row's softmax
                    denominator, the sink included
""" + "".join(f"    {o.name:<15} " + o.doc.replace("\n", "\n" + " " * 20) + "\n" for o in CALL_OPTION_TABLE)


def contract_entry(impl=None, *, plans=None):
    """Turn ``impl(call, out, lse, max_q_len, max_seq_len)`` into a function with the contract's signature, the one
    place its arguments are spelled: it checks the call, allocates or checks ``out`` and the lse buffer, lets
    ``impl`` fill them, and returns ``out`` or ``(out, lse)``, with impl's name and docstring (then
    :data:`CONTRACT_DOC`) and each call option a keyword-only parameter of its signature.

    ``plans`` (a :class:`kernels.launch_plan.PlanCache`) lets a repeated call skip that host work: ``impl`` then
    returns a plan whose ``launch(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, out, lse,
    *device options)`` redoes the call, filed in a recipe that a later call with the same key runs. The value
    checks still run on every call that asks for them.
    """
    if impl is None:
        return lambda fn: contract_entry(fn, plans=plans)

    def entry(q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, scale=None, out=None, *,
              max_q_len: int | None = None, max_seq_len: int | None = None, check: bool | None = None,
              return_lse: bool = False, **options):  # fmt: skip
        key = None
        if plans is not None:
            key = plans.key(
                q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, out, max_q_len, max_seq_len,
                return_lse, options,
            )  # fmt: skip
            if key is not None and (recipe := plans.get(key)) is not None:
                # checks_enabled(check), inline: value checks read the device, and are never skipped
                if check if check is not None else os.environ.get(CHECK_ENV) == "1":
                    prepare_call(
                        q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, check=True, **options
                    )
                return recipe.run(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, out, options)
        call = prepare_call(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, check=check, **options)
        out_given = out is not None
        out = prepare_out(call, out)
        lse = prepare_lse(call, return_lse)
        plan = impl(call, out, lse, max_q_len=max_q_len, max_seq_len=max_seq_len)
        if key is not None and plan is not None:
            plans.put(key, plans.recipe(call, out_given, lse, (block_table, seq_lens, query_start_loc), options, plan))
        return out if lse is None else (out, lse)

    entry.__name__, entry.__qualname__, entry.__module__ = impl.__name__, impl.__qualname__, impl.__module__
    entry.__doc__ = (impl.__doc__ or "").rstrip() + "\n" + CONTRACT_DOC
    signature = inspect.signature(entry)
    fixed = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    options = [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=o.kind.annotation)
               for o in CALL_OPTION_TABLE]  # fmt: skip
    entry.__signature__ = signature.replace(parameters=[*fixed, *options])
    return entry
