"""python -m harness {run,list,report,compare,schema}

Exit codes: 0 every case within tolerance, 1 a tolerance failure (or an error row, or a
regression for compare), 2 bad input (a case file or an argument), with one clear message.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from .options import DEFAULT_CASES

EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT = 0, 1, 2


class BadInput(Exception):
    """An argument or input the user must fix; printed as one message, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    from .options import add_to_argparse

    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__.split("\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)

    run = verbs.add_parser("run", help="run cases through backends; write a report folder")
    run.add_argument("cases", nargs="*", help=f"case files or folders (default: {' '.join(DEFAULT_CASES)})")
    add_to_argparse(run)
    run.add_argument("--out", type=Path, help="run folder to create (default: reports/<time>-<device>-<commit>)")
    run.add_argument("--no-timing", dest="timing", action="store_false", help="grade only; do not time")
    run.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    run.add_argument(
        "--profile", action="append", default=[], metavar="CASE[:BACKEND]",
        help="save a torch.profiler Chrome trace of these rows under RUN/profiles/ (globs; repeatable)",
    )  # fmt: skip

    listing = verbs.add_parser("list", help="the expanded cases, as a table")
    listing.add_argument("cases", nargs="*")
    listing.add_argument("--tag", action="append", dest="harness_tags", help="only cases with this tag")

    report = verbs.add_parser("report", help="(re)build report.html of a run folder")
    report.add_argument("run_dir", type=Path)

    compare = verbs.add_parser("compare", help="regressions of NEW_RUN against BASE_RUN; exit 1 if any")
    compare.add_argument("base_run", type=Path)
    compare.add_argument("new_run", type=Path)
    compare.add_argument("--latency-threshold", type=float, default=0.10, help="relative slowdown that counts (0.10)")
    compare.add_argument("--error-factor", type=float, default=2.0, help="error growth factor that counts (2.0)")

    verbs.add_parser("schema", help="JSON Schema of the case files")
    return parser


def _load(cases: list[str], device: str, tags: list[str] | None):
    from .cases import load_cases

    cases = cases or DEFAULT_CASES
    loaded = load_cases(cases, device=device, tags=tags)
    if not loaded:
        raise BadInput(f"no cases selected from {' '.join(cases)}" + (f" with tags {tags}" if tags else ""))
    return loaded


def cmd_run(args: argparse.Namespace) -> int:
    from .backends import load_plugin, resolve_backends
    from .ceilings import measure_ceilings
    from .environment import collect_meta
    from .options import apply_threads, default_device
    from .profiling import profile_pairs, selected
    from .runner import RunConfig, exit_code, run_cases, summarize
    from .storage import default_run_dir, write_run

    device = args.harness_device or default_device()
    if device == "cuda" and not torch.cuda.is_available():
        raise BadInput("--device cuda: no CUDA device is visible to torch")
    threads = apply_threads(args.harness_threads, device)
    for plugin in args.harness_plugins:
        load_plugin(plugin)
    backends = resolve_backends(args.harness_backends)
    run_dir = args.out or default_run_dir(Path("reports"), device)
    if run_dir.exists():
        raise BadInput(f"--out {run_dir}: already exists; a run is never overwritten")
    cases = _load(args.cases, device, args.harness_tags)
    to_profile = selected(cases, backends, args.profile)
    ceilings = measure_ceilings(device, [c.dtype for c in cases]) if args.timing else {}
    config = RunConfig(
        device=device,
        backends=backends,
        timing=args.timing,
        oracle_device=args.harness_oracle_device or "cpu",
        ceilings=ceilings,
        progress=args.progress,
        threads=threads,
    )
    print(f"{len(cases)} cases x {len(backends)} backends on {device}", file=sys.stderr)
    frame = run_cases(cases, config, on_row=None if args.progress else _row_printer())
    bandwidth = {k: v for k, v in ceilings.items() if k.endswith("_gbps")}
    meta = collect_meta(device, ["python -m harness", *sys.argv[1:]], bandwidth)
    meta.update(case_files=sorted({c.file for c in cases}), ceilings=ceilings, timing_threads=threads)
    write_run(frame, meta, run_dir)
    if to_profile:
        for path in profile_pairs(to_profile, device, config.oracle_device, run_dir / "profiles"):
            print(f"profile: {path}")
    print(summarize(frame))
    print(f"report: {run_dir / 'report.html'}")
    return exit_code(frame)


def _row_printer():
    """on_row for runs without a progress bar (logs, CI): one line a row as it finishes, with the time so far."""
    import time

    start = time.perf_counter()

    def show(row: dict) -> None:
        latency = row.get("latency_us")
        timed = f" {latency:.1f} us" if isinstance(latency, float) and latency == latency else ""
        call = row.get("call_us")
        timed += f" (call {call:.1f} us)" if isinstance(call, float) and call == call else ""
        print(
            f"[{time.perf_counter() - start:7.1f}s] {row['case']} {row['backend']}: {row['status']}{timed}",
            file=sys.stderr,
            flush=True,
        )

    return show


def cmd_list(args: argparse.Namespace) -> int:
    import pandas as pd

    from .options import default_device

    cases = _load(args.cases, default_device(), args.harness_tags)
    table = pd.DataFrame(
        [
            {
                "case": c.id,
                "heads q/kv": f"{c.num_q_heads}/{c.num_kv_heads}",
                "head_dim": c.head_dim,
                "block_size": c.block_size,
                "dtype": c.dtype,
                "num_seqs": c.num_seqs,
                "max_seq_len": c.max_seq_len,
                "max_q_len": max(c.q_lens),
                "layout": c.layout,
                "tags": ",".join(c.tags),
            }
            for c in cases
        ]
    )
    with pd.option_context("display.max_rows", None, "display.width", 200):
        print(table.to_string(index=False))
    print(f"{len(cases)} case{'' if len(cases) == 1 else 's'}")
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    from .report import rebuild_html

    print(rebuild_html(args.run_dir))
    return EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    from .compare import compare_runs, format_comparison
    from .storage import load_run

    base, _ = load_run(args.base_run)
    new, _ = load_run(args.new_run)
    comparison = compare_runs(base, new, latency_threshold=args.latency_threshold, error_factor=args.error_factor)
    print(format_comparison(comparison, str(args.base_run), str(args.new_run)))
    return EXIT_OK if comparison.ok else EXIT_FAIL


def cmd_schema(args: argparse.Namespace) -> int:
    from .cases import case_file_schema

    print(json.dumps(case_file_schema(), indent=2))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    # The Triton interpreter must be chosen before Triton is imported (see kernels.triton_paged).
    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    from .cases import CaseFileError
    from .storage import RunDirExistsError

    parser = build_parser()
    args = parser.parse_args(argv)
    handler = {"run": cmd_run, "list": cmd_list, "report": cmd_report, "compare": cmd_compare, "schema": cmd_schema}
    try:
        return handler[args.verb](args)
    except (BadInput, CaseFileError, RunDirExistsError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted: nothing was written", file=sys.stderr)
        return 130
