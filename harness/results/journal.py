"""The run journal ``reports/<run>.journal.jsonl``, removed once the run folder is written: a header line
(options, pid), one fsynced line per finished row, ``resumed_by`` / ``stopped_by`` lines. Every line is
validated on reading; a writer holds an exclusive ``flock``."""

import contextlib
import fcntl
import json
import os
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from harness.cases.vocab import Status, field_path

SUFFIX = ".journal.jsonl"


class JournalError(ValueError):
    """A journal that cannot be read or resumed; the message names the file."""


class _Record(BaseModel):
    # strict: a number is never read from text, nor a string from a list; unknown keys are kept
    model_config = ConfigDict(strict=True, extra="allow")


class HeaderOptions(_Record):
    cases: list[str] = []
    backends: list[str] | None = None
    device: str | None = None
    plugins: list[str] = []
    tags: list[str] | None = None
    oracle_device: str | None = None
    timing: bool = True
    isolate: Literal["plugins", "all", "none"] | None = "plugins"
    timeout: float | None = None
    workers: str | int | None = None
    ray: str | None = None
    shard: str | None = None


MAX_BYTES = 2 * 2**30  # a journal of 10,000 rows with their samples is tens of MB


class Header(_Record):
    journal: Literal[1]
    pid: int | None = None
    host: str | None = None
    started: str | None = None
    options: HeaderOptions = HeaderOptions()


class Row(_Record):
    """A report row; the columns later steps read by type are checked, the rest kept as they are."""

    case: str
    backend: str
    status: Status
    reason: str | float | None = None  # float: NaN
    device: str | None = None
    latency_us: float | None = None
    call_us: float | None = None
    max_abs_err: float | None = None
    tol_ratio: float | None = None
    latency_samples_us: list[float] | str | float | None = None  # str: older journals' text; float: NaN
    call_samples_us: list[float] | str | float | None = None


Resumed = create_model("Resumed", __base__=_Record, resumed_by=(int, ...))
Stopped = create_model("Stopped", __base__=_Record, stopped_by=(int, ...))
Meta = create_model("Meta", __base__=_Record, meta=(dict, ...))
# A line's kind by the first of these keys it holds: (key, model, kind).
_KINDS = (("case", Row, "row"), ("backend", Row, "row"), ("meta", Meta, "meta"), ("resumed_by", Resumed, "resumed"),
          ("stopped_by", Stopped, "stopped"))  # fmt: skip


def _check(path: Path, number: int, record) -> str:
    """Validate one journal line; its kind ('header' on line 1, else 'row', 'meta', 'resumed', 'stopped')."""
    if number == 1:
        model, kind = Header, "header"
    elif not isinstance(record, dict):
        raise JournalError(f"{path}: line {number}: a {type(record).__name__}, not a JSON object")
    elif not (found := next(((m, k) for key, m, k in _KINDS if key in record), None)):
        raise JournalError(f"{path}: line {number}: neither a row nor a meta, resume or stop record")
    else:
        model, kind = found
    try:
        model.model_validate(record)
    except ValidationError as error:  # the first problem: 'file: line N: field F: what is wrong'
        first = error.errors()[0]
        field = field_path(first["loc"]) or "(the line)"
        problem = f"{first['msg']} (got {first.get('input')!r:.80})"
        raise JournalError(f"{path}: line {number}: field {field!r}: {problem}") from None
    return kind


def journal_path(run_dir: Path) -> Path:
    return Path(run_dir).with_name(Path(run_dir).name + SUFFIX)


def run_dir_of(journal: Path) -> Path:
    return journal.with_name(journal.name.removesuffix(SUFFIX))


def _plain(value):
    """JSON-safe value: numpy/torch numbers as Python numbers, sequences as lists, mappings as dicts, else text."""
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


def plain_row(row: dict) -> dict:
    """A row as JSON-safe values (:func:`_plain`), as a journal line or a pytest-xdist hand-off file holds it."""
    return {key: _plain(value) for key, value in row.items()}


class Journal:
    def __init__(self, path: Path, header: dict, rows: list[dict]):
        self.path, self.header, self.rows = Path(path), header, rows
        self.warnings: list[str] = []  # what reading it dropped (duplicated rows)
        self._file = None

    @classmethod
    def create(cls, run_dir: Path, options: dict) -> "Journal":
        """Start the journal of ``run_dir``; FileExistsError when one exists (the name is taken)."""
        path = journal_path(run_dir)
        started = datetime.now(UTC).isoformat(timespec="seconds")
        header = dict(journal=1, pid=os.getpid(), host=socket.gethostname(), started=started, options=options)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        journal = cls(path, header, [])
        journal._file = os.fdopen(fd, "a", encoding="utf-8")
        with contextlib.suppress(OSError):  # just created (O_EXCL): free; a filesystem without locks: the pid check
            fcntl.flock(journal._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        journal._write(header)
        return journal

    @classmethod
    def read(cls, path: Path) -> "Journal":
        """A journal's header and rows; a torn last line (killed mid-write) is dropped."""
        path = Path(path)
        try:
            if (size := path.stat().st_size) > MAX_BYTES:  # a handed file is sized before it is read whole
                raise JournalError(f"{path}: {size:,} bytes, past the {MAX_BYTES:,} a journal may hold")
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
        metas, rows, seen, dropped = [], [], set(), []
        for number, record in enumerate(records, 1):
            kind = _check(path, number, record)
            if kind == "resumed":  # who writes it now: the last resume, or nobody after a clean stop
                pid = record["resumed_by"]
            elif kind == "stopped":
                pid = None
            elif kind == "meta":
                metas.append(record["meta"])
            elif kind == "row" and (record["case"], record["backend"]) in seen:
                dropped.append(f"{record['case']} {record['backend']} (line {number})")
            elif kind == "row":
                seen.add((record["case"], record["backend"]))
                rows.append(record)
                for key, value in record.items():  # samples as lists, also where an older journal holds text "[1.5]"
                    if key.endswith("_samples_us") and isinstance(value, str) and value.startswith("["):
                        try:
                            record[key] = [float(x) for x in json.loads(value)]
                        except (ValueError, TypeError):
                            record[key] = None
        header["last_pid"] = pid
        header["meta"] = metas[-1] if metas else None  # the run's meta.json as it stood at its start
        journal = cls(path, header, rows)
        if dropped:
            journal.warnings.append(
                f"{path}: dropped {len(dropped)} duplicated row(s), keeping each pair's first: {', '.join(dropped[:5])}"
                + (" ..." if len(dropped) > 5 else "")
            )
        return journal

    def lock(self) -> None:
        """Open for appending and take the journal's lock (no waiting), recording this process as its writer;
        JournalError naming the holder's pid when another process holds it."""
        if self._file is not None:
            return
        file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open (and locked) for the run's rows
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            file.close()
            try:  # the holder records its pid right after taking the lock
                holder = Journal.read(self.path).header.get("last_pid")
            except JournalError:
                holder = None
            who = f"process {holder}" if holder else "another process"
            raise JournalError(f"{self.path}: {who} holds this journal's lock: it is resuming (writing) this run now; "
                               "wait for it to finish or stop it") from None  # fmt: skip
        except OSError:  # a filesystem without flock (some network mounts): only the pid check guards it
            pass
        self._file = file
        self._write({"resumed_by": os.getpid()})

    def record_meta(self, meta: dict) -> None:
        """The run's meta as measured at its start: a journal finalized elsewhere still says where it ran."""
        self._write({"meta": _plain(meta)})

    def append(self, row: dict) -> None:
        """One finished row, on disk before this returns (flush + fsync)."""
        self.rows.append(row)
        self._write(plain_row(row))

    def _write(self, record: dict) -> None:
        line = json.dumps(record, allow_nan=True, default=str)
        self._file.write(line + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def done(self) -> set[tuple[str, str]]:
        return {(row["case"], row["backend"]) for row in self.rows}

    def close(self, stopped: bool = False) -> None:
        """Close; ``stopped``: the run ended here unfinished (interrupted, or its write failed)."""
        if self._file is not None:
            if stopped:
                self._write({"stopped_by": os.getpid()})
            self._file.close()
            self._file = None

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)  # before the lock goes with close(): no one resumes it in between
        self.close()


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
