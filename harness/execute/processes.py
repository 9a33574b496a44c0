"""Worker processes: where a crash, an exit or a hang cannot end the run.

A backend in the same process can end the run in ways no ``except`` catches:
``os._exit(0)``, a segfault (``ctypes.string_at(0)``, an out-of-bounds read in native
code), or a call that never returns. A worker is a process started with ``multiprocessing``'s
spawn (it shares no state with the parent) running :func:`_worker_main`: it imports the plugins
(:func:`worker_setup`), says it is ready, then runs each case it is sent through the one loop
(:func:`harness.execute.loop.timed_case`) and sends every event back. The same worker serves
the isolated backends of a one-process run (:class:`Worker`, one at a time) and each slot of
``--workers`` (:mod:`harness.execute.workers`, with its own GPU: :func:`spawn`). The parent's
:class:`harness.execute.loop.Tracker` makes a death an error row naming the signal or exit
code, and a call past its limit a killed worker and an error row "timed out after N s"; the
next call starts a fresh worker (which rebuilds the case's inputs): the run goes on.

Which backends run isolated is the run's choice (``--isolate``): by default the plugins (code
from outside this repository; the built-ins are this repository's own torch code, and
isolating them would build every case's inputs and float64 oracle twice on the CPU).

A worker ignores SIGINT from its first instruction (it is started with SIGINT ignored, which
the new interpreter keeps): the user's Ctrl-C goes to the parent, which stops the workers and
reports one line, never a child's traceback. A worker dies with its parent
(:func:`die_with_parent`), so a killed run leaves no worker behind. ``--profile`` of an isolated
backend runs in the worker too.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import multiprocessing
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

import kernels
from harness.backends.builtin import REGISTRY, load_plugin
from harness.execute.loop import CONTEXT, Contexts, Task, Tracker, row_limit, timed_case
from harness.run.profiling import profile_pairs
from harness.run.runner import RunConfig, error_reason
from harness.timing import ceilings
from harness.timing.phases import absorb, take_phases

START_TIMEOUT_S = 300.0  # importing torch, kernels and the plugins on a busy laptop
DEFAULT_TIMEOUT_S = 600.0  # of one --profile of an isolated backend, unless --timeout or the case's timeout_s
DIED, TIMED_OUT = "died", "timed out"  # what Worker.receive returns instead of a message


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


_LOADED: set[str] = set()  # plugins imported in this (long-lived) worker process


def worker_setup(plugins: tuple[str, ...], threads: int | None, config: RunConfig | None = None) -> dict:
    """What a worker does once, before its first case: the Triton interpreter where there is no
    GPU, its torch threads, the plugins, and (given the run's ``config``) its own device's name and
    ceilings (:func:`harness.timing.ceilings.own_device`, measured once per process, on CUDA when
    timing): the report the parent records per GPU (meta.json's ``gpus``)."""
    kernels.use_interpreter_if_no_gpu()
    if threads:
        torch.set_num_threads(threads)
    for plugin in plugins:
        if plugin not in _LOADED:
            load_plugin(plugin)
            _LOADED.add(plugin)
    if config is None:
        return {"gpu_name": "", "ceilings": {}, "measure_s": 0.0}
    dtypes = sorted(config.ceiling_dtypes or config.ceilings.get("matmul_tflops") or {})  # the run's dtypes
    return ceilings.own_device(config.device, dtypes, config.timing)


def _worker_main(conn, plugins, threads, device_config, labels: dict, parent_pid: int) -> None:
    """Answer ("ready", pid, device report) once (or "plugin_error"), then for each ("case", case, names,
    config) its events and "done" (:func:`harness.execute.loop.timed_case`; "poisoned" when the oracle
    cache check failed), for each ("profile", case, name, config, folder) the trace paths; "stop" ends it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns Ctrl-C and stops the workers
    die_with_parent(parent_pid)  # a SIGKILLed run leaves no worker behind
    try:
        device = worker_setup(plugins, threads, device_config)
    except BaseException as error:
        cause = error.__cause__ if isinstance(error, ValueError) and error.__cause__ else error
        conn.send(("plugin_error", f"{type(cause).__name__}: {cause}"))
        return
    conn.send(("ready", os.getpid(), device))
    contexts = Contexts()
    while True:
        free = time.perf_counter()
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "stop":
            return
        if message[0] == "profile":
            _, case, name, config, folder = message
            try:
                paths = profile_pairs([(case, REGISTRY[name])], config.device, config.oracle_device, Path(folder))
                conn.send(("profiled", [str(path) for path in paths], take_phases()))
            except BaseException as error:
                conn.send(("error", error_reason(error), take_phases()))
            continue
        _, case, names, config = message
        if device["ceilings"]:  # its rows are judged against its own GPU's
            config = dataclasses.replace(config, ceilings=device["ceilings"])
        for event in timed_case(case, names, config, contexts, labels, time.perf_counter() - free):
            conn.send(event)


def spawn(context, gpu: str, name: str, args: tuple) -> tuple[multiprocessing.Process, Any]:
    """Start a worker (:func:`_worker_main` with ``args``), seeing only ``gpu`` when one is given
    (``CUDA_VISIBLE_DEVICES`` in the environment it is spawned with, so before its torch initialises
    CUDA); the process and this end of its pipe."""
    parent, child = context.Pipe()
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    if gpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu  # inherited by the spawned interpreter
    try:
        process = context.Process(target=_worker_main, args=(child, *args, os.getpid()), daemon=True, name=name)
        with sigint_ignored_in_children():  # a Ctrl-C while it imports is the parent's one line
            process.start()
    finally:
        if gpu:
            if saved is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = saved
    child.close()
    return process, parent


class Worker:
    """One worker process at a time for a one-process run's isolated backends; see the module docstring."""

    def __init__(self, plugins: tuple[str, ...] = (), threads: int | None = None):
        self.plugins, self.threads = tuple(plugins), threads  # threads: the run's (what its rows record)
        self.process = self.conn = None

    def start(self) -> None:
        """Start the worker and import the plugins there. PluginImportError."""
        context = multiprocessing.get_context("spawn")
        self.process, self.conn = spawn(context, "", "harness-isolated", (self.plugins, self.threads, None, {}))
        try:
            reply = self.receive(START_TIMEOUT_S)
        except BaseException:  # the user's Ctrl-C while it imports: no worker is left behind
            self.stop()
            raise
        if reply in (DIED, TIMED_OUT) or reply[0] != "ready":
            if reply == TIMED_OUT:
                why = f"importing took more than {START_TIMEOUT_S:g} s"
            else:
                why = reply[1] if reply != DIED else f"the worker {self.stop()} while importing"
            self.stop()
            raise PluginImportError(f"{', '.join(self.plugins) or 'the worker'}: {why}")

    def receive(self, timeout_s: float | None) -> Any:
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

    def stop(self) -> str:
        """Kill the worker (if alive) and forget it; how it ended ('killed by SIGKILL'). The next call starts
        a fresh one."""
        how = "was not running"
        if self.process is not None:
            if self.process.is_alive():
                self.process.kill()
            self.process.join(timeout=10)
            how = describe_exit(self.process.exitcode)
        if self.conn is not None:
            self.conn.close()
        self.process = self.conn = None
        return how

    def _ensure(self) -> None:
        if self.process is None or not self.process.is_alive():
            self.stop()
            self.start()

    def run_case(self, task: Task, config: RunConfig, tracker: Tracker) -> None:
        """Every backend of ``task`` through the worker, its events to ``tracker``: after a death or a
        hang, the backends left go to a fresh worker, until each has a row."""
        tracker.skip_hung(task)
        while task.names:
            self._ensure()
            self.conn.send(("case", task.case, list(task.names), config))
            while True:
                limit = row_limit(task.case, config) if task.running not in (None, CONTEXT) else None
                reply = self.receive(None if limit is None else task.since + limit - time.monotonic())
                if reply == TIMED_OUT:
                    self.stop()
                    tracker.timed_out(task, limit, "isolated; the worker was killed")
                    break
                if reply == DIED:
                    tracker.died(task, f"the worker process {self.stop()}")
                    break
                tracker.event(task, reply)
                if reply[0] == "done":
                    absorb(reply[3])  # the worker's phases count as this process's (meta.json's scale)
                    return
            tracker.skip_hung(task)

    def profile(self, case, backend: str, config: RunConfig, folder: Path, timeout_s: float) -> list[str] | str:
        """``--profile`` of an isolated backend, run in the worker: the trace paths, or why there are none."""
        try:
            self._ensure()
        except PluginImportError as error:
            return str(error)
        self.conn.send(("profile", case, backend, dataclasses.replace(config, backends=[], progress=False),
                        str(folder)))  # fmt: skip
        reply = self.receive(timeout_s)
        if reply == TIMED_OUT:
            self.stop()
            return f"timed out after {timeout_s:g} s (isolated; the worker was killed)"
        if reply == DIED:
            return f"the worker process {self.stop()}"
        absorb(reply[2])
        return reply[1]
