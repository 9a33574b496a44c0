"""python -m harness {run,list,backends,variants,schema,report,compare,continuous,bisect,history,merge}"""

import argparse
import importlib
import os
import sys
import traceback

import kernels
from harness.backends.registry import UnnamedPluginError
from harness.cases.spec import CaseFileError
from harness.cli import options
from harness.results.environment import harness_version
from harness.results.journal import JournalError
from harness.results.storage import NotWritableError, RunDirExistsError, RunFolderError
from harness.review.compare import DuplicateRowsError
from harness.run.guard import Terminated, install_signal_handlers
from harness.run.oracle_cache import PoisonedCacheError

# In --help's order: the everyday verbs, what is there to run, the review of runs, the rest.
VERBS = ("run", "list", "backends", "variants", "schema", "report", "compare", "continuous", "bisect", "history",
         "merge")  # fmt: skip
# The errors of the user's input, each said in one line (exit 2); a ValueError from elsewhere is a bug (3).
BAD_INPUT = (options.BadInput, CaseFileError, RunDirExistsError, NotWritableError, RunFolderError, JournalError,
             DuplicateRowsError, PoisonedCacheError, UnnamedPluginError)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    prog = options.prog()
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__.split("\n")[0],
        epilog="exit codes: 0 success; 1 a failure, an error row, nothing graded, or (compare) a row that got worse; 2 "
        "bad input; 3 an internal error; 4 incomplete (compare, run --finalize); 5 (compare) nothing is confirmed "
        "worse, but some latency rows could not be re-timed (unconfirmed); 130 Ctrl-C; 143 SIGTERM. "
        f"With no verb: this help, exit 0. Run `{prog} VERB --help` for a verb's options.",
    )  # fmt: skip
    installed = harness_version() or "unknown (not installed)"  # run from a checkout that was never installed
    parser.add_argument("--version", action="version", version=f"%(prog)s {installed}")
    verbs = parser.add_subparsers(dest="verb", metavar="{" + ",".join(VERBS) + "}")
    for verb in VERBS:
        importlib.import_module(f"harness.cli.{verb}").add_parser(verbs)
    return parser


def console_main() -> None:
    sys.exit(main())


def main(argv: list[str] | None = None) -> int:
    kernels.use_interpreter_if_no_gpu()  # before anything imports Triton (see kernels.triton_paged)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verb is None:  # bare `harness`: what it can do, not argparse's "required: verb"
        parser.print_help()
        return options.EXIT_OK
    restore_signals = install_signal_handlers()
    try:
        code = args.handler(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's flush at exit
        return code
    except BAD_INPUT as error:
        print(f"error: {error}", file=sys.stderr)
        return options.EXIT_BAD_INPUT
    except (KeyboardInterrupt, Terminated) as stop:
        interrupted = isinstance(stop, KeyboardInterrupt)
        print(f"{'interrupted' if interrupted else 'terminated (SIGTERM)'}: nothing was written", file=sys.stderr)
        return options.EXIT_INTERRUPTED if interrupted else options.EXIT_TERMINATED
    except BrokenPipeError:  # `harness schema | head`: the reader left early; not a bug, and not a success
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit would raise again
        return options.EXIT_BROKEN_PIPE
    except Exception:
        traceback.print_exc()
        print("internal error: the traceback above is a bug in the harness, not in your input; please report it",
              file=sys.stderr)  # fmt: skip
        return options.EXIT_INTERNAL
    finally:
        restore_signals()
