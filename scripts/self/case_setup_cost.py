"""Where a case's host time goes before its first backend row: a small table of seconds.

    python scripts/self/case_setup_cost.py cases/gpu.toml llama3_8b_decode/block_size=16 --threads 1 2

For each torch thread count: building the inputs (harness.run.runner.case_inputs, on the
CPU), the oracle cache's content key (harness.run.oracle_cache.cache_key), the guard's
fingerprints (harness.run.guard.InputGuard), the float64 oracle and the forward error bound
(both computed, not cached). Each part is the best of ``--repeat`` runs; the box's load
is printed beside them, since a busy machine moves every number.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from harness.cases.spec import load_case_file
from harness.run.grading import forward_error_bound
from harness.run.guard import InputGuard
from harness.run.oracle import paged_attention_oracle
from harness.run.oracle_cache import cache_key
from harness.run.runner import case_inputs


def best_of(repeat: int, work) -> tuple[float, object]:
    """(the fastest of ``repeat`` calls in seconds, the last call's result)."""
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - start)
    return min(times), result


def costs(case, repeat: int, oracle: bool) -> dict[str, float]:
    """Seconds of each host part of build_context for ``case`` on the CPU."""
    took: dict[str, float] = {}
    took["inputs"], inputs = best_of(repeat, lambda: case_inputs(case, "cpu"))
    options = {name: value for name, value in inputs.options.items() if name != "return_lse"}
    took["cache key"], _ = best_of(repeat, lambda: cache_key(inputs.args(), "cpu", options=options))
    took["guard fingerprints"], _ = best_of(repeat, lambda: InputGuard(inputs, lambda: inputs))
    if oracle:
        took["oracle (computed)"], expected = best_of(1, lambda: paged_attention_oracle(*inputs.args(), **options))
        took["error bound (computed)"], _ = best_of(
            1, lambda: forward_error_bound(*inputs.dequantized_args(), expected)
        )
    return took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case_file")
    parser.add_argument("case_id")
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--repeat", type=int, default=2, help="runs per part; the fastest counts")
    parser.add_argument("--no-oracle", action="store_true", help="skip the oracle and the bound (slow)")
    args = parser.parse_args(argv)
    cases = {case.id: case for case in load_case_file(args.case_file)}
    if args.case_id not in cases:
        parser.error(f"{args.case_file} has no case {args.case_id!r}; it has {', '.join(sorted(cases))}")
    case = cases[args.case_id]
    columns = {}
    for threads in args.threads:
        torch.set_num_threads(threads)
        columns[threads] = costs(case, args.repeat, not args.no_oracle)
    print(f"{case.id}: {case.num_seqs} seqs, {sum(case.seq_lens)} KV tokens, {case.dtype}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")  # fmt: skip
    print("| part | " + " | ".join(f"{t} thread{'s' if t > 1 else ''} (s)" for t in columns) + " |")
    print("|---|" + "---|" * len(columns))
    for part in next(iter(columns.values())):
        print(f"| {part} | " + " | ".join(f"{columns[t][part]:.2f}" for t in columns) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
