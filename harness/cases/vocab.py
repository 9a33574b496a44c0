"""The harness's words, each defined once: dtype names (the kernels' own), KV-pool layouts, row statuses."""

from typing import Annotated, Literal

from pydantic import AllowInfNan, Strict

from kernels.contract import DTYPES
from kernels.fp8 import FP8_DTYPES

# A case file's numbers, strictly: `true` is not 1, "3" is not 3; floats finite (no nan, no inf).
Int = Annotated[int, Strict()]
Float = Annotated[float, Strict(), AllowInfNan(False)]
Bool = Annotated[bool, Strict()]
INT32_MAX, INT64_MAX = 2**31 - 1, 2**63 - 1

# float32, float16, bfloat16: name -> torch.dtype (the case file's and the report's dtype column)
DTYPE_NAMES: tuple[str, ...] = tuple(DTYPES)
DTypeName = Literal[DTYPE_NAMES]  # type: ignore[valid-type]  # Literal["float32", "float16", "bfloat16"]

# An fp8 KV cache's dtype (the case file's kv_dtype): float8_e4m3fn, float8_e5m2.
KV_DTYPE_NAMES: tuple[str, ...] = tuple(str(dtype).removeprefix("torch.") for dtype in FP8_DTYPES)
KVDTypeName = Literal[KV_DTYPE_NAMES]  # type: ignore[valid-type]

# How harness.cases.inputs.assign_blocks places sequences' blocks: in order, shuffled, or with a shared prefix.
LAYOUTS = ("contiguous", "shuffled", "shared_prefix")
Layout = Literal[LAYOUTS]  # type: ignore[valid-type]

# A row's status: within tolerance, outside it, the call raised (or died), or it did not run.
STATUSES = ("pass", "fail", "error", "skip")
Status = Literal[STATUSES]  # type: ignore[valid-type]
GRADED = ("pass", "fail")  # rows the oracle graded
FAILING = ("fail", "error")  # rows that make a run exit 1
WORST_FIRST = ("error", "fail", "pass", "skip")  # the order of the report's tables


# The tolerance each dtype's output is held to: allclose's |out - expected| <= atol + rtol * |expected|
# against the float64 oracle (docs/contract.md, "Tolerances"). fp32's is the kernel's contract.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {"float32": (1e-5, 1e-4),
                                                      "float16": (1e-3, 1e-3),
                                                      "bfloat16": (1e-2, 1e-2)}  # fmt: skip
# Overrides for an fp8 KV cache, by q's dtype. Empty: the built-in kernels widen fp8 values exactly and
# apply the scales outside the dots, so they round no more than the oracle of the dequantized cache.
FP8_KV_TOLERANCES: dict[str, tuple[float, float]] = {}


# The tags pydantic puts in an error's location for a union's members ('int', 'list[int]', 'function-after[...]',
# 'constrained-int'): field_path drops them, and so any part with a '-' (no field or meta.json key has one).
_UNION_TAGS = {"int", "float", "str", "bool", "list", "dict", "none"}


def field_path(loc: tuple, brackets: bool = False) -> str:
    """A pydantic error's location as the field path a person reads, without union member tags: ``('seq_lens',
    'list[...]', 1)`` -> ``seq_lens.1``; with ``brackets``, ``('gpus', 0, 'gpu_name')`` -> ``gpus[0].gpu_name``."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]" if brackets else f".{part}"
        elif not ("[" in part or "-" in part or part.lower() in _UNION_TAGS):
            path += f".{part}"
    return path.removeprefix(".")
