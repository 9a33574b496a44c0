"""Worker processes: where a crash, an exit or a hang cannot end the run (an error row; the next call
starts a fresh worker). A worker imports the plugins, runs what it is sent and sends events back as
``torch.save`` of plain values, read with ``weights_only=True``; it never holds the oracle."""

import contextlib
import ctypes
import dataclasses
import io
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
from harness.backends.registry import PluginLoadError
from harness.execute.loop import CONTEXT, Contexts, Task, Tracker, row_limit, timed_case
from harness.execute.output import captured_output, row_log
from harness.execute.sandbox import wall_off
from harness.run.calling import Called, call_backend
from harness.run.oracle_cache import cache_dir
from harness.run.profiling import profile_pairs
from harness.run.runner import (
    CaseContext,
    RunConfig,
    build_context,
    error_reason,
    flip_seeds,
    grade_called,
    row_without_call,
)
from harness.timing import ceilings
from harness.timing.measure import TimingSettings
from harness.timing.phases import absorb, take_phases

START_TIMEOUT_S = 300.0  # importing torch, kernels and the plugins on a busy laptop
DEFAULT_TIMEOUT_S = 600.0  # of one --profile of an isolated backend, unless --timeout or the case's timeout_s
DIED, TIMED_OUT = "died", "timed out"  # what Worker.receive returns instead of a message
PR_SET_PDEATHSIG = 1  # linux/prctl.h
BATCH_S, BATCH_MIN, BATCH_MAX = 0.02, 10, 1000  # the back-to-back batch the driver times: about 20 ms of calls
_LOADED: set[str] = set()  # plugins imported in this (long-lived) worker process
_INPUTS: dict[str, CaseContext] = {}  # a plugin worker's last case: inputs and guard, no oracle


class PluginImportError(Exception):
    """A plugin could not be imported in the worker (it raised, exited or crashed)."""


def describe_exit(exitcode: int | None) -> str:
    """'killed by SIGSEGV' / 'exited with code 0' for a process's exit code."""
    if exitcode is None:
        return "stopped answering"
    if exitcode >= 0:
        return f"exited with code {exitcode}"
    with contextlib.suppress(ValueError):  # a signal Python has no name for
        return f"killed by {signal.Signals(-exitcode).name}"
    return f"killed by signal {-exitcode}"


def encode(message) -> bytes:
    buffer = io.BytesIO()
    torch.save(message, buffer)
    return buffer.getvalue()


def decode(data: bytes):
    """A worker's message; ``weights_only`` loads plain values and tensors and runs no code."""
    return torch.load(io.BytesIO(data), weights_only=True)


def cpu_seconds(pid: int) -> float | None:
    """CPU seconds of all a process's threads from ``/proc/PID/task/*/schedstat`` (None without it): the
    process cannot change it, and a busy machine does not inflate it."""
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += int((task / "schedstat").read_text().split()[0])
    except OSError:
        return None
    return total / 1e9


def registrations() -> list[dict]:
    """The plugins' backends here as plain values, what the driver learns in place of importing (of a plan
    step or a supports hook, only that there is one)."""
    return [{"name": b.name, "devices": list(b.devices), "description": b.description, "graphable": b.graphable,
             "variants": sorted(b.variants), "limits": b.limits.to_plain(), "plan": b.plan_step,
             "supports": b.supports_hook} for b in REGISTRY.values() if b.kind == "plugin"]  # fmt: skip


def worker_setup(plugins: tuple[str, ...], threads: int | None, config: RunConfig | None = None) -> dict:
    """A worker's setup: the interpreter where there is no GPU, threads, plugins, its device's name and ceilings;
    without a ``config`` it serves plugins: it walls off the oracle cache and the source first."""
    kernels.use_interpreter_if_no_gpu()
    if threads:
        torch.set_num_threads(threads)
    walls = ""
    if config is None and plugins:
        hidden = [folder for folder in [cache_dir()] if folder is not None]
        walls = wall_off(hidden, [Path(__file__).resolve().parents[1]])
    for plugin in plugins:
        if plugin not in _LOADED:
            load_plugin(plugin)
            _LOADED.add(plugin)
    if config is None:
        return {"gpu_name": "", "ceilings": {}, "measure_s": 0.0, "walls": walls, "backends": registrations()}
    dtypes = sorted(config.ceiling_dtypes or config.ceilings.get("matmul_tflops") or {})  # the run's dtypes
    return ceilings.own_device(config.device, dtypes, config.timing)


def _worker_main(conn, plugins, threads, device_config, labels: dict, parent_pid: int) -> None:
    """Answer ("ready", pid, device report) once (or "plugin_error"), then for each ("case", case, names,
    config) its events and "done" (:func:`harness.execute.loop.timed_case`; "poisoned" when the oracle
    cache check failed), for each ("profile", case, name, config, folder) the trace paths; "stop" ends it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns Ctrl-C and stops the workers
    if sys.platform.startswith("linux"):  # a SIGKILLed run leaves no worker behind: the kernel kills it too
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before that: nothing would kill this worker
        os._exit(1)
    try:
        device = worker_setup(plugins, threads, device_config)
    except BaseException as error:
        why = error.detail if isinstance(error, PluginLoadError) else f"{type(error).__name__}: {error}"
        conn.send_bytes(encode(("plugin_error", why)))
        return
    conn.send_bytes(encode(("ready", os.getpid(), device)))
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
                conn.send_bytes(encode(("profiled", [str(path) for path in paths], take_phases())))
            except BaseException as error:
                conn.send_bytes(encode(("error", error_reason(error), take_phases())))
            continue
        if message[0] == "call":
            _calls(conn, *message[1:], time.perf_counter() - free)
            continue
        _, case, names, config = message
        if device["ceilings"]:  # its rows are judged against its own GPU's
            config = dataclasses.replace(config, ceilings=device["ceilings"])
        for event in timed_case(case, names, config, contexts, labels, time.perf_counter() - free):
            conn.send_bytes(encode(event))


def _calls(conn, case, names: list[str], config: RunConfig, seeds: dict, waited_s: float) -> None:
    """A plugin worker's answer to ("call", case, names, config, seeds): for each backend ("start", name),
    ("batch", name, calls) and ("batched", name) around the back-to-back batch the driver times, then
    ("called", name, what its calls gave); then ("done", ...) as :func:`timed_case` ends."""
    started = time.perf_counter()
    take_phases()
    if case.id not in _INPUTS:
        _INPUTS.clear()
        if config.device.startswith("cuda"):
            torch.cuda.empty_cache()
        conn.send_bytes(encode(("start", CONTEXT)))
        _INPUTS[case.id] = build_context(case, config.device, config.oracle_device, oracle=False)
    ctx = _INPUTS[case.id]
    for name in names:
        conn.send_bytes(encode(("start", name)))
        backend = REGISTRY[name]
        settings = TimingSettings(config.device, config.ceilings, threads=config.threads).for_backend(backend)

        def batch(prepared, called: Called, name: str = name) -> None:
            call = prepared.call or prepared.run
            median_us = (called.timing.get("call_us") or 0) or 1e3
            calls = int(min(BATCH_MAX, max(BATCH_MIN, BATCH_S / (median_us * 1e-6))))
            conn.send_bytes(encode(("batch", name, calls)))
            for _ in range(calls):
                call()
            if config.device.startswith("cuda"):
                torch.cuda.synchronize()
            conn.send_bytes(encode(("batched", name)))

        log = row_log(config, case.id, name)
        with captured_output(log[0] if log else None):
            called = call_backend(case, ctx.inputs, ctx.guard, backend, config.device,
                                  settings if config.timing else None, tuple(seeds[name]), batch=batch)  # fmt: skip
        conn.send_bytes(encode(("called", name, called.to_message())))
    conn.send_bytes(encode(("done", waited_s, time.perf_counter() - started, take_phases())))


def spawn(context, gpu: str, name: str, args: tuple) -> tuple[multiprocessing.Process, Any]:
    """Start :func:`_worker_main` with ``args``, seeing only ``gpu`` if given; the process and this end of its
    pipe. SIGINT is ignored while it starts: a Ctrl-C during its imports is the parent's one line."""
    parent, child = context.Pipe()
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    if gpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu  # inherited by the spawned interpreter
    try:
        process = context.Process(target=_worker_main, args=(child, *args, os.getpid()), daemon=True, name=name)
        process.start()
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
        if gpu and saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        elif gpu:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved
    child.close()
    return process, parent


class Worker:
    """One worker process at a time for a one-process run's isolated backends; see the module docstring."""

    def __init__(self, plugins: tuple[str, ...] = (), threads: int | None = None):
        self.plugins, self.threads = tuple(plugins), threads  # threads: the run's (what its rows record)
        self.process = self.conn = None
        self.backends: list[dict] = []  # the plugins' registrations, as the worker reported them
        self.walls = ""  # '' when the worker walled off the oracle cache and the source; else why not

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
                why = f"the worker {self.stop()} while importing" if reply == DIED else reply[1]
            self.stop()
            raise PluginImportError(f"{', '.join(self.plugins) or 'the worker'}: {why}")
        self.backends, self.walls = reply[2].get("backends", []), reply[2].get("walls", "")

    def receive(self, timeout_s: float | None) -> Any:
        """The worker's next message; DIED when it died (EOF), TIMED_OUT when the time ran out."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            wait = 1.0 if deadline is None else min(1.0, max(deadline - time.monotonic(), 0))
            try:
                if self.conn.poll(wait):
                    return self._read()
                if not self.process.is_alive():  # it may have answered just before dying
                    return self._read() if self.conn.poll(0) else DIED
            except (EOFError, OSError):
                return DIED
            if deadline is not None and time.monotonic() >= deadline:
                return TIMED_OUT

    def _read(self):
        """The next message; a message that is not plain values is the worker's fault: it is stopped (DIED)."""
        data = self.conn.recv_bytes()
        try:
            return decode(data)
        except Exception:  # not a torch.save of plain values: nothing of it is used
            self.stop()
            return DIED

    def stop(self) -> str:
        """Kill the worker (if alive) and forget it; how it ended ('killed by SIGKILL')."""
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

    def call_case(self, task: Task, config: RunConfig, tracker: Tracker, ctx: CaseContext | str) -> None:
        """Every backend of ``task`` called in the worker and graded here against ``ctx`` (a str: why it could
        not be built, an error row each); after a death or a hang the backends left go to a fresh worker."""
        tracker.skip_hung(task)
        if isinstance(ctx, str):
            for name in list(task.names):
                tracker.made(task, name, "error", ctx)
            return
        seeds = {name: flip_seeds() for name in task.names}  # drawn here, sent with the case
        started, batches = {}, {}  # per backend: its batch's (calls, start, CPU s) while it runs, then its timing
        while task.names:
            self._ensure()
            self.conn.send(("call", task.case, list(task.names), config, {n: seeds[n] for n in task.names}))
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
                kind = reply[0]
                if kind == "batch":
                    started[reply[1]] = (int(reply[2]), time.monotonic(), cpu_seconds(self.process.pid))
                elif kind == "batched" and reply[1] in started:
                    calls, since, cpu = started.pop(reply[1])
                    busy = cpu_seconds(self.process.pid) - cpu if cpu is not None else None
                    batches[reply[1]] = (calls, time.monotonic() - since, busy, config.threads or os.cpu_count() or 1)
                elif kind == "called":
                    name = reply[1]
                    if name not in task.names:
                        continue  # a name it was not asked for: nothing of it is used
                    try:
                        called = Called.from_message(reply[2])
                        row = grade_called(ctx, REGISTRY[name], config, called, seeds[name], batches.get(name))
                    except Exception as error:  # a message of the wrong shape: the worker's fault
                        row = {**row_without_call(task.case, REGISTRY[name], config, "error",
                                                  f"its worker sent a malformed result: {error_reason(error)}")}  # fmt: skip
                    tracker.event(task, ("row", {**row, **task.labels}))
                else:
                    tracker.event(task, reply)
                    if kind == "done":
                        absorb(reply[3])
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
