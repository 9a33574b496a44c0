"""A row's output: what a backend writes to stdout and stderr goes to its own file.

A plugin's row runs inside :func:`captured_output` (file descriptors 1 and 2, so native code's
output too) into :func:`row_log_name` under ``RunConfig.logs``' staging folder, moved to
``<run>/logs/`` with the run folder; the terminal gets its first ``TERMINAL_BYTES`` and a line
saying where the rest is (:func:`report_output`). Empty logs are removed.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from pathlib import Path

TERMINAL_BYTES = 2048  # of a row's captured output, shown on the terminal; the rest stays in its log file


def row_log_name(case_id: str, backend: str) -> str:
    """The log file of one row's output: ``<case>__<backend>.log``, with path characters replaced."""
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", f"{case_id}__{backend}") + ".log"


@contextlib.contextmanager
def captured_output(path: str | None):
    """This process's stdout and stderr (file descriptors 1 and 2, so native code's too) go to ``path``."""
    if path is None:
        yield
        return
    folder = Path(path).parent
    folder.mkdir(parents=True, exist_ok=True)
    if folder.is_symlink():  # the run folder may be a handed one (--resume): its links are never followed
        raise OSError(f"{folder}: a symbolic link, not the run's log folder")
    with contextlib.suppress(FileNotFoundError):
        if os.path.islink(path):
            os.unlink(path)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    saved = os.dup(1), os.dup(2)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def row_log(config, case_id: str, backend: str) -> tuple[str, str] | None:
    """(where the row's output is written now, where it ends up) when the run keeps logs (``config.logs``)."""
    if not getattr(config, "logs", None):
        return None
    staging, final = config.logs
    name = row_log_name(case_id, backend)
    return str(Path(staging) / name), str(Path(final) / name)


def report_output(log: tuple[str, str] | None, what: str) -> None:
    """Show a row's captured output on stderr: its first TERMINAL_BYTES, then where the rest is. An empty log
    is removed (with its folder, when that is left empty)."""
    if log is None:
        return
    path = Path(log[0])
    try:
        size = path.stat().st_size
    except OSError:
        return
    if size == 0:
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            path.parent.rmdir()
        return
    with path.open("rb") as file:
        head = file.read(TERMINAL_BYTES).decode("utf-8", errors="replace")
    print(f"--- output of {what} ({size} bytes; all of it in {log[1]}) ---", file=sys.stderr)
    print(head.rstrip("\n"), file=sys.stderr)
    if size > TERMINAL_BYTES:
        print(f"--- {size - TERMINAL_BYTES} more bytes not shown: see {log[1]} ---", file=sys.stderr)
