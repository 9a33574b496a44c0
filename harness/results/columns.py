"""The report's columns: one table, from which results.parquet's columns (exactly these, in this order),
the contract's table (``python -m harness.results.columns`` rewrites docs/contract.md's) and the page's
header tips are made."""

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.cases import variants


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str  # "str", "int", "float", "bool" or "list" (a list of floats); nullable except case/backend/status
    meaning: str


def _group(names: str, dtype: str, meaning: str) -> list[Column]:
    return [Column(name, dtype, meaning) for name in names.split()]


TABLE: tuple[Column, ...] = (
    Column("case", "str", "the case's id (its file's `name`, plus the sweep point)"),
    Column("backend", "str", "the backend's registered name"),
    Column("device", "str", "`cpu` or `cuda`"),
    Column("dtype", "str", "q's dtype (and the KV cache's, unless `kv_dtype` says otherwise)"),
    *_group("num_q_heads num_kv_heads head_dim block_size num_seqs max_seq_len", "int", "the case's shape"),
    Column("status", "str", "`pass`, `fail`, `error` or `skip`"),
    Column("reason", "str", "why the row is not a pass (empty on a pass)"),
    Column("max_abs_err", "float", "max |out - expected| against the float64 oracle"),
    Column("max_rel_err", "float", "max |out - expected| / |expected| where expected is not tiny"),
    Column("rel_l2_err", "float", "||out - expected|| / ||expected||"),
    Column("nan_count", "int", "NaN or inf elements in the output"),
    *_group("atol rtol", "float", "the tolerance the row was graded with"),
    Column("latency_us", "float", "median device time of the prepared call: CUDA graph replay where it captures, CUDA "
           "events otherwise, `perf_counter` on a CPU; L2 flushed before each sample"),
    Column("bytes_moved", "int", "fewest bytes the call must move: q, the KV it must read (a window's keys only, a "
           "shared prefix once), the output"),
    Column("gbps", "float", "bytes_moved / latency_us, in GB/s"),
    Column("pct_of_ceiling", "float", "gbps as a percent of the run's measured read bandwidth"),
    Column("tol_ratio", "float", "max of |out - expected| / (atol + rtol * |expected|); at most 1 passes"),
    Column("group_size", "int", "num_q_heads / num_kv_heads"),
    Column("num_tokens", "int", "query tokens over all sequences"),
    Column("max_q_len", "int", "the longest query of the batch"),
    Column("total_kv_tokens", "int", "keys over all sequences"),
    Column("layout", "str", "how the sequences' blocks are laid out in the cache"),
    Column("input_scale", "float", "the scale of the random inputs"),
    Column("seed", "int", "the seed of the inputs"),
    Column("tags", "str", "the case's tags, comma separated"),
    Column("case_file", "str", "the case file the case came from"),
    Column("backend_kind", "str", "`kernel`, `model`, `engine`, `peer` or `plugin`"),
    Column("note", "str", "which form a peer or the dispatcher took; whether the row's timing was cut short or "
           "skipped by its budget"),
    *_group("latency_p10_us latency_p90_us", "float", "the 10th and 90th percentiles of the device-time samples"),
    Column("timing_reps", "int", "samples taken"),
    Column("timing_method", "str", "how the samples were taken (graph, events, wall)"),
    Column("call_us", "float", "median wall time of the eager call, the device drained before and after"),
    Column("plan_us", "float", "wall time of the backend's plan step, once per input set outside the timed calls "
           "(plugins with `plan=`)"),
    *_group("call_p10_us call_p90_us", "float", "the 10th and 90th percentiles of the call samples"),
    Column("host_overhead_us", "float", "call_us - latency_us (CUDA only)"),
    Column("host_us", "float", "the host's time of one eager call on cold host caches (CUDA only)"),
    Column("graph_capturable", "bool", "whether the default call can be captured in a CUDA graph"),
    Column("device_syncs", "int", "host-device syncs one call makes (CUDA only)"),
    Column("kernels_ran", "str", "the device kernels one call launched, longest first"),
    Column("timing_threads", "int", "torch intra-op threads while timing"),
    Column("flops", "int", "2 x attended pairs x heads x (head_dim + head_dim_v)"),
    Column("tflops", "float", "flops / latency_us, in TFLOP/s"),
    Column("pct_of_peak", "float", "tflops as a percent of the dtype's dense peak (rows with q_len > 1)"),
    Column("error_bound", "float", "the round-off of the inputs themselves (forward error bound)"),
    Column("grading_note", "str", "a note when a tolerance sits below the error bound"),
    Column("fail_count", "int", "elements outside the tolerance"),
    Column("worst_location", "str", "token, head and channel of the worst element"),
    Column("lse_max_abs_err", "float", "max error of the returned log-sum-exp (cases with `return_lse`)"),
    Column("lse_tol_ratio", "float", "the lse's tol_ratio"),
    Column("kv_dtype", "str", "the KV cache's dtype (fp8 cases)"),
    Column("quant_error", "float", "max |oracle(dequantized cache) - oracle(unquantized cache)|: what fp8 itself "
           "costs"),
    Column("head_dim_v", "int", "V's head size (MLA: 512; else head_dim)"),
    Column("host", "str", "the host that ran the row (scale-out runs)"),
    Column("gpu_index", "str", "the GPU that ran the row (scale-out runs)"),
    Column("gpu_name", "str", "that GPU's model"),
    Column("worker", "int", "the worker that ran the row (scale-out runs)"),
    Column("oracle_cached", "bool", "whether the row's float64 oracle came from the oracle cache"),
    Column("latency_samples_us", "list", "every device-time sample (parquet only)"),
    Column("call_samples_us", "list", "every call sample (parquet only)"),
)  # fmt: skip

COLUMNS: list[str] = [column.name for column in TABLE]
MEANINGS: dict[str, str] = {column.name: column.meaning for column in TABLE}
DOC = Path(__file__).resolve().parents[2] / "docs" / "contract.md"


class UnknownColumnError(ValueError):
    """A row carries a key that is not in TABLE: add it there (name, dtype, meaning)."""


def check_row_keys(rows: list[dict]) -> None:
    known = set(COLUMNS)
    if unknown := sorted({key for row in rows for key in row if key not in known and not key.startswith("_")}):
        raise UnknownColumnError(f"row keys not in harness/results/columns.py TABLE: {', '.join(unknown)}")


def markdown() -> str:
    lines = ["| column | dtype | meaning |", "|---|---|---|"]
    lines += [f"| `{c.name}` | {c.dtype} | {c.meaning.replace('|', chr(92) + '|')} |" for c in TABLE]
    return "\n".join(lines)


def doc_with_tables(text: str) -> str:
    """``text`` (docs/contract.md) with the column and variant tables between their markers made anew."""
    for what, make in (("columns", markdown), ("variants", variants.markdown)):
        begin, end = f"<!-- {what}: made by python -m harness.results.columns -->", f"<!-- {what} end -->"
        pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
        if not pattern.search(text):
            raise ValueError(f"{DOC}: no {begin} ... {end} block")
        text = pattern.sub(lambda _, begin=begin, end=end, make=make: f"{begin}\n{make()}\n{end}", text)
    return text


if __name__ == "__main__":
    DOC.write_text(doc_with_tables(DOC.read_text()))
    print(f"wrote the column and variant tables into {DOC}", file=sys.stderr)
