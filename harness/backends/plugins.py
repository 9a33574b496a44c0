"""What a plugged-in kernel declares beside its function: the facts its hooks are told (:class:`CaseFacts`),
the limits it keeps (:class:`Limits`, which the driver learns as plain values)."""

import dataclasses
from dataclasses import dataclass

import torch

from harness.cases.spec import Case
from harness.cases.variants import turned_on_names
from harness.cases.vocab import DTYPE_NAMES

# What a facts' kv_scale says of an fp8 case's scales (the kernel gets [num_kv_heads] tensors either way).
PER_TENSOR, PER_HEAD = "per_tensor", "per_head"


@dataclass(frozen=True)
class CaseFacts:
    """A case as the host knows it, told to a plugin's plan step and ``supports`` hook (plain values only)."""

    num_seqs: int
    num_tokens: int  # query tokens of all sequences (q's first dim)
    max_q_len: int
    max_seq_len: int
    decode: bool  # every sequence has one query: the default call passes query_start_loc=None
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    head_dim_v: int
    block_size: int
    dtype: str  # q's (and the output's) dtype: "float32", "float16" or "bfloat16"
    kv_dtype: str  # the pools' dtype: dtype, or "float8_e4m3fn" / "float8_e5m2"
    kv_scale: str  # an fp8 cache's scales: "per_tensor" or "per_head"; "" without fp8
    variants: tuple[str, ...]  # the variants the case turns on, by name: the keywords that arrive
    tags: tuple[str, ...]
    device: str
    interpreted: bool  # on the CPU with TRITON_INTERPRET=1


def case_facts(case: Case, device: str, interpreted: bool) -> CaseFacts:
    fp8 = case.kv_dtype is not None
    same = ("num_seqs", "max_seq_len", "num_q_heads", "num_kv_heads", "head_dim", "head_dim_v", "block_size", "dtype")
    return CaseFacts(**{name: getattr(case, name) for name in same}, num_tokens=sum(case.q_lens),
                     max_q_len=max(case.q_lens), decode=all(q_len == 1 for q_len in case.q_lens),
                     kv_dtype=case.kv_dtype if fp8 else case.dtype,
                     kv_scale=(PER_HEAD if case.kv_scale == "amax_per_head" else PER_TENSOR) if fp8 else "",
                     variants=turned_on_names(case), tags=tuple(case.tags), device=torch.device(device).type,
                     interpreted=interpreted)  # fmt: skip


@dataclass(frozen=True)
class Limits:
    """The cases a backend serves, as plain values the driver checks before any call; empty: no limit."""

    dtypes: tuple[str, ...] = ()  # q's dtypes it takes
    head_dims: tuple[int, ...] = ()  # the head dims it takes (K's and V's)
    block_size_multiple_of: int = 1  # block_size must be a multiple of this
    cpu_tags: tuple[str, ...] = ()  # on the CPU, only cases carrying one of these tags

    def refusal(self, case: Case, device: str) -> str | None:
        """Why ``case`` on ``device`` is outside these limits (naming the limit), or None."""
        if self.dtypes and case.dtype not in self.dtypes:
            return f"limits dtypes to {', '.join(self.dtypes)}; the case's is {case.dtype}"
        for what, value in (("head_dim", case.head_dim), ("head_dim_v", case.head_dim_v)):
            if self.head_dims and value not in self.head_dims:
                return f"limits head dims to {', '.join(map(str, self.head_dims))}; the case's {what} is {value}"
        if case.block_size % self.block_size_multiple_of:
            return (f"limits block_size to multiples of {self.block_size_multiple_of}; "
                    f"the case's is {case.block_size}")  # fmt: skip
        if self.cpu_tags and torch.device(device).type == "cpu" and not set(self.cpu_tags) & set(case.tags):
            return f"limits the CPU to cases tagged {' or '.join(map(repr, self.cpu_tags))} (cpu_tags)"
        return None

    def to_plain(self) -> dict:
        """These limits as a dict of lists and ints (what a worker reports)."""
        return {name: list(value) if isinstance(value, tuple) else value
                for name, value in dataclasses.asdict(self).items()}  # fmt: skip

    @classmethod
    def from_plain(cls, value, where: str = "limits") -> "Limits":
        """Limits from a dict of plain values; ValueError naming ``where`` and the field."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"{where} must be a dict of {', '.join(_FIELDS)}, not {type(value).__name__}")
        if unknown := sorted(set(value) - set(_FIELDS), key=str):
            raise ValueError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; known: {', '.join(_FIELDS)}")
        fields = {}
        for name, item in value.items():
            kind = _FIELDS[name]
            if kind is None:  # a number
                if type(item) is not int or item < 1:
                    raise ValueError(f"{where}.{name} must be a positive int, not {item!r}")
                fields[name] = item
            elif isinstance(item, list | tuple) and all(type(element) is kind for element in item):
                fields[name] = tuple(item)
            else:
                raise ValueError(f"{where}.{name} must be a list of {kind.__name__}, not {item!r}")
        if bad := [dtype for dtype in fields.get("dtypes", ()) if dtype not in DTYPE_NAMES]:
            raise ValueError(
                f"{where}.dtypes: {', '.join(map(repr, bad))} is not a dtype; known: {', '.join(DTYPE_NAMES)}"
            )
        return cls(**fields)


# Each field of Limits: the type of its list's elements, or None for a positive int.
_FIELDS: dict[str, type | None] = {"dtypes": str, "head_dims": int, "block_size_multiple_of": None, "cpu_tags": str}
