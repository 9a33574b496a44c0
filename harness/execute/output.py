"""A row's output: what a plugin's row prints goes to its own log (``<run>/logs/``); the terminal gets its
head, and known-harmless warnings (:data:`HARMLESS`) are named there once a run."""

import contextlib
import os
import re
import sys
from pathlib import Path

TERMINAL_BYTES = 2048  # of a row's captured output, shown on the terminal; the rest stays in its log file
CLASSIFY_BYTES = 65536  # a log up to this size is read whole to find its harmless warnings
# Python warnings as printed (``path:line: Category: message``, then the source line) known to be harmless.
HARMLESS: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(r"^[^\n]*triton/runtime/interpreter\.py:\d+: RuntimeWarning: (?P<message>(?:invalid value|overflow|"
                r"divide by zero|underflow) encountered in [\w ]+)\n(?:[ \t][^\n]*\n)?", re.M),
     "numpy's notice of inf/NaN arithmetic in Triton's interpreter, which a GPU does silently; a NaN in the "
     "output fails the row"),
    (re.compile(r"^[^\n]*triton/[\w/]+\.py:\d+: UserWarning: (?P<message>TRITON_DEFAULT_FP_FUSION is unset)[^\n]*\n"
                r"(?:[ \t][^\n]*\n)?", re.M),
     "Triton's notice that a default changes in a later release"),
)  # fmt: skip
_NOTED: set[tuple[str, str]] = set()  # (a run's log folder, a harmless notice) already named on the terminal


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

    def point(fds: tuple[int, int]) -> None:  # Python's buffers flushed first: what they hold goes where it was bound
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        for target, fd in zip((1, 2), fds, strict=True):
            os.dup2(fd, target)

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    saved = os.dup(1), os.dup(2)
    point((fd, fd))
    os.close(fd)
    try:
        yield
    finally:
        point(saved)
        os.close(saved[0])
        os.close(saved[1])


def row_log(config, case_id: str, backend: str) -> tuple[str, str] | None:
    """(where the row's output is written now, where it ends up) when the run keeps logs (``config.logs``)."""
    if not getattr(config, "logs", None):
        return None
    staging, final = config.logs
    name = re.sub(r"[^A-Za-z0-9_.=-]+", "_", f"{case_id}__{backend}") + ".log"  # path characters replaced
    return str(Path(staging) / name), str(Path(final) / name)


def report_output(log: tuple[str, str] | None, what: str) -> None:
    """Show a row's captured output on stderr: its first TERMINAL_BYTES, then where the rest is. An empty log
    is removed (not its folder, which other workers share until the run ends)."""
    if log is None:
        return
    path = Path(log[0])
    try:
        size = path.stat().st_size
    except OSError:
        return
    if size == 0:
        path.unlink(missing_ok=True)
        return
    with path.open("rb") as file:
        raw = file.read(CLASSIFY_BYTES)
    rest = raw.decode("utf-8", errors="replace")
    for pattern, why in HARMLESS:
        for message in dict.fromkeys(m.group("message") for m in pattern.finditer(rest)):
            folder = str(Path(log[1]).parent)
            if (folder, message) not in _NOTED:
                _NOTED.add((folder, message))
                print(f"note: {what} printed '{message}': {why}. Shown once; every row's output is in {folder}",
                      file=sys.stderr)  # fmt: skip
        rest = pattern.sub("", rest)
    rest_bytes = rest.encode("utf-8", errors="replace")
    hidden = size - len(raw) + max(len(rest_bytes) - TERMINAL_BYTES, 0)  # unread, then read but past the head
    if not rest.strip() and not hidden:
        return
    print(f"--- output of {what} ({size} bytes; all of it in {log[1]}) ---", file=sys.stderr)
    print(rest_bytes[:TERMINAL_BYTES].decode("utf-8", errors="replace").rstrip("\n"), file=sys.stderr)
    if hidden:
        print(f"--- {hidden} more bytes not shown: see {log[1]} ---", file=sys.stderr)
