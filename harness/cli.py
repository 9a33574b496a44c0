"""python -m harness {run,list,report,compare,history,schema}

Exit codes: 0 every case within tolerance, 1 a tolerance failure (or an error row, or a
regression for compare), 2 bad input (a case file or an argument), with one clear message;
compare also exits 3 when nothing got worse but the comparison is incomplete.
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

    listing = verbs.add_parser("list", help="the expanded cases, as a table")
    listing.add_argument("cases", nargs="*")
    listing.add_argument("--tag", action="append", dest="harness_tags", help="only cases with this tag")

    report = verbs.add_parser("report", help="(re)build report.html of a run folder")
    report.add_argument("run_dir", type=Path)
    report.add_argument("--baseline", type=Path, metavar="BASE_RUN", help="mark and list regressions against this run")

    compare = verbs.add_parser(
        "compare",
        help="what got worse in NEW_RUN against BASE_RUN",
        description="Exit 0: nothing got worse and the comparison is complete; 1: something got worse; "
        "2: bad input (unreadable run, duplicated rows); 3: nothing got worse but the comparison is "
        "incomplete (rows on one side only, device or torch/triton mismatch).",
    )
    compare.add_argument("base_run", type=Path)
    compare.add_argument("new_run", type=Path)
    compare.add_argument("--min-effect", "--latency-threshold", type=float, dest="min_effect",
                         help="smallest relative latency change that counts (default 0.10 on CPU rows, 0.03 on CUDA)")  # fmt: skip
    compare.add_argument("--alpha", type=float, default=0.05, help="significance level after correction (0.05)")
    compare.add_argument(
        "--correction",
        choices=["bh", "holm", "none"],
        default="bh",
        help="multiple-row p-value correction: Benjamini-Hochberg (default), Holm, none",
    )
    compare.add_argument(
        "--error-factor", type=float, default=2.0, help="error / tol_ratio growth factor that counts (2.0)"
    )
    compare.add_argument(
        "--allow-mismatch", action="store_true", help="a device or version mismatch does not change the exit code"
    )
    compare.add_argument("--html", type=Path, metavar="FILE", help="also write the comparison as an HTML page")
    compare.add_argument("--all", action="store_true", dest="show_all", help="list every row, not only changes")
    compare.add_argument("--confirm", nargs="?", const="unclear", choices=["slower", "unclear", "all"],
                         help="re-time rows judged slower (and, by default, 'cannot tell'; or all), alternating both "
                         "commits' builds (git worktrees) row by row, before the verdict")  # fmt: skip
    compare.add_argument(
        "--confirm-rounds", type=int, default=8, help="rounds (fresh process pairs) for --confirm (8; at least 5)"
    )

    history = verbs.add_parser("history", help="latency and error trends across runs (commits), per case and backend")
    history.add_argument("runs", nargs="*", type=Path, help="run folders, or folders of runs (default: reports/)")
    history.add_argument("--html", type=Path, metavar="FILE", help="also write an HTML page with plots")
    history.add_argument("--min-effect", type=float, dest="min_effect", help="as for compare")
    history.add_argument(
        "--backend", action="append", dest="backends", metavar="NAME", help="only this backend (repeatable)"
    )

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
    from .environment import collect_meta
    from .options import default_device
    from .runner import RunConfig, exit_code, run_cases, summarize
    from .storage import default_run_dir, write_run
    from .timing import measure_copy_bandwidth

    device = args.harness_device or default_device()
    if device == "cuda" and not torch.cuda.is_available():
        raise BadInput("--device cuda: no CUDA device is visible to torch")
    for plugin in args.harness_plugins:
        load_plugin(plugin)
    backends = resolve_backends(args.harness_backends)
    run_dir = args.out or default_run_dir(Path("reports"), device)
    if run_dir.exists():
        raise BadInput(f"--out {run_dir}: already exists; a run is never overwritten")
    cases = _load(args.cases, device, args.harness_tags)
    ceilings = {}
    if args.timing:
        ceilings[f"{device}_copy"] = measure_copy_bandwidth(device)
    config = RunConfig(
        device=device,
        backends=backends,
        timing=args.timing,
        oracle_device=args.harness_oracle_device or "cpu",
        ceiling_gbps=ceilings.get(f"{device}_copy"),
        progress=args.progress,
    )
    print(f"{len(cases)} cases x {len(backends)} backends on {device}", file=sys.stderr)
    frame = run_cases(cases, config)
    meta = collect_meta(device, ["python -m harness", *sys.argv[1:]], ceilings)
    meta["case_files"] = sorted({c.file for c in cases})
    write_run(frame, meta, run_dir)
    print(summarize(frame))
    print(f"report: {run_dir / 'report.html'}")
    return exit_code(frame)


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

    print(rebuild_html(args.run_dir, baseline=args.baseline))
    return EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    from .compare import CompareOptions, compare_runs, format_comparison
    from .storage import load_run

    base, base_meta = load_run(args.base_run)
    new, new_meta = load_run(args.new_run)
    options = CompareOptions(
        min_effect=args.min_effect,
        alpha=args.alpha,
        correction=args.correction,
        error_factor=args.error_factor,
        allow_mismatch=args.allow_mismatch,
    )
    comparison = compare_runs(base, new, base_meta, new_meta, options)
    if args.confirm:
        from .confirm import confirm_slower

        comparison = confirm_slower(
            comparison, base_meta, new_meta, options, rounds=args.confirm_rounds, which=args.confirm
        )
    print(format_comparison(comparison, str(args.base_run), str(args.new_run), show_all=args.show_all))
    if args.html:
        from .report import write_compare_html

        print(
            f"page: {write_compare_html(comparison, args.html, (args.base_run, base_meta), (args.new_run, new_meta))}"
        )
    return comparison.exit_code


def cmd_history(args: argparse.Namespace) -> int:
    from .history import format_history, load_history, write_history_html

    history = load_history(args.runs or [Path("reports")], min_effect=args.min_effect, backends=args.backends)
    print(format_history(history))
    if args.html:
        print(f"page: {write_history_html(history, args.html)}")
    return EXIT_OK


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
    handler = {
        "run": cmd_run,
        "list": cmd_list,
        "report": cmd_report,
        "compare": cmd_compare,
        "history": cmd_history,
        "schema": cmd_schema,
    }
    try:
        return handler[args.verb](args)
    except (BadInput, CaseFileError, RunDirExistsError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted: nothing was written", file=sys.stderr)
        return 130
