"""``harness report RUN``: rebuild a run folder's report.html (marking regressions against a baseline)."""

import argparse
from pathlib import Path

from harness.cli.options import EXIT_OK
from harness.results.report import rebuild_html
from harness.results.storage import load_run
from harness.review.compare import regressions_of


def add_parser(verbs) -> None:
    report = verbs.add_parser("report", help="(re)build report.html of a run folder")
    report.add_argument("run_dir", type=Path)
    report.add_argument("--baseline", type=Path, metavar="BASE_RUN", help="mark and list regressions against this run")
    report.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    marks = regressions_of(*load_run(args.run_dir), load_run(args.baseline)) if args.baseline else None
    print(rebuild_html(args.run_dir, marks, str(args.baseline or "")))
    return EXIT_OK
