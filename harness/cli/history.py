"""``harness history``: latency and error trends across runs (commits), per case and backend."""

import argparse
from pathlib import Path

from harness.cli.options import EXIT_OK, as_bad_input
from harness.review.history import format_history, load_history, write_history_html


def add_parser(verbs) -> None:
    history = verbs.add_parser("history", help="latency and error trends across runs (commits), per case and backend")
    history.add_argument("runs", nargs="*", type=Path, help="run folders, or folders of runs (default: reports/)")
    history.add_argument("--html", type=Path, metavar="FILE", help="also write an HTML page with plots")
    history.add_argument("--min-effect", type=float, dest="min_effect", help="as for compare")
    history.add_argument("--backend", action="append", dest="backends", metavar="NAME",
                         help="only this backend (repeatable)")  # fmt: skip
    history.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    with as_bad_input():  # no run folders where the user pointed
        history = load_history(args.runs or [Path("reports")], min_effect=args.min_effect, backends=args.backends)
    print(format_history(history))
    if args.html:
        print(f"page: {write_history_html(history, args.html)}")
    return EXIT_OK
