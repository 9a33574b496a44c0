"""The shapes of the files a run folder holds, checked before anything reads them (:class:`RunFolderError`)."""

import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from harness.cases.vocab import STATUSES, field_path
from harness.results.columns import TABLE


class RunFolderError(ValueError):
    """A folder given as a stored run is not one (missing, corrupt, foreign or misshapen files); names file, field."""


# --- meta.json ---------------------------------------------------------------------------------

Number = int | float


class _Lenient(BaseModel):
    """Unknown keys allowed (a newer harness writes more); known keys strictly typed."""

    model_config = ConfigDict(extra="allow", strict=True)


class Ceilings(_Lenient):
    read_gbps: Number | None = None
    copy_gbps: Number | None = None
    matmul_tflops: dict[str, Number | None] | None = None
    peak_tflops: dict[str, Number | None] | Number | None = None  # a bare number in older runs
    peak_source: dict[str, str] | str | None = None


class GpuRecord(_Lenient):
    """One GPU of a process-pool run (harness.timing.ceilings.GpuLedger.to_meta)."""

    gpu_name: str
    host: str | None = None
    gpu_index: str | int | None = None
    ceilings: Ceilings | None = None
    workers: list[str | int] | None = None


class OracleCacheRecord(_Lenient):
    """How a run used the oracle cache (harness.run.oracle_cache.meta_record)."""

    mode: str  # off, on, verify
    folder: str | None = None
    verify_fraction: Number | None = None


# meta.json (harness.results.environment.collect_meta plus what the CLI adds): every key optional, typed when there.
_TEXT = str | None
RunMeta = create_model("RunMeta", __base__=_Lenient, **{name: (kind, None) for name, kind in {
    "commit": _TEXT, "commit_source": _TEXT, "dirty": bool | None, "time": _TEXT, "host": _TEXT, "device": _TEXT,
    "device_name": _TEXT, "torch": _TEXT, "triton": _TEXT, "python": _TEXT, "triton_interpret": _TEXT,
    "command": _TEXT, "harness_version": _TEXT, "cpu_model": _TEXT, "logical_cpus": int | None,
    "torch_threads": int | None, "load_average": list[Number] | None, "gpu_state": list[dict[str, str]] | None,
    "ceilings_gbps": dict[str, Number | None] | None, "ceilings": Ceilings | None, "timing_threads": int | None,
    "case_files": list[str] | None, "shard": _TEXT, "gpus": list[GpuRecord] | None, "scale": dict[str, Any] | None,
    "resumed": dict[str, Any] | None, "incomplete": dict[str, Any] | None, "merged_from": list[Any] | None,
    "timing": bool | None, "oracle_cache": OracleCacheRecord | None,
}.items()})  # fmt: skip


def check_meta(meta: Any, file: Path | str) -> dict:
    """``meta`` (parsed meta.json) if it fits :data:`RunMeta`; RunFolderError naming file and field."""
    if not isinstance(meta, dict):
        raise RunFolderError(f"{file}: a JSON object expected, got {type(meta).__name__}")
    try:
        RunMeta.model_validate(meta)
    except ValidationError as error:
        lines = {}
        for item in error.errors():
            field = field_path(item["loc"], brackets=True) or "(top level)"
            message = re.sub(r" or instance of \w+", "", item["msg"])  # pydantic's class names mean nothing here
            lines.setdefault(field, f"{file}: field '{field}': {message} (got {item['input']!r:.60})")
        raise RunFolderError("; ".join(lines.values())) from None
    return meta


# --- results.parquet ------------------------------------------------------------------------------

TEXT, NUMBER, SCALAR, SAMPLES, FLAG = "text", "number", "text or number", "list of numbers", "bool"

# The kind of every column of harness.results.columns.TABLE, by its dtype; a few columns hold wider values.
_KIND_OF_DTYPE = {"str": TEXT, "int": NUMBER, "float": NUMBER, "bool": FLAG, "list": SAMPLES}
COLUMN_KINDS: dict[str, str] = {  # gpu_index: as CUDA_VISIBLE_DEVICES names it, or its number
    **{column.name: _KIND_OF_DTYPE[column.dtype] for column in TABLE}, "gpu_index": SCALAR, "worker": SCALAR,
    "graph_capturable": NUMBER,
}  # fmt: skip
REQUIRED = ("case", "backend", "status")  # what compare, history and the report read, at least; never empty


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | np.integer | np.floating | np.bool_) and not isinstance(value, str)


def _is_samples(value: Any) -> bool:
    return isinstance(value, list | tuple | np.ndarray) and (np.asarray(value).dtype.kind in "fiub"
                                                             or all(_is_number(x) for x in value))  # fmt: skip


_VALUE_OK = {TEXT: lambda v: isinstance(v, str), NUMBER: _is_number, SCALAR: lambda v: isinstance(v, str) or _is_number(v),
             SAMPLES: _is_samples, FLAG: lambda v: isinstance(v, bool | np.bool_)}  # fmt: skip


def _column_problem(series: pd.Series, kind: str) -> str:
    """'' when every value of ``series`` fits ``kind``; else what is wrong, with the first bad value."""
    dtype = series.dtype
    if dtype.kind in "fiub":  # numbers: right for number columns; for others only when every value is null
        if kind in (NUMBER, SCALAR) or (kind == FLAG and dtype.kind == "b"):
            return ""
        if dtype.kind == "f" and series.isna().all():
            return ""
        return f"{kind} expected, found a column of dtype {dtype}"
    check = _VALUE_OK[kind]
    for position, value in enumerate(series.tolist()):
        if not (value is None or (isinstance(value, float) and np.isnan(value)) or check(value)):
            return f"{kind} expected, row {position} holds {type(value).__name__} {value!r:.40}"
    return ""


def check_rows(frame: pd.DataFrame, file: Path | str) -> pd.DataFrame:
    """``frame`` (results.parquet) if its known columns hold their kinds; RunFolderError naming file and column."""
    if missing := [c for c in REQUIRED if c not in frame.columns]:
        raise RunFolderError(f"{file}: not a harness results file: no column(s) {', '.join(missing)} "
                             f"(has {', '.join(map(str, frame.columns[:8]))}{'...' if len(frame.columns) > 8 else ''})")  # fmt: skip
    if frame.empty:
        raise RunFolderError(f"{file}: holds no rows (a run writes one per case and backend)")
    problems = []
    for column in frame.columns:
        kind = COLUMN_KINDS.get(str(column))
        if kind is not None and (problem := _column_problem(frame[column], kind)):
            problems.append(f"{file}: column '{column}': {problem}")
    problems += [f"{file}: column '{c}': empty in row {int(np.argmax(frame[c].isna()))}" for c in REQUIRED
                 if frame[c].isna().any()]  # fmt: skip
    bad = frame.loc[~frame["status"].isin(STATUSES), "status"]
    if not bad.empty and not frame["status"].isna().any():
        problems.append(f"{file}: column 'status': {bad.iloc[0]!r} is none of {', '.join(STATUSES)}")
    if problems:
        raise RunFolderError("; ".join(problems))
    return frame
