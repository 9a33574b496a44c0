"""python -m harness {run,list,report,compare,history,merge,schema,variants}

Exit codes:

* 0   every graded row within tolerance, something was graded, and every backend named
      with --backend ran (graded or errored) on at least one case
* 1   a tolerance failure or an error row (a backend that raised, exited, crashed or
      timed out); nothing graded (every row a skip); a --backend that ran on no case;
      for compare, a row that got worse
* 2   bad input, refused before any work with one message naming file, case and field,
      and nothing written: a case file, an argument, a plugin that does not import (or
      exits or crashes on import), an output folder that cannot be created or written,
      a stored run folder that is not one (or whose meta.json or results.parquet does not fit
      its schema: harness.results.schemas), an oracle cache entry that differs from its recomputation
      under --verify-oracle-cache
* 3   internal error: a bug in the harness (the traceback is printed, with a line saying
      so), or the final write of the run folder failed (the journal is kept, and the
      message gives the --resume command that finishes the run)
* 4   incomplete. compare: nothing got worse, but the comparison is incomplete (cases or
      backends on one side only, a status turned skip, rows timed in one run only
      (--no-timing), another device or versions); run --finalize: the rows written pass,
      but (case, backend) pairs never ran
* 5   compare only: nothing is confirmed worse, but latency rows the two runs alone call
      slower could not be re-timed in paired rounds (no commit recorded, a dirty tree, a
      commit not in your history, a checkout that failed, a plugin not named with --plugin,
      or --no-confirm): each such
      row reads "unconfirmed" with the reason. Worse rows (1) win over 5, 5 over 4
* 130 interrupted by Ctrl-C; 143 terminated by SIGTERM: the rows so far are kept in the
      journal, and the message gives the --resume command

Only the harness's own input errors are exit 2: a ValueError from anywhere else is an
internal error (exit 3), never "bad input".

``harness`` with no verb prints this help and exits 0; ``harness --version`` the version.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

import kernels
from harness.backends.builtin import REGISTRY, load_plugin, resolve_backends
from harness.backends.registry import UnnamedPluginError, add_remote_backend, plugin_key, require_plugins
from harness.cases.loading import load_cases
from harness.cases.packaged import packaged_suites, resolve_case_arg
from harness.cases.spec import CaseFileError, case_file_schema, check_backend_names, load_case_file, resolve_case_paths
from harness.cases.variants import variants_text
from harness.cases.vocab import GRADED
from harness.execute.plan import add_arguments as add_scale_arguments
from harness.execute.plan import check_arguments as check_scale_arguments
from harness.execute.plan import run_rows
from harness.execute.processes import DEFAULT_TIMEOUT_S, PluginImportError, Worker
from harness.execute.ray_cluster import LOCAL as RAY_LOCAL
from harness.execute.shards import MergeError, merge_runs, parse_shard, shard_cases
from harness.results import report
from harness.results.environment import collect_meta
from harness.results.journal import Journal, JournalError, journal_path, pid_alive
from harness.results.report import rebuild_html
from harness.results.storage import (
    NotWritableError,
    RunDirExistsError,
    RunFolderError,
    load_run,
    reserve_run,
    stale_leftovers,
    write_run,
)
from harness.review.compare import (
    EXIT_INCOMPLETE,
    CompareOptions,
    DuplicateRowsError,
    compare_runs,
    format_comparison,
    load_runs,
    regressions_of,
    write_compare_html,
)
from harness.review.confirm import DEFAULT_TIME_S, MIN_ROUNDS, ConfirmInputError, retime_or_mark
from harness.review.history import format_history, load_history, write_history_html
from harness.run import oracle_cache
from harness.run.guard import Terminated, install_signal_handlers, raised_by_backend
from harness.run.options import DEFAULT_CASES, add_to_argparse, apply_threads, default_device
from harness.run.oracle_cache import PoisonedCacheError
from harness.run.profiling import profile_pairs, selected
from harness.run.runner import COLUMNS, RunConfig, exit_code, summarize, to_frame, verdict_lines
from harness.timing.ceilings import measure_ceilings, mixed_models_note

EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_INTERRUPTED, EXIT_BROKEN_PIPE, EXIT_TERMINATED = 130, 141, 143  # 128 + SIGINT, SIGPIPE, SIGTERM


class BadInput(Exception):
    """An argument or input the user must fix; printed as one message, exit code 2."""


def _prog() -> str:
    """How the user called us: the console script ``harness``, else ``python -m harness`` (for --help and meta.json)."""
    return "harness" if Path(sys.argv[0]).name == "harness" else "python -m harness"


def build_parser() -> argparse.ArgumentParser:
    prog = _prog()
    parser = argparse.ArgumentParser(
        prog=prog,
        description=__doc__.split("\n")[0],
        epilog="exit codes: 0 success; 1 a failure, an error row, nothing graded, or (compare) a row that got "
        "worse; 2 bad input; 3 an internal error; 4 incomplete (compare, run --finalize); 5 (compare) nothing is confirmed worse, "
        "but some latency rows could not be re-timed (unconfirmed); 130 Ctrl-C; 143 SIGTERM. "
        f"With no verb: this help, exit 0. Run `{prog} VERB --help` for a verb's options.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    verbs = parser.add_subparsers(dest="verb", metavar="{run,list,report,compare,history,merge,schema,variants}")

    run = verbs.add_parser("run", help="run cases through backends; write a report folder")
    run.add_argument(
        "cases",
        nargs="*",
        help="case files or folders, or a packaged suite's name (smoke, cpu, gpu, gpu_peers, gpu_long, gpu_sweep, "
        "variants); default: smoke",
    )
    oracle = run.add_argument_group("oracle and inputs")
    reliability = run.add_argument_group("interrupted runs, isolation and time limits")
    add_to_argparse(run, advanced=oracle)
    run.add_argument("--out", type=Path, help="run folder to create (default: reports/<time>-<device>-<commit>)")
    run.add_argument("--no-timing", dest="timing", action="store_false", help="grade only; do not time")
    run.add_argument("--no-progress", dest="progress", action="store_false", default=None,
                     help="a line a row instead of the progress bar (the default where stderr is not a terminal: "
                     "a log or CI gets lines, not a bar redrawn with carriage returns)")  # fmt: skip
    reliability.add_argument(
        "--profile", action="append", default=[], metavar="CASE[:BACKEND]",
        help="save a torch.profiler Chrome trace of these rows under RUN/profiles/ (globs; repeatable)",
    )  # fmt: skip
    reliability.add_argument(
        "--isolate",
        choices=["plugins", "all", "none"],
        help="backends run in a worker process that may crash or hang without ending the run "
        "(default: plugins; 'all' adds the built-ins, 'none' runs everything in-process)",
    )
    reliability.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="time limit of one isolated (or --workers) row, grade and timing; a backend past it is hung: its later "
        "rows are skips (default: the row's expected cost x10, at least 60 s; a case's timeout_s wins)",
    )
    reliability.add_argument(
        "--resume",
        type=Path,
        metavar="RUN_DIR",
        help="finish a killed or unwritten run from its journal RUN_DIR.journal.jsonl, with its options. Options "
        "that change no result win when given again here: --timeout, --isolate, --workers/--ray (those given replace "
        "both; a Ray cluster's address must be given again), --profile, --no-progress. Options that would change which rows run or what they measure (cases, "
        "--backend, --tag, --device, --oracle-device, --no-timing, --threads, --shard, --out) are refused unless "
        "equal to the journal's. Plugins are imported only when named here: pass each --plugin the run used",
    )
    reliability.add_argument(
        "--finalize",
        action="store_true",
        help="with --resume: run nothing, write the run folder from the journal's rows alone (a run whose "
        "machine is gone); meta.json says it is incomplete and which (case, backend) pairs never ran; "
        "INCOMPLETE and exit 4 where some never ran (or which ran is not known here) and the rest pass",
    )
    add_scale_arguments(run)  # --workers, --ray, --oracle-cache

    listing = verbs.add_parser("list", help="the expanded cases, as a table")
    listing.add_argument("cases", nargs="*")
    listing.add_argument("--tag", action="append", dest="harness_tags", help="only cases with this tag")

    report = verbs.add_parser("report", help="(re)build report.html of a run folder")
    report.add_argument("run_dir", type=Path)
    report.add_argument("--baseline", type=Path, metavar="BASE_RUN", help="mark and list regressions against this run")

    compare = verbs.add_parser(
        "compare",
        help="what got worse in NEW_RUN against BASE_RUN",
        description="Latency rows the two runs cannot separate, and rows they call slower, are re-timed by default "
        "in paired rounds: both commits' builds checked out into git worktrees and timed alternately, row by row "
        "(the time box and a progress bar are shown first; --no-confirm skips it).",
        epilog="Exit 0: nothing got worse and the comparison is complete; 1: something got worse (a slower latency "
        "confirmed in paired rounds, or any accuracy or status regression, which is never re-timed); 2: bad input "
        "(unreadable run, duplicated rows); 3: an internal error; 4: nothing got worse but the comparison is "
        "incomplete (rows on one side only, rows timed in one run only, device or torch/triton mismatch); 5: nothing "
        "is confirmed worse, but latency rows the two runs call slower could not be re-timed (no commit recorded, a "
        "dirty tree, a commit not in your history, a checkout that failed, a plugin not named with --plugin, or --no-confirm): they read "
        "'unconfirmed', with the reason. 1 wins over 5, 5 over 4.",
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
    compare.add_argument(
        "--normalize-by", metavar="BACKEND", dest="normalize_by",
        help="judge latencies relative to this unchanged backend (a peer) in the same run and case: cancels a "
        "drift that moves every kernel alike, as between runs on different machines (docs/review.md)",
    )  # fmt: skip
    compare.add_argument("--confirm", nargs="?", const="unclear", choices=["slower", "unclear", "all"],
                         help="which rows are re-timed in paired rounds (the default re-times 'unclear': rows judged "
                         "slower or 'cannot tell'; 'slower'; 'all'); given, a commit that is not one of your history "
                         "or a plugin not named is bad input (exit 2) instead of leaving rows unconfirmed")  # fmt: skip
    compare.add_argument(
        "--no-confirm", action="store_true",
        help="re-time nothing: latency rows the two runs call slower read 'unconfirmed' and the exit code is 5",
    )  # fmt: skip
    compare.add_argument(
        "--plugin", action="append", dest="harness_plugins", default=[], metavar="MODULE_OR_PATH",
        help="import this plugin in the re-timing workers (repeatable); a run's meta.json never "
        "chooses code to import, so rows of a plugin's backend need its --plugin here",
    )  # fmt: skip
    compare.add_argument(
        "--confirm-rounds", type=int, default=32,
        help="most paired rounds (fresh process pairs) a re-timed row gets; rows are judged after 9, 13, ... "
        "and stop once decided (32; at least 9)",
    )  # fmt: skip
    compare.add_argument(
        "--confirm-time", type=float, default=DEFAULT_TIME_S, metavar="SECONDS",
        help="time box of the re-timing, planned: the first look's rounds get 2/3 of it, cheapest rows first, later looks "
        "what is left, the cheapest decisions first; a row whose rounds do not fit stays 'cannot tell' (900)",
    )  # fmt: skip

    history = verbs.add_parser("history", help="latency and error trends across runs (commits), per case and backend")
    history.add_argument("runs", nargs="*", type=Path, help="run folders, or folders of runs (default: reports/)")
    history.add_argument("--html", type=Path, metavar="FILE", help="also write an HTML page with plots")
    history.add_argument("--min-effect", type=float, dest="min_effect", help="as for compare")
    history.add_argument(
        "--backend", action="append", dest="backends", metavar="NAME", help="only this backend (repeatable)"
    )

    merge = verbs.add_parser("merge", help="join run folders of one commit (hosts' --shard slices) into one run folder")
    merge.add_argument("out", type=Path, help="the run folder to create")
    merge.add_argument("runs", type=Path, nargs="+", metavar="RUN", help="run folders to join (two or more)")
    merge.add_argument("--allow-mixed-commits", action="store_true",
                       help="merge runs of different commits (meta.json's commit then lists them)")  # fmt: skip
    verbs.add_parser("schema", help="JSON Schema of the case files")
    verbs.add_parser("variants", help="the attention variants: case field, capability, the keywords a kernel receives")
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("paged-attention-harness")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def _resolved_cases(cases: list[str]) -> list:
    """Case arguments as paths (a packaged suite's name resolved); a name that is neither is bad input."""
    resolved = [resolve_case_arg(c) for c in cases]
    for given, found in zip(cases, resolved, strict=True):
        if not Path(found).exists():
            raise BadInput(
                f"{given}: no such case file or folder, and not a packaged suite "
                f"(packaged suites: {', '.join(packaged_suites())})"
            )
    return resolved


def _load(cases: list[str], device: str, tags: list[str] | None, backends: list[str] | None = None):
    cases = _resolved_cases(cases) or DEFAULT_CASES
    loaded = load_cases(cases, device=device, tags=tags, backends=backends)
    if not loaded:
        raise BadInput(f"no cases selected from {' '.join(cases)}" + (f" with tags {tags}" if tags else ""))
    return loaded


def _load_plugins(plugins: list[str], isolate: str):
    """Start the run's worker and import the plugins there (a plugin that exits or crashes on import is
    bad input, not the end of the run), and register their backends here from what the worker reports:
    this process never imports a plugin. With ``--isolate none`` they are imported here instead (and
    the run says what that gives up). The backend names they added, and the started worker (None when
    nothing is isolated)."""
    worker = None
    before = set(REGISTRY)
    if isolate == "all" or (plugins and isolate == "plugins"):
        worker = Worker(tuple(plugins), torch.get_num_threads())  # the run's threads, as apply_threads set them
        try:
            worker.start()
        except PluginImportError as error:
            raise BadInput(f"--plugin {error}") from None
        for registration in worker.backends:
            try:
                add_remote_backend(registration)
            except ValueError as error:
                worker.stop()
                raise BadInput(f"--plugin {', '.join(plugins)}: {error}") from None
        if plugins and worker.walls:
            os.environ[oracle_cache.ENV_DIR] = "off"  # the worker could reach the cache: the run does without it
            print(
                f"note: the plugins' worker could not wall off the oracle cache ({worker.walls}); this run "
                "computes every oracle and leaves the cache alone",
                file=sys.stderr,
            )
        if plugins and isolate == "all":
            print(
                "note: --isolate all runs the built-ins in the plugins' worker, beside them: a plugin there can "
                "reach their rows (docs/contract.md#threat-model)",
                file=sys.stderr,
            )
        return set(REGISTRY) - before, worker
    for plugin in plugins:
        try:
            load_plugin(plugin)
        except ValueError as error:
            raise BadInput(str(error)) from None
        except BaseException as error:  # SystemExit or a KeyboardInterrupt raised by the module
            if not raised_by_backend(error):
                raise
            raise BadInput(f"--plugin {plugin}: importing it raised {type(error).__name__}({error})") from None
    if plugins:
        print(
            "note: --isolate none imports the plugins into the process that grades them: a plugin can reach "
            "its own verdict (docs/contract.md#threat-model)",
            file=sys.stderr,
        )
    return set(REGISTRY) - before, worker


def _run_options(args: argparse.Namespace, device: str) -> dict:
    """What the journal keeps so that --resume runs the same thing (paths made absolute)."""

    def absolute(path: str) -> str:
        return str(Path(path).resolve()) if Path(path).exists() else path

    return {
        "cases": [absolute(c) for c in (args.cases or DEFAULT_CASES)],
        "backends": args.harness_backends,
        "device": device,
        "plugins": [absolute(p) for p in args.harness_plugins],
        "tags": args.harness_tags,
        "oracle_device": args.harness_oracle_device,
        "timing": args.timing,
        "isolate": args.isolate,
        "timeout": args.timeout,
        "workers": args.workers,  # --workers / --ray: a resume runs the rest the same way (harness.execute.plan)
        "ray": args.ray,
        "shard": args.shard,
    }


# What --resume does with an option given again (the --resume help says the same): these change
# which rows run or what they measure, so a value other than the journal's is refused; --timeout,
# --isolate, --workers/--ray, --profile and --no-progress change no result, and the value given wins.
_RESULT_OPTIONS = {  # args attribute -> (flag, journal options key)
    "harness_device": ("--device", "device"),
    "harness_tags": ("--tag", "tags"),
    "harness_oracle_device": ("--oracle-device", "oracle_device"),
}


def _resume(args: argparse.Namespace):
    """The journal of --resume RUN_DIR, locked by this process, with args set to the stored options."""
    run_dir = args.resume
    if args.cases or args.harness_backends or args.out or args.shard is not None:
        raise BadInput("--resume runs the journal's own cases, backends and --shard; give none of them, nor --out")
    if run_dir.exists():
        raise BadInput(f"--resume {run_dir}: the run folder already exists: that run is complete")
    journal = Journal.read(journal_path(run_dir))
    for warning in journal.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    options = journal.header.get("options", {})
    for attribute, (flag, key) in _RESULT_OPTIONS.items():
        given = getattr(args, attribute)
        if given is not None and given != options.get(key):
            raise BadInput(f"--resume {run_dir}: {flag} {given} differs from the run's {options.get(key)}; "
                           f"a resumed run measures what it started with (give no {flag})")  # fmt: skip
    if not args.timing and options.get("timing", True):
        raise BadInput(f"--resume {run_dir}: --no-timing differs from the run, which times its rows")
    threads = (journal.header.get("meta") or {}).get("timing_threads")
    if args.harness_threads is not None and threads is not None and args.harness_threads != str(threads):
        raise BadInput(f"--resume {run_dir}: --threads {args.harness_threads} differs from the run's {threads}")
    if not args.finalize:  # --finalize imports nothing, runs nothing and sends nothing anywhere
        require_plugins(options.get("plugins", []), args.harness_plugins, f"the journal {journal.path}")
        extra = {plugin_key(p) for p in args.harness_plugins} - {plugin_key(p) for p in options.get("plugins", [])}
        if extra:
            raise BadInput(f"--resume {run_dir}: --plugin {', '.join(sorted(extra))}: the run did not use it; "
                           "a resumed run runs its own backends")  # fmt: skip
        ray = options.get("ray")
        if args.workers is None and args.ray is None and ray not in (None, RAY_LOCAL):  # a journal is data: it
            # never chooses where cases go and rows come from
            raise BadInput(f"--resume {run_dir}: the run sent its cases to the Ray cluster at {ray}; "
                           f"name it again to send the rest there (--ray {ray}), or give --ray or --workers")  # fmt: skip
    logs = _staged_logs(run_dir)
    if logs.is_symlink() or (logs.exists() and not logs.is_dir()):
        raise BadInput(f"--resume {run_dir}: {logs} is not the run's log folder (a link or a file); move it away")
    last_pid = journal.header.get("last_pid")
    if last_pid != os.getpid() and pid_alive(last_pid):  # this process's own pid: an earlier resume of it here
        raise BadInput(f"--resume {run_dir}: process {last_pid} is still writing it")
    journal.lock()  # held until the run folder is written or the run stops: a second resume is refused
    args.cases = options.get("cases", [])
    args.harness_backends = options.get("backends")
    args.harness_device = options.get("device")
    args.harness_plugins = options.get("plugins", [])
    args.harness_tags = options.get("tags")
    args.harness_oracle_device = options.get("oracle_device")
    args.timing = options.get("timing", True)
    args.isolate = args.isolate or options.get("isolate")
    if args.timeout is None:
        args.timeout = options.get("timeout")
    if args.harness_threads is None and threads is not None:
        args.harness_threads = str(threads)
    args.shard = options.get("shard")  # the same slice of the cases, always
    if args.workers is None and args.ray is None:  # given on the resume, they replace the journal's
        args.workers, args.ray = options.get("workers"), options.get("ray")
    args.out = run_dir
    return journal


def _finalize(args: argparse.Namespace, journal) -> int:
    """Write a stopped run's folder from its journal without running anything (``--finalize``).

    The meta is the one the run recorded at its start (device, versions, commit, ceilings),
    or, for a journal older than that record, only what the header holds; never this
    machine's. Pairs that never ran are absent from the rows and listed in meta.json.
    """
    if not journal.rows:
        raise BadInput(f"--finalize {args.resume}: the journal holds no row; there is nothing to write")
    try:  # the journal's case files and backends, to list what never ran (a journal from another
        # machine may name files or plugin backends this one lacks: the rows are written anyway)
        paths = resolve_case_paths([resolve_case_arg(c) for c in args.cases] or DEFAULT_CASES)  # suite names too
        cases = [case for path in paths for case in load_case_file(path)]
        cases = [c for c in cases if not args.harness_tags or set(args.harness_tags) & set(c.tags)]
        if args.shard is not None:  # only this run's slice could have run
            cases = shard_cases(cases, *parse_shard(args.shard))
        backends = resolve_backends(args.harness_backends)
        unknown = None
    except (CaseFileError, ValueError, OSError) as error:
        cases, backends, unknown = [], [], f"the pairs that never ran are not known here: {error}"
    done = journal.done()
    missing = [f"{c.id} {b.name}" for c in cases for b in backends if (c.id, b.name) not in done]
    frame = _ordered(to_frame(journal.rows), cases, backends, COLUMNS)
    header = journal.header
    meta = dict(header.get("meta") or {"device": header.get("options", {}).get("device"), "host": header.get("host")})
    meta["incomplete"] = {
        "finalized_from_journal": True,
        "started": header.get("started"),
        "rows": len(frame),
        "missing_pairs": len(missing),
        "missing": missing,
        "note": "the run stopped before these (case, backend) pairs ran; the folder was written from its journal",
    }
    if unknown:
        meta["incomplete"].update(missing_pairs=None, missing=None, missing_unknown=unknown)
    if header.get("meta") is None:
        meta["incomplete"]["meta_unknown"] = (
            "the journal predates the recorded meta: device, versions and ceilings are not known here"
        )
    write_run(frame, meta, args.resume, page=report.render_html)
    journal.remove()
    if _staged_logs(args.resume).is_dir():  # plugin rows' output of the stopped run, kept with its folder
        os.replace(_staged_logs(args.resume), Path(args.resume) / "logs")
    print(summarize(frame))
    print(f"incomplete: {unknown}" if unknown else
          f"incomplete: {len(missing)} (case, backend) pairs never ran (meta.json lists them)", file=sys.stderr)  # fmt: skip
    print(f"report: {Path(args.resume) / 'report.html'}")
    code, messages = verdict(frame, None)
    if code == 0 and (missing or unknown):  # what ran passes, but not all of the run ran
        code = EXIT_INCOMPLETE
    for message in messages:
        print(message, file=sys.stderr)
    sys.stderr.flush()
    print(verdict_lines(frame, code))
    return code


def verdict(frame, requested: list[str] | None) -> tuple[int, list[str]]:
    """The exit code of a finished run and the messages that explain a non-zero one."""
    code, messages = exit_code(frame), []
    status = frame["status"]
    if not status.isin(GRADED).any():
        code = EXIT_FAIL
        messages.append(
            f"error: nothing was graded: {int((status == 'skip').sum())} skip and "
            f"{int((status == 'error').sum())} error rows; a run that grades nothing is not a success"
        )
    for name in dict.fromkeys(requested or []):
        mine = frame[frame["backend"] == name]
        if not mine["status"].isin([*GRADED, "error"]).any():
            code = EXIT_FAIL
            why = mine["reason"].iloc[0] if len(mine) else "no case selected it"
            messages.append(f"error: --backend {name} ran on no case (every row a skip): {why}")
    return code, messages


def cmd_run(args: argparse.Namespace) -> int:
    if args.finalize and not args.resume:
        raise BadInput("--finalize needs --resume RUN_DIR: it writes that run's folder from its journal")
    journal = _resume(args) if args.resume else None
    args.isolate = args.isolate or "plugins"
    try:
        if args.finalize:
            return _finalize(args, journal)
        return _checked_run(args, journal)
    except BaseException:
        if journal is not None:  # a resume refused after taking the lock: let it go, say nobody writes it
            journal.close(stopped=True)
        raise


def _checked_run(args: argparse.Namespace, journal) -> int:
    """Check the device, threads, timeout and scale options, import the plugins, then run."""
    device = args.harness_device or default_device()
    if args.progress is None:
        args.progress = sys.stderr.isatty()
    if device == "cuda" and not torch.cuda.is_available():
        raise BadInput("--device cuda: no CUDA device is visible to torch")
    try:
        apply_threads(args.harness_threads, device)
    except ValueError as error:
        raise BadInput(str(error)) from None
    if args.timeout is not None and not args.timeout > 0:
        raise BadInput(f"--timeout {args.timeout:g}: must be a positive number of seconds")
    try:
        check_scale_arguments(args)  # --workers, --ray, --oracle-cache (harness.execute.plan)
    except ValueError as error:
        raise BadInput(str(error)) from None
    plugin_backends, worker = _load_plugins(args.harness_plugins, args.isolate)
    if plugin_backends and (args.workers is not None or args.ray is not None):
        print("note: with --workers or --ray each worker imports the plugins beside the oracle and the grading: "
              "a plugin there can reach its own verdict; a run without them keeps it out (docs/contract.md#threat-model)",
              file=sys.stderr)  # fmt: skip
    try:
        return _run(args, device, journal, plugin_backends, worker)
    finally:
        if worker is not None:
            worker.stop()


def _run(args: argparse.Namespace, device: str, journal, plugin_backends: set[str], worker) -> int:
    """Validate cases and backends, reserve the run folder (its journal), then run and write."""
    try:
        backends = resolve_backends(args.harness_backends)
    except ValueError as error:
        raise BadInput(str(error)) from None
    cases = _load(args.cases, device, args.harness_tags, [b.name for b in backends])
    check_backend_names(cases, list(REGISTRY))
    if args.shard is not None:
        cases = shard_cases(cases, *parse_shard(args.shard))
        if not cases:
            raise BadInput(f"--shard {args.shard}: this slice holds no case (fewer cases than shards)")
        print(f"--shard {args.shard}: {len(cases)} of the cases", file=sys.stderr)
    reports_root = args.out.parent if args.out else Path("reports")
    for message in stale_leftovers(reports_root):
        print(message, file=sys.stderr)
    if journal is None:
        run_dir, journal = reserve_run(args.out, reports_root, device, _run_options(args, device))
    else:
        run_dir = args.out
        journal.reopen()
    resume_hint = f"python -m harness run --resume {run_dir}"
    try:
        return _run_and_write(args, device, cases, backends, plugin_backends, worker, journal, run_dir, resume_hint)
    except (KeyboardInterrupt, Terminated) as stop:  # the rows so far stay in the journal
        journal.close(stopped=True)
        what = "interrupted" if isinstance(stop, KeyboardInterrupt) else "terminated (SIGTERM)"
        print(f"{what}: {len(journal.rows)} rows kept in {journal.path}; finish with: {resume_hint}", file=sys.stderr)
        return EXIT_INTERRUPTED if isinstance(stop, KeyboardInterrupt) else EXIT_TERMINATED
    except BaseException:
        journal.close(stopped=True)
        print(f"the {len(journal.rows)} rows so far are kept in {journal.path}; after a fix: {resume_hint}",
              file=sys.stderr)  # fmt: skip
        raise


def _run_and_write(args, device, cases, backends, plugin_backends, worker, journal, run_dir, resume_hint) -> int:
    """Time the ceiling, run what the journal lacks, write the folder, drop the journal; the exit code."""
    threads = torch.get_num_threads()  # as cmd_run set it (--threads)
    to_profile = selected(cases, backends, args.profile)
    dtypes = tuple(sorted({c.dtype for c in cases}))
    # Sharded on CUDA, every worker measures its own GPU's ceilings as it starts (harness.timing.ceilings.own_device)
    # and its rows are judged against them: the driver measuring GPU 0 as well cost 2-3 s (CUDA start and the
    # read, copy and matmul timings) before any worker started. meta.json's ``ceilings`` are then the first GPU's.
    sharded_cuda = device == "cuda" and (getattr(args, "workers", None) or getattr(args, "ray", None)) is not None
    ceilings = measure_ceilings(device, list(dtypes)) if args.timing and not sharded_cuda else {}
    isolated = {"plugins": plugin_backends, "all": {b.name for b in backends}, "none": set()}[args.isolate]
    config = RunConfig(
        device=device,
        backends=backends,
        timing=args.timing,
        oracle_device=args.harness_oracle_device or "cpu",
        ceilings=ceilings,
        ceiling_dtypes=dtypes,
        progress=args.progress,
        isolated=frozenset(isolated),
        plugins=tuple(args.harness_plugins),
        timeout_s=args.timeout,
        threads=threads,
        logs=(str(_staged_logs(run_dir)), str(run_dir / "logs")),
    )
    printer = None if args.progress else _row_printer()

    journal_s = 0.0

    def on_row(row: dict) -> None:
        nonlocal journal_s
        started = time.perf_counter()
        journal.append(row)
        journal_s += time.perf_counter() - started
        if printer:
            printer(row)

    done = journal.done()
    todo = sum((c.id, b.name) not in done for c in cases for b in backends)
    if journal.header.get("meta") is None:  # what a --finalize elsewhere reports as the run's own meta
        start_meta = collect_meta(device, [_prog(), *sys.argv[1:]], {}, oracle_cache.meta_record())
        journal.record_meta({**start_meta, "ceilings": ceilings, "timing_threads": threads, "shard": args.shard})
    print(f"{len(cases)} cases x {len(backends)} backends on {device}"
          + (f": {todo} to run, {len(done)} from the journal" if done else ""), file=sys.stderr)  # fmt: skip
    scale = run_rows(args, cases, config, on_row, done, worker)  # in this process, over --workers, or --ray
    merging = time.perf_counter()
    if sharded_cuda and args.timing and scale.get("gpus"):
        ceilings = scale["gpus"][0].get("ceilings") or {}  # the first GPU's, as its worker measured them
    frame = _ordered(to_frame(journal.rows), cases, backends, COLUMNS)
    scale.update(journal_s=round(journal_s, 3), merge_s=round(time.perf_counter() - merging, 3), rows=len(frame))
    bandwidth = {k: v for k, v in ceilings.items() if k.endswith("_gbps")}
    meta = collect_meta(device, [_prog(), *sys.argv[1:]], bandwidth, oracle_cache.meta_record())
    meta.update(case_files=sorted({c.file for c in cases}), ceilings=ceilings, timing_threads=threads, shard=args.shard)
    meta.update(gpus=scale.pop("gpus"), scale=scale)  # each GPU's ceilings; where the run's time went
    if note := mixed_models_note(meta["gpus"]):
        meta["device_name"] = note  # shown by the report, and `compare` calls it another device
        print(f"warning: {note}", file=sys.stderr)
    if args.resume:
        meta["resumed"] = {"journal_rows": len(done), "started": journal.header.get("started")}
    try:
        write_run(frame, meta, run_dir, page=report.render_html)
    except OSError as error:
        journal.close(stopped=True)
        print(f"error: writing the run folder {run_dir} failed: {error}\n"
              f"the {len(journal.rows)} rows are kept in {journal.path}; once there is room, finish with: "
              f"{resume_hint}", file=sys.stderr)  # fmt: skip
        return EXIT_INTERNAL
    journal.remove()
    if _staged_logs(run_dir).is_dir():  # the plugin rows' output, beside the run until its folder exists
        os.replace(_staged_logs(run_dir), run_dir / "logs")
    if to_profile:
        _profile(to_profile, config, worker, run_dir / "profiles")
    print(summarize(frame))
    print(f"report: {run_dir / 'report.html'}")
    code, messages = verdict(frame, args.harness_backends)
    for message in messages:
        print(message, file=sys.stderr)
    sys.stderr.flush()
    print(verdict_lines(frame, code))  # the last word: PASS or FAIL with the counts, then why rows skipped
    return code


def _staged_logs(run_dir: Path) -> Path:
    """Where plugin rows' output files are written while the run runs (``<run>.logs``, moved to ``<run>/logs``)."""
    return run_dir.with_name(run_dir.name + ".logs")


def _profile(pairs, config, worker, folder: Path) -> None:
    """--profile's traces: an isolated backend's in a worker process (it may exit or crash there, as
    in its rows), the others in this process. A trace that cannot be made is a line on stderr."""
    own = worker is None
    try:
        for case, backend in pairs:
            if backend.name in config.isolated:
                if worker is None:
                    worker = Worker(config.plugins, config.threads)
                limit = case.timeout_s or config.timeout_s or DEFAULT_TIMEOUT_S
                result = worker.profile(case, backend.name, config, folder, limit)
                if isinstance(result, str):
                    print(f"profile: {case.id}:{backend.name} failed: {result}", file=sys.stderr)
                    continue
                paths = result
            else:
                paths = profile_pairs([(case, backend)], config.device, config.oracle_device, folder)
            for path in paths:
                print(f"profile: {path}")
    finally:
        if own and worker is not None:
            worker.stop()


def _ordered(frame, cases, backends, columns):
    """Rows in case order, then backend order (a resumed run's journal mixes two runs)."""
    case_rank = {c.id: i for i, c in enumerate(cases)}
    backend_rank = {b.name: i for i, b in enumerate(backends)}
    key = frame["case"].map(case_rank).fillna(len(case_rank)) * (len(backend_rank) + 1) + frame["backend"].map(
        backend_rank
    ).fillna(len(backend_rank))
    return frame.iloc[key.argsort(kind="stable")].reset_index(drop=True)[columns]


def _row_printer():
    """on_row for runs without a progress bar (logs, CI): one line a row as it finishes, with the time so far."""
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
    marks = None
    if args.baseline:
        marks = regressions_of(*load_run(args.run_dir), load_run(args.baseline))
    print(rebuild_html(args.run_dir, marks, str(args.baseline or "")))
    return EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    if args.confirm and args.no_confirm:
        raise BadInput(f"--confirm {args.confirm} and --no-confirm: choose one")
    if not args.no_confirm and args.confirm_rounds < MIN_ROUNDS:
        raise BadInput(
            f"--confirm-rounds {args.confirm_rounds}: at least {MIN_ROUNDS} rounds are needed for a verdict "
            f"(fewer paired rounds cannot exclude anything at the looks' confidence)"
        )
    (base, base_meta), (new, new_meta) = load_runs(args.base_run, args.new_run)
    options = CompareOptions(
        min_effect=args.min_effect,
        alpha=args.alpha,
        correction=args.correction,
        error_factor=args.error_factor,
        allow_mismatch=args.allow_mismatch,
        normalize_by=args.normalize_by,
    )
    comparison = compare_runs(base, new, base_meta, new_meta, options)
    if args.harness_plugins and not args.no_confirm:
        print("note: the paired re-timing imports the plugins beside the built-ins it times: a plugin there can "
              "reach their timing (docs/contract.md#threat-model); the runs themselves graded it in a worker",
              file=sys.stderr)  # fmt: skip
    try:
        comparison = retime_or_mark(
            comparison,
            base_meta,
            new_meta,
            options,
            strict=args.confirm is not None,
            which=args.confirm or "unclear",
            skip="--no-confirm" if args.no_confirm else "",
            rounds=args.confirm_rounds,
            time_s=args.confirm_time,
            plugins=args.harness_plugins,
            sources=(str(args.base_run), str(args.new_run)),
            progress=True if sys.stderr.isatty() else None,  # a bar, or in a log a line a round
            log=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except ConfirmInputError as error:
        raise BadInput(str(error)) from None
    print(format_comparison(comparison, str(args.base_run), str(args.new_run), show_all=args.show_all))
    if args.html:
        print(
            f"page: {write_compare_html(comparison, args.html, (args.base_run, base_meta), (args.new_run, new_meta))}"
        )
    return comparison.exit_code


def cmd_history(args: argparse.Namespace) -> int:
    try:
        history = load_history(args.runs or [Path("reports")], min_effect=args.min_effect, backends=args.backends)
    except ValueError as error:  # no run folders where the user pointed: bad input
        raise BadInput(str(error)) from None
    print(format_history(history))
    if args.html:
        print(f"page: {write_history_html(history, args.html)}")
    return EXIT_OK


def cmd_merge(args: argparse.Namespace) -> int:
    if args.out.exists():
        raise BadInput(f"merge: {args.out} already exists; a run folder is never overwritten (choose another OUT)")
    try:
        frame, meta, warnings = merge_runs(args.runs, args.allow_mixed_commits)
    except MergeError as error:
        raise BadInput(str(error)) from None
    meta["command"] = " ".join(["harness merge", str(args.out), *map(str, args.runs)]) + (
        " --allow-mixed-commits" if args.allow_mixed_commits else ""
    )
    try:
        write_run(frame, meta, args.out, page=report.render_html)
    except RunDirExistsError as error:
        raise BadInput(f"merge: {error}") from None
    for warning in warnings:
        print(f"warning: {warning} (meta.json's incomplete says so)", file=sys.stderr)
    print(summarize(frame))
    print(f"merged {len(args.runs)} runs, {len(frame)} rows: {args.out / 'report.html'}")
    return exit_code(frame)


def cmd_schema(args: argparse.Namespace) -> int:
    print(json.dumps(case_file_schema(), indent=2))
    return EXIT_OK


def cmd_variants(args: argparse.Namespace) -> int:
    print(variants_text())
    return EXIT_OK


def console_main() -> None:
    """The ``harness`` console script: main() as the process's exit status."""
    sys.exit(main())


def main(argv: list[str] | None = None) -> int:
    kernels.use_interpreter_if_no_gpu()  # before anything imports Triton (see kernels.triton_paged)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verb is None:  # bare `harness`: what it can do, not argparse's "required: verb"
        parser.print_help()
        return EXIT_OK
    handler = {
        "run": cmd_run,
        "list": cmd_list,
        "report": cmd_report,
        "compare": cmd_compare,
        "history": cmd_history,
        "merge": cmd_merge,
        "schema": cmd_schema,
        "variants": cmd_variants,
    }
    restore_signals = install_signal_handlers()
    try:
        code = handler[args.verb](args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's flush at exit
        return code
    except (
        BadInput,
        CaseFileError,
        RunDirExistsError,
        NotWritableError,
        RunFolderError,
        JournalError,
        DuplicateRowsError,
        PoisonedCacheError,
        UnnamedPluginError,
    ) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted: nothing was written", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated:
        print("terminated (SIGTERM): nothing was written", file=sys.stderr)
        return EXIT_TERMINATED
    except BrokenPipeError:  # `harness schema | head`: the reader left early; not a bug, and not a success
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit would raise again
        return EXIT_BROKEN_PIPE
    except Exception:
        traceback.print_exc()
        print("internal error: the traceback above is a bug in the harness, not in your input; please report it",
              file=sys.stderr)  # fmt: skip
        return EXIT_INTERNAL
    finally:
        restore_signals()
