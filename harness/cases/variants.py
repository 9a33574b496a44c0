"""The attention variants: one row per option, declaring it once for the case file (:data:`VariantFields`),
the backend registry, the inputs, the kernel call and the oracle; docs/contract.md says what each computes."""

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, create_model

from harness.cases.vocab import INT32_MAX, Bool, Float, Int, KVDTypeName
from kernels.contract import CALL_OPTION_TABLE, MAX_HEAD_DIM, MIN_HEAD_DIM
from kernels.fp8 import quantize_kv


@dataclass(frozen=True)
class OracleHook:
    """How the float64 oracle applies a variant: a function per stage it acts at (None: not there), given the
    variant's keywords (not None); tensors float64. Per sequence and chunk of ``rows`` query rows, in order:

    kv      (k, v, **keywords) -> (k, v): keys [seq_len, num_kv_heads, head_dim], values [.., head_dim_v]
    score   (logits, distance, **keywords) -> logits [num_kv_heads, group, rows, seq_len] (scaled);
            distance [rows, seq_len] is key_pos - query_pos; in the table's order (cap before bias)
    mask    (distance, **keywords) -> [rows, seq_len] bool: keys hidden besides the future ones
    sink    (logits, **keywords) -> [num_kv_heads, group, 1, 1]: a logit in each softmax's denominator only"""

    kv: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None
    score: Callable[..., torch.Tensor] | None = None
    mask: Callable[..., torch.Tensor] | None = None
    sink: Callable[..., torch.Tensor] | None = None


@dataclass(frozen=True)
class Variant:
    key: str  # what a backend declares (``Backend.variants``), a case turns on and a skip row names
    fields: dict[str, tuple[Any, Any]]  # the case file's field(s) that turn it on: name -> (type, pydantic Field)
    keywords: tuple[str, ...]  # the contract call's keyword(s); () for a shape (head_dim_v)
    turned_on: Callable[[Any], bool]  # the case's fields (a Case, or make_inputs' arguments) -> on
    example: dict[str, Any]  # fields that turn it on in a small case (tests/kernels/test_attention_variants.py)
    # (PagedInputs on the CPU, fields) -> the same with the variant's keywords in ``options`` (fp8: and its
    # pools); None: a shape that make_inputs draws
    inputs: Callable[[Any, Any], Any] | None
    oracle: OracleHook  # empty: the oracle's output already shows it (the lse, a shape)
    meaning: str

    @property
    def name(self) -> str:
        """Its first case-file field (``alibi``, ``kv_dtype``): what a plan step's facts list (CaseFacts.variants)."""
        return next(iter(self.fields))

    @property
    def names(self) -> tuple[str, ...]:
        """Every name ``register_backend(variants=...)`` takes for it: case fields, key, keywords."""
        return tuple(dict.fromkeys((*self.fields, self.key, *self.keywords)))


def with_options(inputs: Any, **options: Any) -> Any:
    """``inputs`` (a PagedInputs) with ``options`` added to the call's keywords."""
    return replace(inputs, options={**inputs.options, **options})


def per_q_head(vector: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """[num_kv_heads, group, 1, 1] float64: a [num_q_heads] vector laid out as the oracle's logits
    [num_kv_heads, group, rows, seq_len] (query head h = kv_head * group + g)."""
    return vector.detach().to(logits.device, torch.float64).view(*logits.shape[:2], 1, 1)


class SinkGenerator(BaseModel):
    """Seeded per-head sinks: ``mean + scale * N(0, 1)``, one per query head (from the case's seed)."""

    model_config = ConfigDict(extra="forbid")
    scale: Float = Field(ge=0, le=1e4)
    mean: Float = Field(default=0.0, ge=-1e4, le=1e4)


def sinks_inputs(inputs: Any, fields: Any) -> Any:
    """The case's sinks as the call's ``sinks`` [num_q_heads] fp32; ValueError unless one per query head."""
    if len(fields.sinks) != fields.num_q_heads:
        raise ValueError(f"sinks has {len(fields.sinks)} values for {fields.num_q_heads} query heads")
    return with_options(inputs, sinks=torch.tensor(list(fields.sinks), dtype=torch.float32))


def standard_alibi_slopes(num_heads: int) -> list[float]:
    """ALiBi's slopes as BLOOM, MPT and vLLM compute them: 2^(-8 i / n), i = 1..n, for n a power of two;
    otherwise the first n' (largest power of two below) and every other slope of 2n' heads."""
    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = [2.0 ** (-8.0 * (i + 1) / closest) for i in range(closest)]
    slopes += [2.0 ** (-4.0 * (2 * i + 1) / closest) for i in range(num_heads - closest)]
    return slopes


KVScaleMode = Literal["amax", "amax_per_head"]


def fp8_scales(slots: torch.Tensor, mode: float | str | None, fp8: torch.dtype) -> torch.Tensor:
    """[num_kv_heads] fp32 scales of a pool [num_slots, num_kv_heads, head_dim] for an fp8 cache: a float for
    every head; "amax" (None too): max |x| / the format's largest finite value per tensor; "amax_per_head": per head."""
    num_kv_heads = slots.shape[1]
    if isinstance(mode, float):
        return torch.full((num_kv_heads,), mode, dtype=torch.float32)
    amax = slots.float().abs().nan_to_num(0.0).amax(dim=(0, 2))  # [num_kv_heads]
    if mode in (None, "amax"):
        amax = amax.amax().expand(num_kv_heads)
    return (amax.clamp_min(1e-12) / torch.finfo(fp8).max).to(torch.float32).contiguous()


def fp8_inputs(inputs: Any, fields: Any) -> Any:
    """The pools quantized to ``kv_dtype`` by :func:`fp8_scales` (NaN stays NaN), their scales as
    k_scale / v_scale, and the unquantized pools kept (the run reports what the cache itself costs)."""
    fp8 = getattr(torch, fields.kv_dtype)
    k, v = inputs.k_cache.flatten(0, 1), inputs.v_cache.flatten(0, 1)  # [num_slots, num_kv_heads, head_dim(_v)]
    k_scale, v_scale = fp8_scales(k, fields.kv_scale, fp8), fp8_scales(v, fields.kv_scale, fp8)
    return replace(with_options(inputs, k_scale=k_scale, v_scale=v_scale),
                   k_cache=quantize_kv(k, k_scale, fp8).view(inputs.k_cache.shape),
                   v_cache=quantize_kv(v, v_scale, fp8).view(inputs.v_cache.shape),
                   unquantized=(inputs.k_cache, inputs.v_cache))  # fmt: skip


def per_kv_head(scale: float | torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """[num_kv_heads, 1] float64 on x's device: an fp8 cache's scale (float, [1] or [num_kv_heads];
    None: 1) for x [seq_len, num_kv_heads, head_dim]."""
    if not isinstance(scale, torch.Tensor):
        scale = torch.tensor([1.0 if scale is None else float(scale)])
    return scale.detach().to(x.device, torch.float64).reshape(-1).expand(x.shape[1])[:, None]


VARIANTS: tuple[Variant, ...] = (
    Variant(
        "sliding_window",
        fields={"sliding_window": (Int | None, Field(default=None, ge=1, le=INT32_MAX,
                                                     description="a query sees its W most recent keys"))},
        keywords=("sliding_window",), turned_on=lambda c: c.sliding_window is not None,
        example={"sliding_window": 2},
        inputs=lambda inputs, c: with_options(inputs, sliding_window=int(c.sliding_window)),
        oracle=OracleHook(mask=lambda distance, sliding_window: distance <= -sliding_window),
        meaning="each query sees only its last W keys",
    ),
    Variant(
        "logit_softcap",
        fields={"logit_softcap": (Float | None, Field(default=None, gt=0, le=1e6,
                                                      description="scaled logits z -> cap * tanh(z / cap)"))},
        keywords=("logit_softcap",), turned_on=lambda c: c.logit_softcap is not None,
        example={"logit_softcap": 1.0},
        inputs=lambda inputs, c: with_options(inputs, logit_softcap=float(c.logit_softcap)),
        oracle=OracleHook(score=lambda logits, distance, logit_softcap:
                          logit_softcap * torch.tanh(logits / logit_softcap)),
        meaning="logits pass through cap * tanh(logit / cap)",
    ),
    Variant(
        "sinks",
        fields={"sinks": (list[Float] | SinkGenerator | None, Field(
            default=None, description="one sink logit per query head, or { scale, mean } drawn from the seed"))},
        keywords=("sinks",), turned_on=lambda c: c.sinks is not None,
        example={"sinks": [3.0, -1.0, 0.5, 2.0]}, inputs=sinks_inputs,
        oracle=OracleHook(sink=lambda logits, sinks: per_q_head(sinks, logits)),
        meaning="a per-head logit that joins every softmax's denominator",
    ),
    Variant(
        "alibi_slopes",
        fields={"alibi": (Bool, Field(default=False, description="ALiBi with the standard slopes 2^(-8i/n)"))},
        keywords=("alibi_slopes",), turned_on=lambda c: c.alibi,
        example={"alibi": True},
        inputs=lambda inputs, c: with_options(inputs, alibi_slopes=torch.tensor(
            standard_alibi_slopes(c.num_q_heads), dtype=torch.float32)),
        oracle=OracleHook(score=lambda logits, distance, alibi_slopes:
                          logits + per_q_head(alibi_slopes, logits) * distance.to(torch.float64)),
        meaning="slope_h * (key_pos - query_pos) added to each logit",
    ),
    Variant(
        "return_lse",
        fields={"return_lse": (Bool, Field(default=False, description=(
                    "the call also returns the log-sum-exp, graded against the oracle's"))),
                "cascade": (Bool, Field(default=False, description=(
                    "shared_prefix layout: the kernels run it as prefix + suffix merged by lse")))},
        keywords=("return_lse",), turned_on=lambda c: c.return_lse or c.cascade,
        example={"return_lse": True}, inputs=lambda inputs, c: with_options(inputs, return_lse=True),
        oracle=OracleHook(),  # the oracle returns its lse beside the output when asked (its own return_lse)
        meaning="the log-sum-exp returned beside the output",
    ),
    Variant(
        "fp8_kv",
        fields={"kv_dtype": (KVDTypeName | None, Field(
                    default=None, description="an fp8 KV cache (q keeps dtype); K = k_cache.float() * k_scale")),
                "kv_scale": (Annotated[Float, Field(gt=0, le=1e6)] | KVScaleMode | None, Field(default=None, description=(
                    "fp8 scales: a float for K and V, 'amax' (per tensor, amax / fp8 max; the default) or 'amax_per_head'")))},
        keywords=("k_scale", "v_scale"), turned_on=lambda c: c.kv_dtype is not None,
        example={"kv_dtype": "float8_e4m3fn"}, inputs=fp8_inputs,
        oracle=OracleHook(kv=lambda k, v, k_scale=None, v_scale=None:
                          (k * per_kv_head(k_scale, k), v * per_kv_head(v_scale, v))),
        meaning="an fp8 KV cache with per-head scales",
    ),
    Variant(
        "head_dim_v",
        fields={"head_dim_v": (Int | None, Field(default=None, ge=MIN_HEAD_DIM, le=MAX_HEAD_DIM,
                                                 description="V's head dim when it differs from K's (MLA: 512)"))},
        keywords=(), turned_on=lambda c: c.head_dim_v != c.head_dim,
        example={"head_dim_v": 64}, inputs=None,  # a shape: make_inputs draws V with head_dim_v
        oracle=OracleHook(),  # the oracle's output takes V's head dim
        meaning="V's head size differs from K's (MLA)",
    ),
    Variant(
        "latent_kv",
        fields={"latent_kv": (Bool, Field(default=False, description=(
            "one cache for K and V, as MLA engines keep it: v_cache is a view of k_cache's first head_dim_v columns")))},
        keywords=(), turned_on=lambda c: c.latent_kv,
        example={"head_dim": 64, "head_dim_v": 32, "latent_kv": True},
        inputs=lambda inputs, c: replace(inputs, v_cache=inputs.k_cache[..., : c.head_dim_v]),
        oracle=OracleHook(),  # the oracle reads V from the view it is given
        meaning="V is the first columns of K's cache (MLA's latent cache)",
    ),
)  # fmt: skip
VARIANT_KEYS: tuple[str, ...] = tuple(v.key for v in VARIANTS)
CASE_FIELDS: tuple[str, ...] = tuple(name for v in VARIANTS for name in v.fields)
# The case model's variant fields, as the rows declare them (harness.cases.spec.CaseSpec extends it).
VariantFields: type[BaseModel] = create_model(
    "VariantFields", **{name: declared for v in VARIANTS for name, declared in v.fields.items()}
)


def turned_on(case: Any) -> frozenset[str]:
    """The variant keys a case needs of a backend."""
    return frozenset(v.key for v in VARIANTS if v.turned_on(case))


def turned_on_names(case: Any) -> tuple[str, ...]:
    """The variants a case turns on, by their one name (:attr:`Variant.name`), in the table's order."""
    return tuple(v.name for v in VARIANTS if v.turned_on(case))


# Every name a backend may declare a variant by -> its key (``alibi`` and ``alibi_slopes``; ``kv_dtype``,
# ``fp8_kv``, ``k_scale``): a case-file field, the key itself or a keyword of the call.
VARIANT_NAMES: dict[str, str] = {name: v.key for v in VARIANTS for name in v.names}


def variant_key(name: str) -> str:
    """The key of a variant named as ``register_backend(variants=...)`` may name it (:data:`VARIANT_NAMES`);
    ValueError for another name, saying the closest known one."""
    if isinstance(name, str) and name in VARIANT_NAMES:
        return VARIANT_NAMES[name]
    close = difflib.get_close_matches(str(name), list(VARIANT_NAMES), n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"unknown variant {name!r}{hint}; a variant is named by its case-file field (`harness variants` "
                     f"lists them): {', '.join(v.name for v in VARIANTS)}")  # fmt: skip


def _keywords(v: Variant) -> str:
    """A variant's kernel keywords with their kinds; KeyError for one not in kernels.contract.CALL_OPTION_TABLE."""
    kinds = {option.name: option.kind.name for option in CALL_OPTION_TABLE} | {"return_lse": "the entry's own bool"}
    return ", ".join(f"`{keyword}` ({kinds[keyword]})" for keyword in v.keywords) or "none: a shape"


def variants_text() -> str:
    """``harness variants``: each variant's name, key and kernel keywords; what each computes; :data:`VARIANTS_NOTE`."""
    rows = [("variant (case field)", "key", "kernel keywords (kind)")]
    for v in VARIANTS:
        also = [name for name in v.fields if name != v.name]
        rows.append((v.name + (f" (or {', '.join(also)})" if also else ""), v.key,
                     _keywords(v).replace("`", "")))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    lines = [f"{row[0].ljust(widths[0])}  {row[1].ljust(widths[1])}  {row[2]}".rstrip() for row in rows]
    lines += ["", *(f"{v.name}: {v.meaning}" for v in VARIANTS), "", VARIANTS_NOTE]
    return "\n".join(lines)


VARIANTS_NOTE = (
    "register_backend(variants=...) takes a variant by any of its names: its case field, its key or a\n"
    "keyword (alibi, alibi_slopes; kv_dtype, fp8_kv, k_scale). The keywords arrive only when the case turns the\n"
    "variant on. fp8 scales always arrive as [num_kv_heads] fp32 tensors, also when the case has one scale per\n"
    "tensor (every element the same): a plan step's facts say which (CaseFacts.kv_scale: per_tensor, per_head)."
)


def markdown() -> str:
    """The variants' table of docs/contract.md (``python -m harness.results.columns`` writes it)."""
    lines = ["| key | case-file fields | kernel keywords (kind) | what it computes |", "|---|---|---|---|"]
    for v in VARIANTS:
        lines.append(f"| `{v.key}` | {', '.join(f'`{name}`' for name in v.fields)} | {_keywords(v)} | {v.meaning} |")
    return "\n".join(lines)
