"""Run cases through backends: grade each against the oracle, time it, emit one row each (a DataFrame)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from harness.backends.registry import Backend
from harness.cases.inputs import PagedInputs, make_inputs
from harness.cases.spec import Case
from harness.cases.vocab import FAILING
from harness.results.columns import COLUMNS, check_row_keys
from harness.run import physics
from harness.run.calling import NOT_TIMED, Called, call_backend, error_reason, expected_under, sign_mask
from harness.run.grading import BOUND_RESULT, forward_error_bound, grade, locate
from harness.run.guard import InputGuard
from harness.run.oracle import paged_attention_oracle
from harness.run.oracle_cache import lookup, oracle_key
from harness.timing.measure import TimingSettings
from harness.timing.metrics import bytes_moved
from harness.timing.phases import phase

__all__ = ["NOT_TIMED", "error_reason"]  # re-exported: compare and the executors read them here

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class RunConfig:
    device: str
    backends: list[Backend]
    timing: bool = True
    oracle_device: str = "cpu"
    ceilings: dict = field(default_factory=dict)  # harness.timing.ceilings.measure_ceilings: read/copy GB/s, peaks
    ceiling_dtypes: tuple[str, ...] = ()  # the run's dtypes: a worker measures its GPU's matmul ceiling for each
    progress: bool = True
    threads: int | None = None  # torch intra-op threads of the run (recorded on timed rows)
    isolated: frozenset[str] = frozenset()  # backends run in a worker process (harness.execute.processes)
    plugins: tuple[str, ...] = ()  # plugin modules the worker imports
    timeout_s: float | None = None  # per isolated call; a case's timeout_s wins; None: the default
    # (staging folder, final folder) of each plugin row's stdout/stderr (harness.execute.output.row_log); None: not kept
    logs: tuple[str, str] | None = None


@dataclass(frozen=True)
class CaseContext:
    """A case's inputs and its oracle output, built once and shared by every backend."""

    case: Case
    inputs: PagedInputs
    guard: InputGuard | None  # fingerprints of the pristine inputs
    expected: torch.Tensor | None = None  # [num_tokens, num_q_heads, head_dim] float64; None in a plugin's worker
    bound: torch.Tensor | None = None  # forward_error_bound of the inputs, expected's shape
    expected_lse: torch.Tensor | None = None  # [num_tokens, num_q_heads] float64, when the case asks for it
    quant_error: float | None = None  # fp8 cases: max |oracle(dequantized cache) - oracle(unquantized)|
    oracle_cached: bool = False  # expected or bound came from the oracle cache (the row's oracle_cached)


def build_context(case: Case, device: str, oracle_device: str, oracle: bool = True) -> CaseContext:
    """The case's inputs, oracle output (and lse), error bound and input guard (``oracle=False``: no oracle)."""
    with phase("inputs"):
        inputs = case_inputs(case, device)
    results = ()
    if oracle:
        with phase("oracle"):
            results = _oracle_results(inputs, oracle_device)
    with phase("guard"):
        guard = InputGuard(inputs, lambda: case_inputs(case, device))
    return CaseContext(case, inputs, guard, *results)


def _oracle_results(inputs: PagedInputs, oracle_device: str) -> tuple:
    """:class:`CaseContext`'s expected, bound, expected_lse or None, quant_error or None and oracle_cached."""
    options = {name: value for name, value in inputs.options.items() if name != "return_lse"}
    out_shape = (*inputs.q.shape[:2], inputs.v_cache.shape[-1])
    expected_lse, cached, key = None, False, None
    if "return_lse" in inputs.options:  # out and lse from one oracle call (not cached: the cache keeps out)
        expected, expected_lse = paged_attention_oracle(*inputs.args(), device=oracle_device, return_lse=True,
                                                        **options)  # fmt: skip
    else:  # computed once per input content and variant (harness.run.oracle_cache), hashed once for both results
        key = oracle_key(inputs.args(), oracle_device, options)
        expected, cached = lookup(key, "out", oracle_device, out_shape,
                                 lambda: paged_attention_oracle(*inputs.args(), device=oracle_device, **options))  # fmt: skip
    quant_error = None
    if inputs.unquantized is not None:  # what the fp8 cache itself costs, reported beside the grade
        plain = {name: value for name, value in options.items() if name not in ("k_scale", "v_scale")}
        unquantized = paged_attention_oracle(inputs.q, *inputs.unquantized, *inputs.args()[3:], device=oracle_device,
                                             **plain)  # fmt: skip
        quant_error = float((unquantized - expected).abs().max()) if expected.numel() else 0.0
    bound, bound_cached = lookup(key, BOUND_RESULT, oracle_device, out_shape,
                                 lambda: forward_error_bound(*inputs.dequantized_args(), expected))  # fmt: skip
    return expected, bound, expected_lse, quant_error, cached or bound_cached


_INPUT_FIELDS = ("num_q_heads", "num_kv_heads", "head_dim", "block_size", "dtype", "layout", "input_scale", "seed")
# The case's fields a row carries as they are (case_columns adds the derived ones).
_ROW_FIELDS = ("dtype", "num_q_heads", "num_kv_heads", "head_dim", "block_size", "num_seqs", "max_seq_len", "atol",
               "rtol", "group_size", "layout", "head_dim_v", "input_scale", "seed")  # fmt: skip


def case_inputs(case: Case, device: str) -> PagedInputs:
    return make_inputs(**{name: getattr(case, name) for name in _INPUT_FIELDS}, seq_lens=list(case.seq_lens),
                       q_lens=list(case.q_lens), device=device, **case.variant_fields())  # fmt: skip


def case_columns(case: Case, device: str) -> dict:
    return {"case": case.id, "device": device, **{name: getattr(case, name) for name in _ROW_FIELDS},
            "bytes_moved": bytes_moved(case), "num_tokens": sum(case.q_lens), "max_q_len": max(case.q_lens),
            "total_kv_tokens": sum(case.seq_lens), "kv_dtype": case.kv_dtype or "", "tags": ",".join(case.tags),
            "case_file": case.file}  # fmt: skip


def run_backend(ctx: CaseContext, backend: Backend, config: RunConfig) -> dict:
    """One report row of a backend run in this process: its calls (:func:`call_backend`), then :func:`grade_called`."""
    seeds = flip_seeds()
    settings = TimingSettings(config.device, config.ceilings, threads=config.threads).for_backend(backend)
    called = call_backend(ctx.case, ctx.inputs, ctx.guard, backend, config.device, settings if config.timing else None,
                          seeds)  # fmt: skip
    return grade_called(ctx, backend, config, called, seeds)


def flip_seeds() -> tuple[int, int, int]:
    """Fresh seeds of the flips of a row's timed calls (:func:`harness.run.calling.sign_mask`), drawn by the
    driver from the OS, so the process that runs a backend cannot know them before its calls."""
    return secrets.randbits(62), secrets.randbits(62), secrets.randbits(62)


def grade_called(ctx: CaseContext, backend: Backend, config: RunConfig, called: Called,
                 seeds: tuple[int, int, int], wall: tuple | None = None) -> dict:  # fmt: skip
    """The row of a backend's calls: every output graded (it passes only if all do; a failure is never replaced by a
    later error), the timing held to physics (``wall``: a worker's batch of calls as this process timed it)."""
    case = ctx.case
    row = {**case_columns(case, config.device), "backend": backend.name, "backend_kind": backend.kind,
           "oracle_cached": ctx.oracle_cached}  # fmt: skip
    if ctx.quant_error is not None:
        row["quant_error"] = ctx.quant_error
    if called.status == "skip":
        return {**row, "status": "skip", "reason": called.reason}
    if called.out is None:  # it raised before its graded call returned (or returned no tensor)
        if called.status == "error":
            return {**row, "status": "error", "reason": called.reason, "note": called.note}
        return {**row, "status": "fail", "reason": called.problem or "returned no tensor", "note": called.note}
    row["note"] = called.note
    if called.out.shape != ctx.expected.shape:
        return {**row, "status": "fail", "reason": called.problem}
    with phase("grade"):
        result = grade(called.out, ctx.expected, case.atol, case.rtol, ctx.bound)
    row.update(status="pass" if result.passed else "fail", reason=result.reason)
    row.update(result.columns())
    if not result.passed and result.worst_index:
        starts, lens = ctx.inputs.query_start_loc.tolist(), ctx.inputs.seq_lens.tolist()
        row["worst_location"] = f"{locate(result.worst_index[0], starts, lens)}, head {result.worst_index[1]}"
    if called.lse is not None and ctx.expected_lse is not None:
        lse_grade = grade(called.lse, ctx.expected_lse, case.atol, case.rtol)
        row.update(lse_max_abs_err=lse_grade.max_abs_err, lse_tol_ratio=lse_grade.tol_ratio)
        if not lse_grade.passed and row["status"] == "pass":
            row.update(status="fail", reason=f"lse: {lse_grade.reason}")
    if called.problem:
        row.update(status="fail", reason=called.problem)
    if row["status"] == "pass" and (later := _later_outputs(ctx, called, seeds) or called.timed_problem):
        row.update(status="fail", reason=f"graded call pass; {later}")
    if called.status == "error":  # raised after its graded call: a graded failure stays a failure
        if row["status"] == "fail":
            row["reason"] = f"{row['reason']}; then raised {called.reason}"
        else:
            row.update(status="error", reason=called.reason)
    timing = dict(called.timing)
    if timing_note := timing.pop("timing_note", ""):  # sampling cut short by the row's budget
        row["note"] = "; ".join(filter(None, [row.get("note"), timing_note]))
    row.update(timing)
    if timing and (impossible := physics.impossible(row, config.ceilings, wall)):
        physics.withdraw(row)
        reason = f"timing not credited: {impossible}"
        row.update(status="fail", reason=f"{row['reason']}; {reason}" if row.get("reason") else reason)
    return row


def _later_outputs(ctx: CaseContext, called: Called, seeds: tuple[int, int, int]) -> str:
    """'' when every further output passes; else which call failed and how."""
    case = ctx.case
    for label, seed, output in called.outputs:
        if seed is not None and seed not in seeds:
            return f"{label}: reported a flip the harness never asked for"
        expected = ctx.expected if seed is None else expected_under(ctx.expected, sign_mask(seed, case))
        if output.shape != expected.shape:
            return f"{label} wrong: shape {tuple(output.shape)}, expected {tuple(expected.shape)}"
        later = grade(output, expected, case.atol, case.rtol)
        if not later.passed:
            return f"{label} wrong: {later.reason}"
    return ""


def row_without_call(case: Case, backend: Backend, config: RunConfig, status: str, reason: str) -> dict:
    return {**case_columns(case, config.device), "backend": backend.name, "backend_kind": backend.kind,
            "status": status, "reason": reason}  # fmt: skip


def to_frame(rows: list[dict]) -> pd.DataFrame:
    """Rows as a DataFrame with every report column, in order (absent values are NaN)."""
    check_row_keys(rows)
    import pandas as pd  # not at import: a worker process never builds a frame

    frame = pd.DataFrame(rows, columns=COLUMNS)
    for column in ("reason", "note", "timing_method", "tags", "kernels_ran", "grading_note", "worst_location"):
        frame[column] = frame[column].astype(object).fillna("").astype(str)
    return frame


def exit_code(frame: pd.DataFrame) -> int:
    return 1 if frame["status"].isin(FAILING).any() else 0
