"""Run cases through backends: grade each against the oracle, time it, emit one row each.

The runner knows nothing of files: it returns a DataFrame (and calls ``on_row`` per
row), and :mod:`harness.results.report` stores it.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from harness.backends.registry import Backend, Prepared, Unsupported
from harness.cases.inputs import PagedInputs, make_inputs
from harness.cases.spec import Case
from harness.cases.vocab import FAILING, GRADED, STATUSES
from harness.results.columns import COLUMNS, check_row_keys
from harness.run.grading import BOUND_RESULT, forward_error_bound, grade, locate
from harness.run.guard import InputGuard, check_output, raised_by_backend
from harness.run.oracle import paged_attention_oracle
from harness.run.oracle_cache import lookup, oracle_key
from harness.timing.measure import TimingPlan, timing_columns
from harness.timing.metrics import bytes_moved
from harness.timing.phases import phase

if TYPE_CHECKING:
    import pandas as pd

# The note of a row graded but not timed because its one call outlasted the timing budget (compare reads it).
NOT_TIMED = "not timed: one call took"


@dataclass(frozen=True)
class RunConfig:
    """How to run: device, backends, timing on/off, where the float64 oracle runs, the ceiling."""

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
    expected: torch.Tensor  # [num_tokens, num_q_heads, head_dim] float64
    bound: torch.Tensor | None = None  # forward_error_bound of the inputs, expected's shape
    guard: InputGuard | None = None  # fingerprints of the pristine inputs
    expected_lse: torch.Tensor | None = None  # [num_tokens, num_q_heads] float64, when the case asks for it
    quant_error: float | None = None  # fp8 cases: max |oracle(dequantized cache) - oracle(unquantized)|
    oracle_cached: bool = False  # expected or bound came from the oracle cache (the row's oracle_cached)


def build_context(case: Case, device: str, oracle_device: str) -> CaseContext:
    """The case's inputs, oracle output (and lse), error bound and input guard; phases "inputs", "oracle", "guard"."""
    with phase("inputs"):
        inputs = case_inputs(case, device)
    with phase("oracle"):
        expected, bound, expected_lse, quant_error, cached = _oracle_results(inputs, oracle_device)
    with phase("guard"):
        guard = InputGuard(inputs, lambda: case_inputs(case, device))
    return CaseContext(case, inputs, expected, bound, guard, expected_lse, quant_error, cached)


def _oracle_results(inputs: PagedInputs, oracle_device: str) -> tuple:
    """(expected, bound, expected_lse or None, quant_error or None, from the cache) of :class:`CaseContext`."""
    options = {name: value for name, value in inputs.options.items() if name != "return_lse"}
    out_shape = (*inputs.q.shape[:2], inputs.v_cache.shape[-1])
    expected_lse, cached = None, False
    if "return_lse" in inputs.options:  # out and lse from one oracle call (not cached: the cache keeps out)
        expected, expected_lse = paged_attention_oracle(
            *inputs.args(), device=oracle_device, return_lse=True, **options
        )
        key = None
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


def case_inputs(case: Case, device: str) -> PagedInputs:
    """The case's inputs, built from its seed (the same tensors every time)."""
    return make_inputs(
        num_q_heads=case.num_q_heads,
        num_kv_heads=case.num_kv_heads,
        head_dim=case.head_dim,
        block_size=case.block_size,
        seq_lens=list(case.seq_lens),
        q_lens=list(case.q_lens),
        dtype=case.dtype,
        layout=case.layout,
        input_scale=case.input_scale,
        seed=case.seed,
        device=device,
        **case.variant_fields(),
    )


def case_columns(case: Case, device: str) -> dict:
    return {
        "case": case.id,
        "device": device,
        "dtype": case.dtype,
        "num_q_heads": case.num_q_heads,
        "num_kv_heads": case.num_kv_heads,
        "head_dim": case.head_dim,
        "block_size": case.block_size,
        "num_seqs": case.num_seqs,
        "max_seq_len": case.max_seq_len,
        "atol": case.atol,
        "rtol": case.rtol,
        "bytes_moved": bytes_moved(case),
        "group_size": case.group_size,
        "num_tokens": sum(case.q_lens),
        "max_q_len": max(case.q_lens),
        "total_kv_tokens": sum(case.seq_lens),
        "layout": case.layout,
        "kv_dtype": case.kv_dtype or "",
        "head_dim_v": case.head_dim_v,
        "input_scale": case.input_scale,
        "seed": case.seed,
        "tags": ",".join(case.tags),
        "case_file": case.file,
    }


def error_reason(error: BaseException) -> str:
    last = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
    where = f" (at {last.filename.rsplit('/', 1)[-1]}:{last.lineno})" if last else ""
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {message[:300]}{where}"


def _timed_call(prepared: Prepared, cuda: bool) -> tuple[object, float]:
    """One call of the prepared backend: (its result, its wall seconds, the device drained on CUDA)."""
    started = time.perf_counter()
    result = prepared.run()
    if cuda:
        torch.cuda.synchronize()
    return result, time.perf_counter() - started


def run_backend(ctx: CaseContext, backend: Backend, config: RunConfig) -> dict:
    """One report row: skip, error, or the grade (and timing) of one backend on one case."""
    case = ctx.case
    row = {**case_columns(case, config.device), "backend": backend.name, "backend_kind": backend.kind,
           "oracle_cached": ctx.oracle_cached}  # fmt: skip
    if ctx.quant_error is not None:
        row["quant_error"] = ctx.quant_error
    if reason := backend.skip_reason(case, config.device):
        return {**row, "status": "skip", "reason": reason}
    try:
        out = ctx.inputs.new_out()  # NaN: an element the backend does not write fails
        cuda = torch.device(config.device).type == "cuda"
        with phase("graded call"):
            prepared = backend.prepare(case, ctx.inputs, out)
            raw, graded_s = _timed_call(prepared, cuda)
            lse, lse_problem = None, ""
        if ctx.expected_lse is not None:  # the call was asked for (out, lse)
            if isinstance(raw, tuple) and len(raw) == 2:
                raw, lse = raw
            else:
                lse_problem = f"return_lse=True returned {type(raw).__name__}, not a tuple (out, lse)"
        packed = prepared.to_packed(raw)
        with phase("guard"):
            mutated = ctx.guard.check("in its graded call") if ctx.guard else ""
        problem = "; ".join(filter(None, [mutated, check_output(packed, ctx.inputs.q, case.head_dim_v), lse_problem]))
        if not isinstance(packed, torch.Tensor) or packed.shape != ctx.expected.shape:
            return {**row, "status": "fail", "reason": problem, "note": prepared.note}
        with phase("grade"):
            result = grade(packed, ctx.expected, case.atol, case.rtol, ctx.bound)
        row.update(status="pass" if result.passed else "fail", reason=result.reason, note=prepared.note)
        row.update(result.columns())
        if not result.passed and result.worst_index:
            token, head = result.worst_index[0], result.worst_index[1]
            starts, lens = ctx.inputs.query_start_loc.tolist(), ctx.inputs.seq_lens.tolist()
            row["worst_location"] = f"{locate(token, starts, lens)}, head {head}"
        if lse is not None:
            lse_grade = grade(lse, ctx.expected_lse, case.atol, case.rtol)
            row.update(lse_max_abs_err=lse_grade.max_abs_err, lse_tol_ratio=lse_grade.tol_ratio)
            if not lse_grade.passed and row["status"] == "pass":
                row.update(status="fail", reason=f"lse: {lse_grade.reason}")
        if problem:
            row.update(status="fail", reason=problem)
        plan = TimingPlan(config.device, config.ceilings, threads=config.threads).for_backend(backend)
        over_budget = config.timing and plan.budget_s is not None and graded_s > plan.budget_s
        if over_budget and cuda and not backend.model:
            # A kernel's or a peer's graded call on a GPU may have compiled (Triton's JIT of a new launch,
            # torch.compile, cuDNN's plans: 3-4 s for the fp8 decode on a fresh H200): a second call says what a
            # call costs. On a CPU nothing compiles (the Triton interpreter included): the first call decides.
            with phase("graded call"):
                graded_s = _timed_call(prepared, cuda)[1]
            over_budget = graded_s > plan.budget_s
        if over_budget:
            # One call already outlasts the row's timing budget (a CPU model on a long case): its samples
            # would cost minutes and tell nothing a kernel developer uses, so the row is graded, not timed.
            why = "a Python model on a GPU is graded, not timed" if plan.budget_s == 0 else (
                f"past the row's {plan.budget_s:g} s timing budget")  # fmt: skip
            row["note"] = "; ".join(filter(None, [row.get("note"), f"{NOT_TIMED} {graded_s:.1f} s, {why}"]))
        elif config.timing:
            row.update(timing_columns(case, backend, prepared, plan, row["bytes_moved"]))
            if timing_note := row.pop("timing_note", ""):  # sampling cut short by the row's budget
                row["note"] = "; ".join(filter(None, [row.get("note"), timing_note]))
        with phase("guard"):
            timed_problem = ctx.guard.check("while timed") if ctx.guard else ""
        if timed_problem and not problem:
            row.update(status="fail", reason=timed_problem)
    except Unsupported as refusal:  # the backend cannot serve this case: a skip with its reason
        return {**row, "status": "skip", "reason": str(refusal)}
    except BaseException as error:  # a raising (or sys.exit-ing) backend is an error row; the run goes on
        if not raised_by_backend(error):
            raise  # the user's Ctrl-C, or SIGTERM
        if torch.device(config.device).type == "cuda":
            torch.cuda.synchronize()
        mutated = ctx.guard.check("before it raised") if ctx.guard else ""
        return {**row, "status": "error", "reason": "; ".join(filter(None, [error_reason(error), mutated]))}
    return row


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


def summarize(frame: pd.DataFrame) -> str:
    """A short text summary: status counts per backend, the worst error, the slowest case."""
    if frame.empty:
        return "no rows"
    counts = frame.pivot_table(index="backend", columns="status", values="case", aggfunc="count", fill_value=0)
    counts = counts.reindex(columns=list(STATUSES), fill_value=0)
    graded = frame[frame["status"].isin(GRADED)]
    lines = [counts.to_string()]
    if graded["tol_ratio"].notna().any():
        worst = graded.loc[graded["tol_ratio"].idxmax()]
        lines.append(
            f"closest to its tolerance: {worst['backend']} on {worst['case']}: {worst['tol_ratio']:.2f} of it "
            f"(max abs {worst['max_abs_err']:.3g}, atol {worst['atol']:g}, rtol {worst['rtol']:g})"
        )
    timed = frame.dropna(subset=["latency_us"])
    if not timed.empty:
        slow = timed.loc[timed["latency_us"].idxmax()]
        lines.append(f"slowest: {slow['backend']} on {slow['case']}: {slow['latency_us']:.1f} us")
    bad = frame[frame["status"].isin(FAILING)]
    for _, row in bad.head(10).iterrows():
        lines.append(f"{row['status'].upper()}: {row['backend']} on {row['case']}: {row['reason']}")
    if len(bad) > 10:
        lines.append(f"... and {len(bad) - 10} more failures/errors (see the report)")
    return "\n".join(lines)


def verdict_lines(frame: pd.DataFrame, code: int, *, most: int = 8, width: int = 110) -> str:
    """The run's last words: one verdict line with the status counts, then why rows were skipped.

    ``PASS: 212 rows: 150 pass, 62 skip`` when ``code`` is 0, else ``FAIL: ...`` with the
    failing statuses first; then one line per (backend, reason) of the skips, the most
    frequent first (``skip triton (41): ...``), at most ``most`` of them, each cut to
    ``width`` characters: a run whose backend skipped everything says why right there.
    ``INCOMPLETE`` for code 4 (a folder finalized from a journal: pairs never ran).
    """
    counts = frame["status"].value_counts()
    order = ("fail", "error", "pass", "skip") if code == 1 else ("pass", "skip", "fail", "error")
    order += tuple(s for s in counts.index if s not in order)
    tally = ", ".join(f"{int(counts[s])} {s}" for s in order if counts.get(s, 0))
    word = {0: "PASS", 4: "INCOMPLETE"}.get(code, "FAIL")
    lines = [f"{word}: {len(frame)} rows" + (f": {tally}" if tally else "")]
    skips = frame[frame["status"] == "skip"]
    groups = skips.groupby(["backend", "reason"], sort=False).size().sort_values(ascending=False, kind="stable")
    for (backend, reason), count in groups.head(most).items():
        line = f"skip {backend} ({count}): {reason or 'no reason given'}"
        lines.append(line if len(line) <= width else line[: width - 3] + "...")
    if len(groups) > most:
        rest = int(groups.iloc[most:].sum())
        lines.append(f"... and {rest} more skips for {len(groups) - most} other reasons (the report lists them)")
    return "\n".join(lines)


def exit_code(frame: pd.DataFrame) -> int:
    """0 when every graded row is within tolerance, 1 when any row failed or errored."""
    return 1 if frame["status"].isin(FAILING).any() else 0
