"""A run's journal: what it records of the options, ``run --resume`` and ``run --resume --finalize``."""

import argparse
import os
import sys
from pathlib import Path

from harness.backends.builtin import resolve_backends
from harness.backends.registry import plugin_key, require_plugins
from harness.cases.loading import load_cases
from harness.cases.packaged import resolve_case_arg
from harness.cases.spec import CaseFileError
from harness.cli.options import DEFAULT_CASES, BadInput, compile_pattern
from harness.cli.terminal import finish, verdict
from harness.execute.ray_cluster import LOCAL as RAY_LOCAL
from harness.execute.shards import parse_shard, shard_cases
from harness.results import report
from harness.results.journal import Journal, journal_path, pid_alive
from harness.results.storage import write_run
from harness.review.compare import EXIT_INCOMPLETE
from harness.run.runner import COLUMNS, to_frame


def run_options(args: argparse.Namespace, device: str) -> dict:
    """What the journal keeps so that --resume runs the same thing (paths made absolute)."""

    def absolute(path: str) -> str:
        return str(Path(path).resolve()) if Path(path).exists() else path

    stored = {key: getattr(args, attribute) for attribute, (key, _) in _STORED.items()}
    cases, plugins = [absolute(c) for c in (args.cases or DEFAULT_CASES)], [absolute(p) for p in args.harness_plugins]
    return {**stored, "cases": cases, "device": device, "plugins": plugins}


# The options a journal keeps as given: args attribute -> (journal options key, its default).
_STORED = {
    "harness_backends": ("backends", None), "harness_tags": ("tags", None), "pattern": ("pattern", None),
    "harness_oracle_device": ("oracle_device", None), "timing": ("timing", True), "isolate": ("isolate", None),
    "timeout": ("timeout", None), "workers": ("workers", None), "ray": ("ray", None), "shard": ("shard", None),
}  # fmt: skip
# Options that change which rows run or what they measure: given again to --resume, one unlike the journal's is refused.
_RESULT_OPTIONS = {  # args attribute -> (flag, journal options key)
    "harness_device": ("--device", "device"), "harness_tags": ("--tag", "tags"), "pattern": ("-k", "pattern"),
    "harness_oracle_device": ("--oracle-device", "oracle_device"),
}  # fmt: skip


def resume(args: argparse.Namespace):
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
        ray = options.get("ray")  # a journal is data: it never chooses where cases go and rows come from
        if args.workers is None and args.ray is None and ray not in (None, RAY_LOCAL):
            raise BadInput(f"--resume {run_dir}: the run sent its cases to the Ray cluster at {ray}; "
                           f"name it again to send the rest there (--ray {ray}), or give --ray or --workers")  # fmt: skip
    if args.finalize and not journal.rows:  # refused before the lock, which writes this process into the journal
        raise BadInput(f"--finalize {run_dir}: the journal holds no row; there is nothing to write")
    logs = staged_logs(run_dir)
    if logs.is_symlink() or (logs.exists() and not logs.is_dir()):
        raise BadInput(f"--resume {run_dir}: {logs} is not the run's log folder (a link or a file); move it away")
    last_pid = journal.header.get("last_pid")
    if last_pid != os.getpid() and pid_alive(last_pid):  # this process's own pid: an earlier resume of it here
        raise BadInput(f"--resume {run_dir}: process {last_pid} is still writing it")
    journal.lock()  # held until the run folder is written or the run stops: a second resume is refused
    # Options that change no result and are given again win: --isolate, --timeout, --workers/--ray (both replaced).
    given = {key: value for key, value in (("isolate", args.isolate), ("timeout", args.timeout)) if value is not None}
    if args.workers is not None or args.ray is not None:
        given.update(workers=args.workers, ray=args.ray)
    for attribute, (key, default) in _STORED.items():
        setattr(args, attribute, options.get(key, default))
    args.cases, args.harness_device = options.get("cases", []), options.get("device")
    args.harness_plugins = options.get("plugins", [])
    if args.harness_threads is None and threads is not None:
        args.harness_threads = str(threads)
    vars(args).update(given, out=run_dir)
    return journal


def finalize(args: argparse.Namespace, journal) -> int:
    """``--finalize``: write a stopped run's folder from its journal and the meta it recorded (never this
    machine's), running nothing; meta.json lists the pairs that never ran."""
    try:  # what never ran (a journal from elsewhere may name files or backends this machine lacks)
        keep = compile_pattern(args.pattern) if args.pattern is not None else None
        paths = [resolve_case_arg(c) for c in args.cases] or DEFAULT_CASES  # suite names too
        cases = load_cases(paths, None, args.harness_tags, keep=keep)  # no memory check: nothing runs
        if args.shard is not None:  # only this run's slice could have run
            cases = shard_cases(cases, *parse_shard(args.shard))
        backends = resolve_backends(args.harness_backends)
        unknown = None
    except (CaseFileError, ValueError, OSError) as error:
        cases, backends, unknown = [], [], f"the pairs that never ran are not known here: {error}"
    done = journal.done()
    missing = [f"{c.id} {b.name}" for c in cases for b in backends if (c.id, b.name) not in done]
    frame = ordered(to_frame(journal.rows), cases, backends, COLUMNS)
    header = journal.header
    meta = dict(header.get("meta") or {"device": header.get("options", {}).get("device"), "host": header.get("host")})
    meta["incomplete"] = {"finalized_from_journal": True, "started": header.get("started"), "rows": len(frame),
                          "missing_pairs": len(missing), "missing": missing, "note": "the run stopped before these "
                          "(case, backend) pairs ran; the folder was written from its journal"}  # fmt: skip
    if unknown:
        meta["incomplete"].update(missing_pairs=None, missing=None, missing_unknown=unknown)
    if header.get("meta") is None:
        meta["incomplete"]["meta_unknown"] = "the journal predates the recorded meta: device, versions and ceilings are not known here"  # fmt: skip
    write_run(frame, meta, args.resume, page=report.render_html)
    journal.remove()
    keep_logs(Path(args.resume))  # plugin rows' output of the stopped run, kept with its folder
    code, messages = verdict(frame, None)
    if code == 0 and (missing or unknown):  # what ran passes, but not all of the run ran
        code = EXIT_INCOMPLETE
    messages.insert(0, f"incomplete: {unknown}" if unknown else
                    f"incomplete: {len(missing)} (case, backend) pairs never ran (meta.json lists them)")  # fmt: skip
    finish(frame, code, messages, str(Path(args.resume) / "report.html"))
    return code


def staged_logs(run_dir: Path) -> Path:
    """Where plugin rows' output files are written while the run runs (``<run>.logs``, moved to ``<run>/logs``)."""
    return run_dir.with_name(run_dir.name + ".logs")


def ordered(frame, cases, backends, columns):
    """Rows in case order, then backend order (a resumed run's journal mixes two runs)."""
    case_rank = {c.id: i for i, c in enumerate(cases)}
    backend_rank = {b.name: i for i, b in enumerate(backends)}
    case_key = frame["case"].map(case_rank).fillna(len(case_rank))
    key = case_key * (len(backend_rank) + 1) + frame["backend"].map(backend_rank).fillna(len(backend_rank))
    return frame.iloc[key.argsort(kind="stable")].reset_index(drop=True)[columns]


def keep_logs(run_dir: Path, move: bool = True) -> None:
    """Move the staged plugin-row logs into ``<run>/logs`` (not ``move``: kept for --resume); remove an empty folder."""
    staged = staged_logs(run_dir)
    if not staged.is_dir():
        return
    if not any(staged.iterdir()):
        staged.rmdir()
    elif move:
        os.replace(staged, run_dir / "logs")
