"""Backends run in a worker process, where a crash, an exit or a hang cannot end the run.

A backend in the same process can end the run in ways no ``except`` catches:
``os._exit(0)``, a segfault (``ctypes.string_at(0)``, an out-of-bounds read in native
code), or a call that never returns. :class:`Worker` is one long-lived process (started
with ``multiprocessing``'s spawn, so it shares no state with the parent) that imports the
plugins, builds a case's inputs and oracle once, and runs the isolated backends of that
case one call at a time, each under a time limit. When it dies, the row is an error
naming the signal or exit code; when a call runs past its limit, the worker is killed and
the row is an error "timed out after N s". The next call starts a fresh worker (and
rebuilds the case's inputs in it): the run goes on.

Which backends run there is the run's choice (``--isolate``): by default the plugins (code
from outside this repository; the built-ins are this repository's own torch code, and
isolating them would build every case's inputs and float64 oracle twice on the CPU).

The worker ignores SIGINT: the user's Ctrl-C goes to the parent, which stops the worker.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import signal
import time
from typing import Any

from harness.cases.spec import Case

START_TIMEOUT_S = 300.0  # importing torch, kernels and the plugins on a busy laptop
DEFAULT_TIMEOUT_S = 600.0  # per isolated call (grade + timing); --timeout and a case's timeout_s override it


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


def _worker_main(conn, plugins: tuple[str, ...]) -> None:
    """The worker's loop: ('context', case, config) builds inputs; ('row', name) runs one backend."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from harness.backends.builtin import REGISTRY, load_plugin
    from harness.run.runner import _error_reason, build_context, run_backend
    from harness.timing.phases import take_phases

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
            try:
                ctx = build_context(case, config.device, config.oracle_device)
                conn.send(("ok", None, take_phases()))
            except BaseException as error:
                conn.send(("error", f"building inputs/oracle: {_error_reason(error)}", take_phases()))
        elif message[0] == "row":  # each reply carries its phases: the parent counts them as its own
            row = run_backend(ctx, REGISTRY[message[1]], config)
            conn.send(("row", row, take_phases()))


def _absorb_phases(reply) -> None:
    """A worker's reply tuple ends with its phases (harness.timing.phases): count them in this process."""
    if isinstance(reply, tuple) and len(reply) == 3 and isinstance(reply[2], dict):
        from harness.timing.phases import absorb

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
        self.process = context.Process(target=_worker_main, args=(child, self.plugins), daemon=True)
        self.process.start()
        child.close()
        self.starts += 1
        self.case_id = None
        reply = self._receive(START_TIMEOUT_S)
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
        self.conn.send(("row", backend))
        reply = self._receive(timeout_s)
        _absorb_phases(reply)
        if reply == TIMED_OUT:
            self.stop()
            return f"timed out after {timeout_s:g} s (isolated; the worker was killed)"
        if reply != DIED:
            return reply[1]
        why = f"the worker process {self._death()} after {time.monotonic() - started:.1f} s"
        self.stop()
        return why

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
