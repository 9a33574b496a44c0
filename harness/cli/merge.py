"""``harness merge OUT RUN RUN...``: join run folders of one commit (hosts' ``--shard`` slices) into one."""

import argparse
import sys
from pathlib import Path

from harness.cli.options import BadInput, as_bad_input
from harness.cli.terminal import summarize
from harness.execute.shards import MergeError, merge_runs
from harness.results import report
from harness.results.storage import RunDirExistsError, write_run
from harness.run.runner import exit_code


def add_parser(verbs) -> None:
    merge = verbs.add_parser("merge", help="join run folders of one commit (hosts' --shard slices) into one run folder")
    merge.add_argument("out", type=Path, help="the run folder to create")
    merge.add_argument("runs", type=Path, nargs="+", metavar="RUN", help="run folders to join (two or more)")
    merge.add_argument("--allow-mixed-commits", action="store_true",
                       help="merge runs of different commits (meta.json's commit then lists them)")  # fmt: skip
    merge.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    if args.out.exists():
        raise BadInput(f"merge: {args.out} already exists; a run folder is never overwritten (choose another OUT)")
    with as_bad_input(MergeError):
        frame, meta, warnings = merge_runs(args.runs, args.allow_mixed_commits)
    flags = ["--allow-mixed-commits"] if args.allow_mixed_commits else []
    meta["command"] = " ".join(["harness merge", str(args.out), *map(str, args.runs), *flags])
    try:
        write_run(frame, meta, args.out, page=report.render_html)
    except RunDirExistsError as error:
        raise BadInput(f"merge: {error}") from None
    for warning in warnings:
        print(f"warning: {warning} (meta.json's incomplete says so)", file=sys.stderr)
    print(summarize(frame))
    print(f"merged {len(args.runs)} runs, {len(frame)} rows: {args.out / 'report.html'}")
    return exit_code(frame)
