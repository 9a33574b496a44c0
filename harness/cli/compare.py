"""``harness compare BASE_RUN NEW_RUN``: what got worse (:mod:`harness.review.compare`), re-timed in paired rounds."""

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from harness.cli.options import BadInput, as_bad_input
from harness.review.compare import CompareOptions, compare_runs, format_comparison, load_runs, write_compare_html
from harness.review.confirm import DEFAULT_TIME_S, MIN_ROUNDS, ConfirmInputError, retime_or_mark


def add_parser(verbs) -> None:
    compare = verbs.add_parser(
        "compare", help="what got worse in NEW_RUN against BASE_RUN",
        description="Latency rows the two runs cannot separate, and rows they call slower, are re-timed by default "
        "in paired rounds: both commits' builds checked out into git worktrees and timed alternately, row by row "
        "(the time box and a progress bar are shown first; --no-confirm skips it).",
        epilog="Exit 0: nothing got worse and the comparison is complete; 1: something got worse (a slower latency "
        "confirmed in paired rounds, or any accuracy or status regression, which is never re-timed); 2: bad input "
        "(unreadable run, duplicated rows); 3: an internal error; 4: nothing got worse but the comparison is "
        "incomplete (rows on one side only, rows timed in one run only, device or torch/triton mismatch); 5: "
        "nothing is confirmed worse, but latency rows the two runs call slower could not be re-timed (no commit "
        "recorded, a dirty tree, a commit not in your history, a checkout that failed, a plugin not named with "
        "--plugin, or --no-confirm): they read 'unconfirmed', with the reason. 1 wins over 5, 5 over 4.",
    )  # fmt: skip
    compare.add_argument("base_run", type=Path)
    compare.add_argument("new_run", type=Path)
    add_arguments(compare)
    compare.set_defaults(handler=main)


def add_arguments(parser: argparse.ArgumentParser, *, plugin: bool = True) -> None:
    """The options of a comparison (``compare``'s and ``continuous``'s); ``plugin``: ``--plugin`` too."""
    parser.add_argument("--min-effect", "--latency-threshold", type=float, dest="min_effect",
                         help="smallest relative latency change that counts (default 0.10 on CPU rows, 0.03 on CUDA)")  # fmt: skip
    parser.add_argument("--alpha", type=float, default=0.05, help="significance level after correction (0.05)")
    parser.add_argument("--correction", choices=["bh", "holm", "none"], default="bh",
                        help="multiple-row p-value correction: Benjamini-Hochberg (default), Holm, none")  # fmt: skip
    parser.add_argument("--error-factor", type=float, default=2.0,
                        help="error / tol_ratio growth factor that counts (2.0)")  # fmt: skip
    parser.add_argument("--allow-mismatch", action="store_true",
                        help="a device or version mismatch does not change the exit code")  # fmt: skip
    parser.add_argument("--html", type=Path, metavar="FILE", help="also write the comparison as an HTML page")
    parser.add_argument("--all", action="store_true", dest="show_all", help="list every row, not only changes")
    parser.add_argument("--normalize-by", metavar="BACKEND", dest="normalize_by",
                        help="judge latencies relative to this unchanged backend (a peer) in the same run and case: "
                        "cancels a drift that moves every kernel alike, as between runs on different machines "
                        "(docs/review.md)")  # fmt: skip
    parser.add_argument("--confirm", nargs="?", const="unclear", choices=["slower", "unclear", "all"],
                         help="which rows are re-timed in paired rounds (the default re-times 'unclear': rows judged "
                         "slower or 'cannot tell'; 'slower'; 'all'); given, a commit that is not one of your history "
                         "or a plugin not named is bad input (exit 2) instead of leaving rows unconfirmed")  # fmt: skip
    parser.add_argument("--no-confirm", action="store_true", help="re-time nothing: latency rows the two runs call "
                        "slower read 'unconfirmed' and the exit code is 5")  # fmt: skip
    parser.add_argument("--confirm-rounds", type=int, default=32, help="most paired rounds (fresh process pairs) a "
                        "re-timed row gets; rows are judged after 9, 13, ... and stop once decided (32; at least 9)")  # fmt: skip
    parser.add_argument("--confirm-time", type=float, default=DEFAULT_TIME_S, metavar="SECONDS",
                        help="time box of the re-timing, planned: the first look's rounds get 2/3 of it, cheapest "
                        "rows first, later looks what is left, the cheapest decisions first; a row whose rounds do "
                        "not fit stays 'cannot tell' (900)")  # fmt: skip
    parser.add_argument("--json", nargs="?", const="-", metavar="FILE", help="also write the comparison as JSON to "
                        "FILE, or to stdout without FILE (the text then goes to stderr): the exit code, the "
                        "run-level problems and every row's sides, verdict, ratio, interval and why")  # fmt: skip
    if plugin:
        parser.add_argument("--plugin", action="append", dest="harness_plugins", default=[], metavar="MODULE_OR_PATH",
                            help="import this plugin in the re-timing workers (repeatable); a run's meta.json never "
                            "chooses code to import, so rows of a plugin's backend need its --plugin here")  # fmt: skip


def check(args: argparse.Namespace) -> None:
    """Bad input among the comparison's options, before any run is read."""
    if args.confirm and args.no_confirm:
        raise BadInput(f"--confirm {args.confirm} and --no-confirm: choose one")
    if not args.no_confirm and args.confirm_rounds < MIN_ROUNDS:
        raise BadInput(f"--confirm-rounds {args.confirm_rounds}: at least {MIN_ROUNDS} rounds are needed for a verdict "
                       f"(fewer paired rounds cannot exclude anything at the looks' confidence)")  # fmt: skip
    if args.json not in (None, "-") and Path(args.json).is_dir():
        raise BadInput(f"--json {args.json}: a folder; give a file to write, or no value for stdout")


def main(args: argparse.Namespace) -> int:
    check(args)
    return compare(args, args.base_run, args.new_run)


def compare(args: argparse.Namespace, base_run: Path, new_run: Path) -> int:
    """Compare two run folders as ``args`` say, re-time the doubtful rows, print; the exit code."""
    (base, base_meta), (new, new_meta) = load_runs(base_run, new_run)
    options = CompareOptions(**{field.name: getattr(args, field.name) for field in dataclasses.fields(CompareOptions)})
    comparison = compare_runs(base, new, base_meta, new_meta, options)
    if args.harness_plugins and not args.no_confirm:
        print("note: the paired re-timing imports the plugins beside the built-ins it times: a plugin there can "
              "reach their timing (docs/contract.md#threat-model); the runs themselves graded it in a worker",
              file=sys.stderr)  # fmt: skip
    with as_bad_input(ConfirmInputError):
        comparison = retime_or_mark(
            comparison, base_meta, new_meta, options, strict=args.confirm is not None,
            which=args.confirm or "unclear", skip="--no-confirm" if args.no_confirm else "",
            rounds=args.confirm_rounds, time_s=args.confirm_time, plugins=args.harness_plugins,
            sources=(str(base_run), str(new_run)),
            progress=True if sys.stderr.isatty() else None,  # a bar, or in a log a line a round
            log=lambda line: print(line, file=sys.stderr, flush=True),
        )  # fmt: skip
    text = format_comparison(comparison, str(base_run), str(new_run), show_all=args.show_all)
    print(text, file=sys.stderr if args.json == "-" else sys.stdout)
    if args.json:  # every row's columns but the sample lists, NaN as null
        rows = comparison.rows.drop(columns=[c for c in comparison.rows.columns if c.endswith("_samples_us")])
        record = {"base": str(base_run), "new": str(new_run), "exit_code": comparison.exit_code,
                  "incomplete": bool(comparison.incomplete), "problems": list(comparison.problems),
                  "rows": json.loads(rows.to_json(orient="records"))}  # fmt: skip
        document = json.dumps(record, indent=1, allow_nan=False)
        if args.json == "-":
            print(document)
        else:
            Path(args.json).write_text(document + "\n")
            print(f"json: {args.json}", file=sys.stderr)
    if args.html:
        page = write_compare_html(comparison, args.html, (base_run, base_meta), (new_run, new_meta))
        print(f"page: {page}", file=sys.stderr if args.json == "-" else sys.stdout)
    return comparison.exit_code
