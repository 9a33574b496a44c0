"""The run journal: every finished row appended, as JSON lines, beside the run folder.

``reports/<run>.journal.jsonl`` is created (O_EXCL: it also reserves the run folder's name)
before the first case runs. Its first line is a header, the run's options and the pid of
the process writing it; each later line is one report row, flushed and fsynced as it
finishes. A run that is killed, or whose final write fails, keeps it, and
``python -m harness run --resume reports/<run>`` runs only the (case, backend) pairs it
lacks, then writes the folder. The journal is removed once the folder is in place.

    {"journal": 1, "pid": 4242, "host": "...", "started": "...", "options": {...}}
    {"case": "decode_gqa/dtype=float32", "backend": "tlsim", "status": "pass", ...}
    {"resumed_by": 4343}
    {"stopped_by": 4343}                  (a run stopped by Ctrl-C, SIGTERM or a failed write)
"""

from __future__ import annotations

import json
import math
import os
import socket
from datetime import UTC, datetime
from pathlib import Path

SUFFIX = ".journal.jsonl"


class JournalError(ValueError):
    """A journal that cannot be read or resumed; the message names the file."""


def journal_path(run_dir: Path) -> Path:
    """reports/<run> -> reports/<run>.journal.jsonl"""
    run_dir = Path(run_dir)
    return run_dir.with_name(run_dir.name + SUFFIX)


def run_dir_of(journal: Path) -> Path:
    """reports/<run>.journal.jsonl -> reports/<run>"""
    return journal.with_name(journal.name.removesuffix(SUFFIX))


def _plain(value):
    """JSON-safe value: numpy/torch numbers as Python numbers, sequences (a row's timing
    samples) as lists of them, mappings (the meta's ceilings) as dicts of them, anything else as text."""
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple) or (hasattr(value, "tolist") and getattr(value, "ndim", 0) > 0):
        return [_plain(item) for item in (value.tolist() if hasattr(value, "tolist") else value)]
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return int(number) if float(number).is_integer() and not isinstance(value, float) else number


class Journal:
    """Append-only rows of one run; see the module docstring."""

    def __init__(self, path: Path, header: dict, rows: list[dict]):
        self.path = Path(path)
        self.header = header
        self.rows = rows
        self._file = None

    @classmethod
    def create(cls, run_dir: Path, options: dict) -> Journal:
        """Start the journal of ``run_dir``; FileExistsError when one exists (the name is taken)."""
        path = journal_path(run_dir)
        header = {
            "journal": 1,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "options": options,
        }
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        journal = cls(path, header, [])
        journal._file = os.fdopen(fd, "a", encoding="utf-8")
        journal._write(header)
        return journal

    @classmethod
    def read(cls, path: Path) -> Journal:
        """A journal's header and rows; a torn last line (killed mid-write) is dropped."""
        path = Path(path)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            raise JournalError(f"{path}: no journal here (nothing to resume)") from None
        except (OSError, UnicodeDecodeError) as error:
            raise JournalError(f"{path}: cannot read the journal: {error}") from None
        records = []
        for number, line in enumerate(lines, 1):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if number == len(lines):  # the line being written when the run died
                    break
                raise JournalError(f"{path}: line {number} is not JSON; the journal is damaged") from None
        if not records or not isinstance(records[0], dict) or records[0].get("journal") != 1:
            raise JournalError(f"{path}: no journal header on line 1; not a harness journal")
        header = records[0]
        pid = header.get("pid")
        for record in records[1:]:  # who writes it now: the last resume, or nobody after a clean stop
            if isinstance(record, dict) and "resumed_by" in record:
                pid = record["resumed_by"]
            elif isinstance(record, dict) and "stopped_by" in record:
                pid = None
        header["last_pid"] = pid
        metas = [r["meta"] for r in records[1:] if isinstance(r, dict) and isinstance(r.get("meta"), dict)]
        header["meta"] = metas[-1] if metas else None  # the run's meta.json as it stood at its start
        rows = [_samples_back(r) for r in records[1:] if isinstance(r, dict) and "case" in r and "backend" in r]
        return cls(path, header, rows)

    def reopen(self) -> None:
        """Append from this process (a resume); records who took it over."""
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the run's rows
        self._write({"resumed_by": os.getpid()})

    def record_meta(self, meta: dict) -> None:
        """The run's meta (device, versions, commit, ceilings) as measured at its start, so that a
        journal finalized elsewhere (``run --resume RUN --finalize``) still says where it ran."""
        self._write({"meta": _plain(meta)})

    def append(self, row: dict) -> None:
        """One finished row, on disk before this returns (flush + fsync)."""
        self.rows.append(row)
        self._write({key: _plain(value) for key, value in row.items()})

    def _write(self, record: dict) -> None:
        line = json.dumps(record, allow_nan=True, default=str)
        self._file.write(line + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def done(self) -> set[tuple[str, str]]:
        """(case, backend) pairs that have a row."""
        return {(row["case"], row["backend"]) for row in self.rows}

    def close(self, stopped: bool = False) -> None:
        """Close; ``stopped``: the run ended here unfinished (interrupted, or its write failed)."""
        if self._file is not None:
            if stopped:
                self._write({"stopped_by": os.getpid()})
            self._file.close()
            self._file = None

    def remove(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


def pid_alive(pid) -> bool:
    """Whether a process with this pid exists on this host (a live run still writing)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _samples_back(row: dict) -> dict:
    """Timing samples as lists; journals written before _plain kept sequences wrote them as text ("[1.5, 2.0]")."""
    for key, value in row.items():
        if key.endswith("_samples_us") and isinstance(value, str) and value.startswith("["):
            try:
                row[key] = [float(x) for x in json.loads(value)]
            except (ValueError, TypeError):
                row[key] = None
    return row


def row_from_json(row: dict) -> dict:
    """A journal row back as a report row (JSON null -> NaN for numbers, as the frame keeps them)."""
    return {key: (math.nan if value is None else value) for key, value in row.items()}
