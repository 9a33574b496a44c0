"""``harness run``: run cases through backends, grade and time every row, write a run folder. Rows go to a
journal as they finish (``resume``); plugins are imported in a worker process, never here."""

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from harness.backends.builtin import REGISTRY, load_plugin, resolve_backends
from harness.backends.registry import add_remote_backend
from harness.cases.packaged import packaged_suites
from harness.cases.spec import check_backend_names
from harness.cli import options
from harness.cli.options import BadInput
from harness.cli.resume import finalize, keep_logs, ordered, resume, run_options, staged_logs
from harness.cli.terminal import finish, row_printer, verdict
from harness.execute.executors import add_arguments as add_scale_arguments
from harness.execute.executors import check_arguments as check_scale_arguments
from harness.execute.executors import run_rows
from harness.execute.processes import DEFAULT_TIMEOUT_S, PluginImportError, Worker
from harness.execute.shards import parse_shard, shard_cases
from harness.results import report
from harness.results.environment import collect_meta
from harness.results.storage import reserve_run, stale_leftovers, write_run
from harness.run import oracle_cache
from harness.run.guard import Terminated, raised_by_backend
from harness.run.profiling import profile_pairs, selected
from harness.run.runner import COLUMNS, RunConfig, to_frame
from harness.timing.ceilings import measure_ceilings, mixed_models_note


def add_parser(verbs) -> None:
    run = verbs.add_parser("run", help="run cases through backends; write a report folder")
    run.add_argument("cases", nargs="*", help="case files or folders, or a packaged suite's name "
                     f"({', '.join(packaged_suites())}); default: smoke")  # fmt: skip
    oracle = run.add_argument_group("oracle and inputs")
    reliability = run.add_argument_group("interrupted runs, isolation and time limits")
    options.add_run_options(run, advanced=oracle)
    run.add_argument("--out", type=Path, help="run folder to create (default: reports/<time>-<device>-<commit>)")
    run.add_argument("--no-timing", dest="timing", action="store_false", help="grade only; do not time")
    run.add_argument("--no-progress", dest="progress", action="store_false", default=None,
                     help="a line a row instead of the progress bar (the default where stderr is not a terminal: "
                     "a log or CI gets lines, not a bar redrawn with carriage returns)")  # fmt: skip
    reliability.add_argument("--profile", action="append", default=[], metavar="CASE[:BACKEND]",
                             help="save a torch.profiler Chrome trace of these rows under RUN/profiles/ (globs; "
                             "repeatable)")  # fmt: skip
    reliability.add_argument("--isolate", choices=["plugins", "all", "none"],
                             help="backends run in a worker process that may crash or hang without ending the run "
                             "(default: plugins; 'all' adds the built-ins, 'none' runs everything in-process)")  # fmt: skip
    reliability.add_argument("--timeout", type=float, metavar="SECONDS", help="time limit of one isolated (or "
                             "--workers) row, grade and timing; a backend past it is hung: its later rows are skips "
                             "(default: the row's expected cost x10, at least 60 s; a case's timeout_s wins)")  # fmt: skip
    reliability.add_argument(
        "--resume", type=Path, metavar="RUN_DIR",
        help="finish a killed or unwritten run from its journal RUN_DIR.journal.jsonl, with its options. Options "
        "that change no result win when given again here: --timeout, --isolate, --workers/--ray (those given replace "
        "both; a Ray cluster's address must be given again), --profile, --no-progress. Options that would change which rows run or what they measure (cases, "
        "--backend, --tag, --device, --oracle-device, --no-timing, --threads, --shard, --out) are refused unless "
        "equal to the journal's. Plugins are imported only when named here: pass each --plugin the run used",
    )  # fmt: skip
    reliability.add_argument("--finalize", action="store_true", help="with --resume: run nothing, write the run "
                             "folder from the journal's rows alone (a run whose machine is gone); meta.json says it "
                             "is incomplete and which (case, backend) pairs never ran; INCOMPLETE and exit 4 where "
                             "some never ran (or which ran is not known here) and the rest pass")  # fmt: skip
    add_scale_arguments(run)  # --workers, --ray, --oracle-cache
    options.add_pattern(run)
    run.set_defaults(handler=main)


def load_plugins(plugins: list[str], isolate: str):
    """Import the plugins in the run's worker and register their backends here from what it reports (with
    ``--isolate none``, import them here): the backend names added, and the worker (None: nothing isolated)."""
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
            print(f"note: the plugins' worker could not wall off the oracle cache ({worker.walls}); this run "
                  "computes every oracle and leaves the cache alone", file=sys.stderr)  # fmt: skip
        if plugins and isolate == "all":
            print("note: --isolate all runs the built-ins in the plugins' worker, beside them: a plugin there can "
                  "reach their rows (docs/contract.md#threat-model)", file=sys.stderr)  # fmt: skip
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
        print("note: --isolate none imports the plugins into the process that grades them: a plugin can reach "
              "its own verdict (docs/contract.md#threat-model)", file=sys.stderr)  # fmt: skip
    return set(REGISTRY) - before, None


def main(args: argparse.Namespace) -> int:
    if args.finalize and not args.resume:
        raise BadInput("--finalize needs --resume RUN_DIR: it writes that run's folder from its journal")
    journal = resume(args) if args.resume else None
    args.isolate = args.isolate or "plugins"
    try:
        return finalize(args, journal) if args.finalize else _checked_run(args, journal)
    except BaseException:
        if journal is not None:  # a resume refused after taking the lock: let it go, say nobody writes it
            journal.close(stopped=True)
        raise


def _checked_run(args: argparse.Namespace, journal) -> int:
    """Check the device, threads, timeout and scale options, import the plugins, then run."""
    device = options.chosen_device(args.harness_device)
    if args.progress is None:
        args.progress = sys.stderr.isatty()
    if args.timeout is not None and not args.timeout > 0:
        raise BadInput(f"--timeout {args.timeout:g}: must be a positive number of seconds")
    with options.as_bad_input():
        options.apply_threads(args.harness_threads, device)
        check_scale_arguments(args)  # --workers, --ray, --oracle-cache (harness.execute.executors)
    plugin_backends, worker = load_plugins(args.harness_plugins, args.isolate)
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
    with options.as_bad_input():
        backends = resolve_backends(args.harness_backends)
    cases = options.load(args.cases, device, args.harness_tags, [b.name for b in backends], args.pattern)
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
        run_dir, journal = reserve_run(args.out, reports_root, device, run_options(args, device))
    else:  # resume() locked it
        run_dir = args.out
    resume_hint = f"python -m harness run --resume {run_dir}"
    try:
        return _run_and_write(args, device, cases, backends, plugin_backends, worker, journal, run_dir, resume_hint)
    except (KeyboardInterrupt, Terminated) as stop:  # the rows so far stay in the journal
        journal.close(stopped=True)
        what = "interrupted" if isinstance(stop, KeyboardInterrupt) else "terminated (SIGTERM)"
        print(f"{what}: {len(journal.rows)} rows kept in {journal.path}; finish with: {resume_hint}", file=sys.stderr)
        return options.EXIT_INTERRUPTED if isinstance(stop, KeyboardInterrupt) else options.EXIT_TERMINATED
    except BaseException:
        journal.close(stopped=True)
        print(f"the {len(journal.rows)} rows so far are kept in {journal.path}; after a fix: {resume_hint}",
              file=sys.stderr)  # fmt: skip
        raise


def _run_and_write(args, device, cases, backends, plugin_backends, worker, journal, run_dir, resume_hint) -> int:
    """Time the ceiling, run what the journal lacks, write the folder, drop the journal; the exit code."""
    threads = torch.get_num_threads()  # as apply_threads set it (--threads)
    to_profile = selected(cases, backends, args.profile)
    dtypes = tuple(sorted({c.dtype for c in cases}))
    # Over workers or Ray on CUDA each worker measures its own GPU's ceilings; meta.json's are the first GPU's.
    pooled_cuda = device == "cuda" and (args.workers is not None or args.ray is not None)
    ceilings = measure_ceilings(device, list(dtypes)) if args.timing and not pooled_cuda else {}
    isolated = {"plugins": plugin_backends, "all": {b.name for b in backends}, "none": set()}[args.isolate]
    config = RunConfig(device=device, backends=backends, timing=args.timing,
                       oracle_device=args.harness_oracle_device or "cpu", ceilings=ceilings, ceiling_dtypes=dtypes,
                       progress=args.progress, isolated=frozenset(isolated), plugins=tuple(args.harness_plugins),
                       timeout_s=args.timeout, threads=threads,
                       logs=(str(staged_logs(run_dir)), str(run_dir / "logs")))  # fmt: skip
    printer, journal_s = None, 0.0

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
        start_meta = collect_meta(device, [options.prog(), *sys.argv[1:]], {}, oracle_cache.meta_record())
        journal.record_meta({**start_meta, "ceilings": ceilings, "timing_threads": threads, "shard": args.shard})
    print(f"{len(cases)} cases x {len(backends)} backends on {device}"
          + (f": {todo} to run, {len(done)} from the journal" if done else ""), file=sys.stderr)  # fmt: skip
    if not args.progress:  # a line a row, after one line per backend that cannot run here
        kind = torch.device(device).type
        skipped = {b.name: f"runs on {', '.join(b.devices)}, not {kind}" for b in backends if kind not in b.devices}
        printer = row_printer(skipped, len(cases))
    scale = run_rows(args, cases, config, on_row, done, worker)  # in this process, over --workers, or --ray
    merging = time.perf_counter()
    if pooled_cuda and args.timing and scale.get("gpus"):
        ceilings = scale["gpus"][0].get("ceilings") or {}  # the first GPU's, as its worker measured them
    frame = ordered(to_frame(journal.rows), cases, backends, COLUMNS)
    scale.update(journal_s=round(journal_s, 3), merge_s=round(time.perf_counter() - merging, 3), rows=len(frame))
    bandwidth = {k: v for k, v in ceilings.items() if k.endswith("_gbps")}
    meta = collect_meta(device, [options.prog(), *sys.argv[1:]], bandwidth, oracle_cache.meta_record())
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
        keep_logs(run_dir, move=False)
        print(f"error: writing the run folder {run_dir} failed: {error}\n"
              f"the {len(journal.rows)} rows are kept in {journal.path}; once there is room, finish with: "
              f"{resume_hint}", file=sys.stderr)  # fmt: skip
        return options.EXIT_INTERNAL
    journal.remove()
    keep_logs(run_dir)  # the plugin rows' output, beside the run until its folder exists
    if to_profile:
        _profile(to_profile, config, worker, run_dir / "profiles")
    code, messages = verdict(frame, args.harness_backends)
    finish(frame, code, messages, str(run_dir / "report.html"))
    return code


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
                paths = worker.profile(case, backend.name, config, folder, limit)
                if isinstance(paths, str):
                    print(f"profile: {case.id}:{backend.name} failed: {paths}", file=sys.stderr)
                    continue
            else:
                paths = profile_pairs([(case, backend)], config.device, config.oracle_device, folder)
            for path in paths:
                print(f"profile: {path}")
    finally:
        if own and worker is not None:
            worker.stop()
