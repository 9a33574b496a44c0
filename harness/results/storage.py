"""Storing a run: results.parquet, results.csv, meta.json and report.html in one folder, written into a hidden
``.<run>.partial-<pid>`` sibling and renamed into place; the name is reserved by its journal (O_EXCL)."""

import errno
import json
import os
import re
import shutil
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from harness.results.environment import git
from harness.results.journal import SUFFIX, Journal, JournalError, journal_path, pid_alive, run_dir_of
from harness.results.schemas import RunFolderError, check_meta, check_rows

RESULT_FILES = ("results.parquet", "results.csv", "meta.json", "report.html")
# Every timing sample of a row (arrays): in results.parquet only (in a CSV, numpy's printed arrays, cut at 1000).
SAMPLE_COLUMNS = ("latency_samples_us", "call_samples_us")


class RunDirExistsError(FileExistsError):
    """The run folder already exists; runs are never overwritten."""


class NotWritableError(OSError):
    """The run folder cannot be created where asked; raised before any work."""


def default_run_dir(reports_root: Path, device: str) -> Path:
    """reports/<UTC time>-<device>-<short commit>, with a numeric suffix if taken (not reserved)."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    commit = git("rev-parse", "--short", "HEAD") or "nogit"
    base = reports_root / f"{stamp}-{device}-{commit}"
    candidate, n = base, 1
    while candidate.exists() or journal_path(candidate).exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def _prepare_parent(run_dir: Path) -> None:
    """Create run_dir's parent folders; NotWritableError (the path and the cause) when that fails."""
    parent = run_dir.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise NotWritableError(f"{run_dir}: cannot create its folder: {parent} is a file, not a folder") from None
    except OSError as error:
        raise NotWritableError(f"{run_dir}: cannot create its folder {parent}: {error.strerror}") from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise NotWritableError(f"{run_dir}: cannot write in {parent}: permission denied")
    if run_dir.is_symlink():  # a dangling link is no folder, yet the final rename would fail on it after the work
        target = os.readlink(run_dir)
        raise NotWritableError(f"{run_dir}: is a symbolic link (to {target}); give a path that does not exist yet")


def reserve_run(run_dir: Path | None, reports_root: Path, device: str, options: dict) -> tuple[Path, Journal]:
    """The run folder (``run_dir``, else the next free default name under ``reports_root``) and its open
    :class:`Journal`, reserved before any work; RunDirExistsError for a given one taken, NotWritableError."""
    chosen = Path(run_dir) if run_dir is not None else default_run_dir(Path(reports_root), device)
    _prepare_parent(chosen)
    for _ in range(1000):
        if chosen.exists():
            if run_dir is not None:
                raise RunDirExistsError(f"--out {chosen}: already exists; a run is never overwritten")
        else:
            try:
                return chosen, Journal.create(chosen, options)
            except FileExistsError:
                if run_dir is not None:
                    raise RunDirExistsError(
                        f"--out {chosen}: another run holds this name ({journal_path(chosen)} exists; "
                        f"resume it with --resume {chosen}, or choose another --out)"
                    ) from None
            except OSError as error:
                raise NotWritableError(f"{chosen}: cannot write in {chosen.parent}: {error.strerror}") from None
        chosen = default_run_dir(chosen.parent, device)  # the next name no run folder or journal holds
    raise RunDirExistsError(f"{chosen}: no free run folder name")


_PARTIAL = re.compile(r"^\.(?P<name>.+)\.partial-(?P<pid>\d+)$")
# Written into a partial folder as it is created, removed just before the rename: only a folder
# carrying it is the harness's own, and only such a folder is ever deleted by stale_leftovers.
PARTIAL_MARKER = ".harness-partial"


def stale_leftovers(reports_root: Path) -> list[str]:
    """Messages about what this user's dead runs left under ``reports_root``: a partial folder is removed, a journal
    without a folder kept (with the command that finishes it), one with a folder removed."""
    root = Path(reports_root)
    if not root.is_dir():
        return []
    messages = []
    for entry in sorted(root.iterdir()):
        try:
            if entry.lstat().st_uid != os.getuid():
                continue
        except OSError:  # gone meanwhile
            continue
        match = _PARTIAL.match(entry.name)
        if match and entry.is_dir() and not entry.is_symlink() and not pid_alive(int(match["pid"])):
            marker = entry / PARTIAL_MARKER
            if not marker.is_file() or marker.is_symlink():
                messages.append(f"note: kept {entry}: named like a partial run folder, but without the harness's "
                                f"marker {PARTIAL_MARKER}; not removed")  # fmt: skip
                continue
            journal = root / (match["name"] + SUFFIX)
            kept = f"; its rows are in {journal}" if journal.exists() else ""
            shutil.rmtree(entry, ignore_errors=True)
            messages.append(f"note: removed {entry}: a run (pid {match['pid']}) died while writing it{kept}")
        elif entry.name.endswith(SUFFIX) and entry.is_file():
            try:
                journal = Journal.read(entry)
            except JournalError as error:
                messages.append(f"note: {error}")
                continue
            if pid_alive(journal.header.get("last_pid")):
                continue  # a run still going
            target = run_dir_of(entry)
            if target.is_dir():
                entry.unlink(missing_ok=True)
                messages.append(f"note: removed {entry}: its run folder {target} is complete")
            else:
                pid = journal.header.get("last_pid")
                how = "stopped" if pid is None else f"pid {pid} is gone"
                messages.append(f"note: unfinished run: {len(journal.rows)} rows in {entry} ({how}); "
                                f"finish it with: python -m harness run --resume {target}")  # fmt: skip
    return messages


def write_run(frame: pd.DataFrame, meta: dict, run_dir: Path,
              page: Callable[[pd.DataFrame, dict], str] | None = None) -> Path:  # fmt: skip
    """Write the result files into ``run_dir`` atomically; ``page(frame, meta)`` renders report.html (None: none)."""
    run_dir = Path(run_dir)
    if run_dir.exists():
        raise RunDirExistsError(f"{run_dir} already exists; a run is never overwritten (choose another --out)")
    _prepare_parent(run_dir)
    staging = run_dir.with_name(f".{run_dir.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    (staging / PARTIAL_MARKER).write_text(f"{os.getpid()}\n")
    try:
        frame.to_parquet(staging / "results.parquet", index=False)
        frame.drop(columns=list(SAMPLE_COLUMNS), errors="ignore").to_csv(staging / "results.csv", index=False)
        (staging / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        if page is not None:
            (staging / "report.html").write_text(page(frame, meta))
        (staging / PARTIAL_MARKER).unlink()
        try:
            os.rename(staging, run_dir)  # atomic; refuses a non-empty run_dir made meanwhile
        except OSError as error:
            if error.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise RunDirExistsError(
                    f"{run_dir} appeared while this run wrote; a run is never overwritten"
                ) from None
            raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return run_dir


# A run folder is data from anywhere: its files are sized before they are read (a parquet file by its metadata).
MAX_ROWS = 1_000_000
MAX_ROWS_BYTES = 2 * 2**30
MAX_META_BYTES = 16 * 2**20


def load_run(run_dir: Path) -> tuple[pd.DataFrame, dict]:
    """A stored run's rows and meta, each checked against its schema; RunFolderError naming file and field."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunFolderError(
            f"{run_dir}: not a run folder ({'no such folder' if not run_dir.exists() else 'not a folder'})"
        )
    for name in ("results.parquet", "meta.json"):
        if not (run_dir / name).is_file():
            raise RunFolderError(f"{run_dir}: not a run folder (no {name})")
    meta_file, rows_file = run_dir / "meta.json", run_dir / "results.parquet"
    if (size := meta_file.stat().st_size) > MAX_META_BYTES:
        raise RunFolderError(f"{meta_file}: {size:,} bytes, past the {MAX_META_BYTES:,} a meta.json may hold")
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise RunFolderError(f"{meta_file}: corrupt run metadata: {error}") from None
    import pyarrow.parquet as pq

    try:  # sized by its metadata before pandas reads it
        shape = pq.ParquetFile(rows_file).metadata
        size = sum(shape.row_group(i).total_byte_size for i in range(shape.num_row_groups))
        frame = pd.read_parquet(rows_file) if shape.num_rows <= MAX_ROWS and size <= MAX_ROWS_BYTES else None
    except Exception as error:  # pyarrow raises several types for a damaged file
        raise RunFolderError(f"{rows_file}: not a readable parquet file: {type(error).__name__}: {error}") from None
    if frame is None:
        raise RunFolderError(f"{rows_file}: {shape.num_rows:,} rows, {size / 2**30:.1f} GiB uncompressed: past "
                             f"the {MAX_ROWS:,} rows or {MAX_ROWS_BYTES / 2**30:.0f} GiB a run folder may hold")  # fmt: skip
    return check_rows(frame, rows_file), check_meta(meta, meta_file)
