"""Backends run in a worker process, where a crash, an exit or a hang cannot end the run.

A backend in the same process can end the run in ways no ``except`` catches:
``os._exit(0)``, a segfault (``ctypes.string_at(0)``, an out-of-bounds read in native
code), or a call that never returns. :class:`Worker` is one long-lived process (started
with ``multiprocessing``'s spawn, so it shares no state with the parent) that imports the
plugins, builds a case's inputs and oracle once, and runs the isolated backends of that
case one call at a time, each under a time limit. When it dies, the row is an error
naming the signal or exit code; when a call runs past its limit, the worker is killed and
the row is an error "timed out after N s". The next call starts a fresh worker (and
rebuilds the case's inputs in it): the run goes on. A backend that ran past its limit is
marked hung (:class:`Hung`): the run sends it no more cases, and its remaining rows are
skips naming the case where it hung, so a hang costs one time limit, not one per row.

The limit of a row is the case's ``timeout_s``, else ``--timeout``, else
:func:`harness.timing.measure.row_time_limit` (the row's expected cost, generously, with a
60 s floor): :func:`row_limit`.

Which backends run there is the run's choice (``--isolate``): by default the plugins (code
from outside this repository; the built-ins are this repository's own torch code, and
isolating them would build every case's inputs and float64 oracle twice on the CPU).

The worker ignores SIGINT from its first instruction (it is started with SIGINT ignored,
which the new interpreter keeps): the user's Ctrl-C goes to the parent, which stops the
worker and reports one line, never a child's traceback. The worker dies with its parent
(:func:`die_with_parent`), so a killed run leaves no worker behind. It runs with the
run's torch thread count (``RunConfig.threads``, what the rows record as
``timing_threads``).

What a row's backend writes to stdout and stderr goes to its own file
(:func:`row_log_name`, under ``RunConfig.logs``' staging folder, moved to ``<run>/logs/`` with
the run folder); the terminal gets its first ``TERMINAL_BYTES`` and a line saying where the
rest is (:func:`report_output`). ``--profile`` of an isolated backend runs in the worker too.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import multiprocessing
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from harness.backends.builtin import REGISTRY, load_plugin
from harness.cases.spec import Case
from harness.run.profiling import profile_pairs
from harness.run.runner import build_context, error_reason, run_backend
from harness.timing.measure import row_time_limit
from harness.timing.phases import absorb, take_phases

START_TIMEOUT_S = 300.0  # importing torch, kernels and the plugins on a busy laptop
DEFAULT_TIMEOUT_S = 600.0  # of one --profile of an isolated backend, unless --timeout or the case's timeout_s


def row_limit(case: Case, config) -> float:
    """Seconds one row of ``case`` may take (grade and timing) before its backend counts as hung."""
    return case.timeout_s or config.timeout_s or row_time_limit(case, config.device, config.ceilings)


class Hung:
    """Backends that ran past their limit in this run: where and after how long, and their later rows' skip."""

    def __init__(self):
        self.where: dict[str, tuple[str, float]] = {}  # backend -> (case id, limit in seconds)

    def mark(self, backend: str, case_id: str, limit_s: float) -> None:
        self.where.setdefault(backend, (case_id, limit_s))

    def reason(self, backend: str) -> str | None:
        """The skip reason of a later row of ``backend``, or None when it has not hung."""
        if backend not in self.where:
            return None
        case_id, limit_s = self.where[backend]
        return f"hung on {case_id} after {limit_s:g} s; not run"


DIED, TIMED_OUT = "died", "timed out"  # what _receive returns instead of a message


class PluginImportError(Exception):
    """A plugin could not be imported in the worker (it raised, exited or crashed)."""


def describe_exit(exitcode: int | None) -> str:
    """'killed by SIGSEGV' / 'exited with code 0' for a process's exit code."""
    if exitcode is None:
        return "stopped answering"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


TERMINAL_BYTES = 2048  # of a row's captured output, shown on the terminal; the rest stays in its log file
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent_pid: int) -> None:
    """Make the kernel SIGKILL this process when its parent dies (Linux ``prctl(PR_SET_PDEATHSIG)``).

    A worker left behind by a SIGKILLed run would hold its GPU memory and CPU for as long as the
    call it was in takes (a hang: forever). The signal follows the parent *thread* that started
    the process: workers are started from the run's main thread. A parent that died before
    this call is seen by the changed parent pid: the process exits at once.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


@contextlib.contextmanager
def sigint_ignored_in_children():
    """Start processes inside: they begin with SIGINT ignored (a disposition kept across exec, and kept by a
    new Python interpreter), so a Ctrl-C while one imports torch is not a traceback in each child.

    This process ignores SIGINT only for the fork and exec; outside the main thread it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def row_log_name(case_id: str, backend: str) -> str:
    """The log file of one row's output: ``<case>__<backend>.log``, with path characters replaced."""
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", f"{case_id}__{backend}") + ".log"


@contextlib.contextmanager
def captured_output(path: str | None):
    """This process's stdout and stderr (file descriptors 1 and 2, so native code's too) go to ``path``."""
    if path is None:
        yield
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
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


def _worker_main(conn, plugins: tuple[str, ...], parent_pid: int) -> None:
    """The worker's loop: ('context', case, config) builds inputs; ('row', name, log) runs one backend, its
    output into ``log``; ('profile', case, name, config, folder) writes that row's trace."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(parent_pid)
    import torch

    try:
        for plugin in plugins:
            load_plugin(plugin)
    except BaseException as error:
        cause = error.__cause__ if isinstance(error, ValueError) and error.__cause__ else error
        conn.send(("plugin_error", f"{type(cause).__name__}: {cause}"))
        return
    conn.send(("ready", sorted(REGISTRY)))
    ctx = config = None
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "context":
            ctx = None  # free the last case's tensors first
            _, case, config = message
            if config.threads:  # the count the rows record (timing_threads)
                torch.set_num_threads(config.threads)
            try:
                ctx = build_context(case, config.device, config.oracle_device)
                conn.send(("ok", None, take_phases()))
            except BaseException as error:
                conn.send(("error", f"building inputs/oracle: {error_reason(error)}", take_phases()))
        elif message[0] == "row":  # each reply carries its phases: the parent counts them as its own
            with captured_output(message[2]):
                row = run_backend(ctx, REGISTRY[message[1]], config)
            conn.send(("row", row, take_phases()))
        elif message[0] == "profile":
            _, case, name, config, folder = message
            if config.threads:
                torch.set_num_threads(config.threads)
            try:
                paths = profile_pairs([(case, REGISTRY[name])], config.device, config.oracle_device, Path(folder))
                conn.send(("profiled", [str(path) for path in paths], take_phases()))
            except BaseException as error:
                conn.send(("error", error_reason(error), take_phases()))


def _absorb_phases(reply) -> None:
    """A worker's reply tuple ends with its phases (harness.timing.phases): count them in this process."""
    if isinstance(reply, tuple) and len(reply) == 3 and isinstance(reply[2], dict):
        absorb(reply[2])


class Worker:
    """One worker process at a time; see the module docstring."""

    def __init__(self, plugins: tuple[str, ...] = ()):
        self.plugins = tuple(plugins)
        self.process = None
        self.conn = None
        self.case_id: str | None = None  # whose inputs the worker holds
        self.starts = 0

    def start(self) -> list[str]:
        """Start the worker and import the plugins there; their backend names. PluginImportError."""
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_worker_main, args=(child, self.plugins, os.getpid()), daemon=True)
        with sigint_ignored_in_children():
            self.process.start()
        child.close()
        self.starts += 1
        self.case_id = None
        try:
            reply = self._receive(START_TIMEOUT_S)
        except BaseException:  # the user's Ctrl-C while it imports: no worker is left behind
            self.stop()
            raise
        if reply in (DIED, TIMED_OUT) or reply[0] != "ready":
            if reply == TIMED_OUT:
                why = f"importing took more than {START_TIMEOUT_S:g} s"
            else:
                why = reply[1] if reply != DIED else f"the worker {self._death()} while importing"
            self.stop()
            raise PluginImportError(f"{', '.join(self.plugins) or 'the worker'}: {why}")
        return reply[1]

    def _receive(self, timeout_s: float | None) -> Any:
        """The worker's next message; DIED when it died (EOF), TIMED_OUT when the time ran out."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            wait = 1.0 if deadline is None else min(1.0, max(deadline - time.monotonic(), 0))
            try:
                if self.conn.poll(wait):
                    return self.conn.recv()
            except (EOFError, OSError):
                return DIED
            if not self.process.is_alive():
                try:  # it may have answered just before dying
                    return self.conn.recv() if self.conn.poll(0) else DIED
                except (EOFError, OSError):
                    return DIED
            if deadline is not None and time.monotonic() >= deadline:
                return TIMED_OUT

    def _death(self) -> str:
        self.process.join(timeout=5)
        return describe_exit(self.process.exitcode)

    def stop(self) -> None:
        """Kill the worker (if alive) and forget it; the next call starts a fresh one."""
        if self.process is not None:
            if self.process.is_alive():
                self.process.kill()
            self.process.join(timeout=10)
        if self.conn is not None:
            self.conn.close()
        self.process = self.conn = self.case_id = None

    def run(self, case: Case, backend: str, config, timeout_s: float) -> dict | str:
        """The row of ``backend`` on ``case``, or the reason it has none (death, timeout)."""
        if self.process is None or not self.process.is_alive():
            self.stop()
            self.start()
        if self.case_id != case.id:
            self.conn.send(("context", case, dataclasses.replace(config, backends=[], progress=False)))
            reply = self._receive(None)
            _absorb_phases(reply)
            if reply == DIED:
                why = f"worker {self._death()} building the case's inputs"
                self.stop()
                return why
            if reply[0] == "error":
                self.case_id = None
                return reply[1]
            self.case_id = case.id
        started = time.monotonic()
        log = row_log(config, case.id, backend)
        self.conn.send(("row", backend, log[0] if log else None))
        try:
            reply = self._receive(timeout_s)
        finally:
            report_output(log, f"{backend} on {case.id}")
        _absorb_phases(reply)
        if reply == TIMED_OUT:
            self.stop()
            return (
                f"{TIMED_OUT} after {timeout_s:g} s (isolated; the worker was killed); hung: its later rows are skipped"
            )
        if reply != DIED:
            return reply[1]
        why = f"the worker process {self._death()} after {time.monotonic() - started:.1f} s"
        self.stop()
        return why

    def profile(self, case: Case, backend: str, config, folder: Path, timeout_s: float) -> list[str] | str:
        """``--profile`` of an isolated backend, run in the worker: the trace paths, or why there are none."""
        if self.process is None or not self.process.is_alive():
            self.stop()
            try:
                self.start()
            except PluginImportError as error:
                return str(error)
        self.case_id = None  # the worker's case inputs are not kept across a profile
        self.conn.send(("profile", case, backend, dataclasses.replace(config, backends=[], progress=False),
                        str(folder)))  # fmt: skip
        reply = self._receive(timeout_s)
        _absorb_phases(reply)
        if reply == TIMED_OUT:
            self.stop()
            return f"timed out after {timeout_s:g} s (isolated; the worker was killed)"
        if reply == DIED:
            why = f"the worker process {self._death()}"
            self.stop()
            return why
        return reply[1]

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
