"""A run sharded over worker processes: one per GPU of the host (or N on a CPU).

``harness run --workers N|auto`` hands each case to a worker process, which builds the
case's inputs and float64 oracle once (:func:`harness.run.runner.build_context`, through the
shared oracle cache), runs :func:`harness.run.runner.run_backend` for each backend, and sends
each row back as it finishes. The parent writes every row to the run's journal (``on_row``)
and ``cmd_run`` writes the one run folder, exactly as for a one-process run.

* **Pinning.** On CUDA, worker ``i`` is started with ``CUDA_VISIBLE_DEVICES`` set to the
  ``i``-th visible GPU (set in the environment it is spawned with, so before its torch
  ever initialises CUDA); ``auto`` is one worker per visible GPU; more workers than GPUs
  share them round robin (small cases that leave a GPU idle). On a CPU, ``auto`` is one
  worker per core. On either, the run's torch threads (or every core) are split between
  the workers (``max(1, threads // N)`` each, :func:`worker_threads`).
* **Order.** Cases go out longest first, by an estimate of their cost,
  ``flops(case) + bytes_moved(case)`` (:mod:`harness.timing.metrics`): the oracle and the kernels
  scale with the first, decode with the second. Each worker is sent ``PREFETCH`` (2) cases
  ahead, so it never waits on the parent between cases (while at least as many cases as
  workers are left; then one at a time, so no worker sits on a queued case while another
  idles). The run folder's rows are in case order
  whatever order they finished in (``cmd_run`` sorts them).
* **Rows** carry ``host``, ``gpu_index`` (the physical GPU, "" on a CPU), ``worker`` and, on
  CUDA, ``gpu_name``.
* **Each GPU's ceilings.** A CUDA worker measures its own GPU's ceilings once, as it starts
  (:func:`harness.timing.ceilings.own_device`: 0.3 s of timing each for read, copy and one matmul
  per dtype, when timing), and reports them with its name; its rows' ``pct_of_ceiling``
  and ``pct_of_peak`` are against them (:class:`harness.timing.ceilings.GpuLedger`), and
  meta.json's ``gpus`` lists every GPU's.
* **Overheads**, measured and kept in meta.json's ``scale`` (:meth:`ShardedRun.timings`):
  each worker's start (spawn to ready, its ceilings included), the time workers waited
  for a case (dispatch), the time the cases took, and that time by phase (``phase_s``:
  inputs, oracle, guard, graded call, grade, timing; :mod:`harness.timing.phases`).
* **A worker that dies** (killed, out of memory, a segfault in a kernel) loses only the
  row it was computing: the worker tells the parent which backend it starts, so its rows
  already sent are kept, cases sent ahead and not started go back to the queue untouched,
  the backend that was running is retried once on another worker
  (with the case's backends that had not run yet), and a second death on that same
  backend is an ``error`` row naming how the worker died. A death while building the
  inputs/oracle counts against every remaining backend of the case. A row that runs past
  its time limit (:func:`harness.execute.processes.row_limit`: ``case.timeout_s``,
  ``--timeout``, else the row's expected cost, generously, with a 60 s floor) kills the
  worker and is an ``error`` row at once (a hang is not retried), and its backend is hung
  for the rest of the run: its rows not yet run are skips "hung on <case> after N s; not
  run" (a worker that starts it on a case sent ahead is stopped and restarted). A hang
  costs one time limit. The run completes either way.
* Plugins are imported in every worker (they are then run in-process there: the worker
  is the isolation).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import wait

import kernels
from harness.backends.builtin import REGISTRY, load_plugin
from harness.cases.spec import Case
from harness.execute.processes import Hung, describe_exit, die_with_parent, row_limit, sigint_ignored_in_children
from harness.run.runner import build_context, error_reason, row_without_call, run_backend
from harness.timing import ceilings
from harness.timing.ceilings import GpuLedger
from harness.timing.metrics import case_cost
from harness.timing.phases import add_phases, rounded, take_phases

START_TIMEOUT_S = 300.0
MAX_FAILED_STARTS = 3  # workers dying before they are ready (a broken install): the run stops
PREFETCH = 2  # cases sent to a worker ahead of the one it runs: no parent round trip between cases
RETRIES = 1  # a backend whose worker died is run again this many times, then it is an error row
CONTEXT = "building inputs/oracle"  # what a worker does before its first backend of a case
EXTRA_COLUMNS = ("host", "gpu_index", "worker")


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries ('0', '1', or UUIDs)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [entry.strip() for entry in listed.split(",") if entry.strip() and entry.strip() != "-1"]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def worker_count(value: str | int, device: str, threads: int | None = None) -> int:
    """``--workers`` as a number: ``auto`` is one per visible GPU (CUDA) or per core (CPU)."""
    if str(value) == "auto":
        if device.startswith("cuda"):
            return max(1, len(visible_gpus()))
        return max(1, (os.cpu_count() or 1) // max(1, threads or 1))
    text = str(value)
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"--workers {value}: give a positive integer or 'auto'")
    return int(text)


# --- the worker process ---------------------------------------------------------------------

_LOADED: set[str] = set()  # plugins imported in this (long-lived) worker process


def worker_setup(config, plugins: tuple[str, ...], threads: int | None):
    """What a worker does once, before its first case: the Triton interpreter where there is no
    GPU, its torch threads, the plugins, and its own device's name and ceilings
    (:func:`harness.timing.ceilings.own_device`, measured once per process, on CUDA when timing).

    Returns the config its rows are made with (its own GPU's ceilings) and the device report
    the parent records per GPU (meta.json's ``gpus``).
    """
    kernels.use_interpreter_if_no_gpu()
    import torch

    if threads:
        torch.set_num_threads(threads)
    for plugin in plugins:
        if plugin not in _LOADED:
            load_plugin(plugin)
            _LOADED.add(plugin)
    dtypes = sorted(config.ceiling_dtypes or config.ceilings.get("matmul_tflops") or {})  # the run's dtypes
    report = ceilings.own_device(config.device, dtypes, config.timing)
    if report["ceilings"]:
        config = dataclasses.replace(config, ceilings=report["ceilings"])
    return config, report


def case_events(case: Case, names: list[str], config, labels: dict) -> Iterator[tuple]:
    """A case's work in a worker, as events: ``("start", what)`` before each step (``CONTEXT``,
    then each backend), ``("row", row)`` after each backend (skips first, with no start).

    The inputs and oracle are built once for the case's backends; a failure there is an error
    row for each of them. Shared by the worker processes here and the Ray tasks.
    """
    import torch

    to_run = []
    for backend in (REGISTRY[name] for name in names):
        if reason := backend.skip_reason(case, config.device):
            yield "row", {**row_without_call(case, backend, config, "skip", reason), **labels}
        else:
            to_run.append(backend)
    if not to_run:
        return
    yield "start", CONTEXT
    try:
        ctx = build_context(case, config.device, config.oracle_device)
    except Exception as error:
        reason = f"{CONTEXT}: {error_reason(error)}"
        for backend in to_run:
            yield "row", {**row_without_call(case, backend, config, "error", reason), **labels}
        return
    for backend in to_run:
        yield "start", backend.name
        yield "row", {**run_backend(ctx, backend, config), **labels}
    del ctx
    if torch.device(config.device).type == "cuda":
        torch.cuda.empty_cache()  # the next case's oracle may want one large block


def _worker_main(conn, config, plugins: tuple[str, ...], threads: int | None, labels: dict, parent_pid: int) -> None:
    """Answer ('ready', pid, device) once, then for each ('case', case, names) its events and
    ('done', waited_s, busy_s, phases): how long it waited for the case, how long the case took,
    and where that time went (:mod:`harness.timing.phases`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns Ctrl-C and stops the workers
    die_with_parent(parent_pid)  # a SIGKILLed run leaves no worker behind
    config, device = worker_setup(config, plugins, threads)
    conn.send(("ready", os.getpid(), device))
    while True:
        free = time.perf_counter()
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "stop":
            return
        _, case, names = message
        started = time.perf_counter()
        take_phases()  # the case's phases only
        for event in case_events(case, names, config, labels):
            conn.send(event)
        conn.send(("done", started - free, time.perf_counter() - started, take_phases()))


# --- the parent -----------------------------------------------------------------------------


@dataclass
class _Task:
    """A case and the backends of it still without a row; deaths counted per backend."""

    case: Case
    backends: list[str]
    deaths: dict[str, int] = field(default_factory=dict)
    avoid: int | None = None  # the worker slot it last died on


@dataclass
class _Slot:
    index: int
    gpu: str  # "" on a CPU
    process: multiprocessing.Process | None = None
    conn: object = None
    tasks: list[_Task] = field(default_factory=list)  # sent to the worker, in order; the first is running
    running: str | None = None  # the backend (or CONTEXT) it has started
    since: float = 0.0  # when it started it
    ready: bool = False
    started_at: float = 0.0

    @property
    def task(self) -> _Task | None:
        """The case the worker is on (the first sent and not done)."""
        return self.tasks[0] if self.tasks else None


class ShardedRun:
    """Run cases over worker processes; see the module docstring."""

    def __init__(self, config, workers: int, plugins: Iterable[str] = (), threads: int | None = None):
        self.config = config
        self.workers = workers
        self.plugins = tuple(plugins)
        self.threads = threads
        self.host = socket.gethostname()
        self.gpus = visible_gpus() if config.device.startswith("cuda") else []
        self.slots = [_Slot(i, self.gpus[i % len(self.gpus)] if self.gpus else "") for i in range(workers)]
        self.context = multiprocessing.get_context("spawn")
        self.worker_config = dataclasses.replace(config, backends=[], progress=False, isolated=frozenset())
        self.start_seconds: list[float] = []  # spawn -> ready, per worker start (measured)
        self.measure_seconds: list[float] = []  # of which measuring the worker's own GPU's ceilings
        self.waited_seconds: list[float] = []  # per case: a worker free, waiting for it (dispatch)
        self.busy_seconds: list[float] = []  # per case: inputs, oracle and every backend of it
        self.phase_seconds: dict[str, float] = {}  # busy_seconds by phase (harness.timing.phases), summed
        self.failed_starts = 0
        self.ledger = GpuLedger()  # each GPU's name and ceilings, as its worker measured them
        self.hung = Hung()

    def labels(self, slot: _Slot) -> dict:
        return {"host": self.host, "gpu_index": slot.gpu, "worker": slot.index}

    # -- processes

    def _start(self, slot: _Slot) -> None:
        parent, child = self.context.Pipe()
        threads = self.threads
        saved = os.environ.get("CUDA_VISIBLE_DEVICES")
        if slot.gpu:
            os.environ["CUDA_VISIBLE_DEVICES"] = slot.gpu  # inherited by the spawned interpreter
        try:
            process = self.context.Process(
                target=_worker_main,
                args=(child, self.worker_config, self.plugins, threads, self.labels(slot), os.getpid()),
                daemon=True,
                name=f"harness-worker-{slot.index}",
            )
            with sigint_ignored_in_children():  # a Ctrl-C while it imports is the parent's one line
                process.start()
        finally:
            if slot.gpu:
                if saved is None:
                    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
                else:
                    os.environ["CUDA_VISIBLE_DEVICES"] = saved
        child.close()
        slot.process, slot.conn, slot.ready = process, parent, False
        slot.tasks, slot.running = [], None
        slot.started_at = time.monotonic()

    def _stop(self, slot: _Slot) -> str:
        """Kill (if alive) and reap; how it ended, e.g. 'killed by SIGKILL'."""
        if slot.process is None:
            return "was not running"
        if slot.process.is_alive():
            slot.process.kill()
        slot.process.join(timeout=10)
        how = describe_exit(slot.process.exitcode)
        if slot.conn is not None:
            slot.conn.close()
        slot.process = slot.conn = None
        slot.ready = False
        return how

    def stop_all(self, wait: bool = True) -> None:
        """Ask idle workers to exit, kill busy ones; ``wait=False`` (every row is in): reap them on a
        daemon thread while the driver writes the run folder, since a CUDA worker's exit (its context
        torn down) takes a while and nothing waits on it."""
        for slot in self.slots:
            if slot.process is not None and slot.process.is_alive() and not slot.tasks and slot.conn is not None:
                with contextlib.suppress(OSError):
                    slot.conn.send(("stop",))
        if wait:
            self._reap()
        else:
            threading.Thread(target=self._reap, name="reap-workers", daemon=True).start()

    def _reap(self) -> None:
        for slot in self.slots:
            if slot.process is not None and slot.process.is_alive() and not slot.tasks:
                slot.process.join(timeout=5)
            self._stop(slot)

    # -- scheduling

    def run(
        self, cases: Iterable[Case], on_row: Callable[[dict], None], done: Collection[tuple[str, str]] = ()
    ) -> None:
        """Every (case, backend) pair not in ``done`` through the workers; each row to ``on_row``."""
        done = set(done)
        names = [b.name for b in self.config.backends]
        queue: collections.deque[_Task] = collections.deque()
        for case in sorted(cases, key=case_cost, reverse=True):
            todo = [n for n in names if (case.id, n) not in done]
            if todo:
                queue.append(_Task(case, todo))
        if not queue:
            return
        for slot in self.slots[: max(1, min(len(self.slots), len(queue)))]:
            self._start(slot)
        finished = False
        try:
            while queue or any(s.tasks for s in self.slots):
                self._assign(queue, on_row)
                self._poll(queue, on_row)
            finished = True
        finally:
            self.stop_all(wait=not finished)

    def _assign(self, queue: collections.deque[_Task], on_row: Callable[[dict], None]) -> None:
        """Keep each worker PREFETCH cases ahead (one when few cases are left: no idle tail). A hung
        backend's rows of a case are skips, made here; a case left with none is not sent."""
        for task in list(queue):
            for name in [n for n in task.backends if self.hung.reason(n)]:
                on_row(self._row(task.case, name, None, "skip", self.hung.reason(name)))
                task.backends.remove(name)
            if not task.backends:
                queue.remove(task)
        depth = PREFETCH if len(queue) >= len(self.slots) else 1
        alone = sum(s.process is not None for s in self.slots) == 1
        for slot in self.slots:
            while slot.process is not None and queue and len(slot.tasks) < depth:
                pick = next((t for t in queue if t.avoid != slot.index or alone), None)
                if pick is None:
                    break
                queue.remove(pick)
                slot.tasks.append(pick)
                slot.conn.send(("case", pick.case, list(pick.backends)))

    def _poll(self, queue: collections.deque[_Task], on_row: Callable[[dict], None]) -> None:
        live = [s for s in self.slots if s.process is not None]
        handles = {s.conn: (s, s.process) for s in live} | {s.process.sentinel: (s, s.process) for s in live}
        for ready in wait(list(handles), timeout=0.5):
            slot, process = handles[ready]
            if slot.process is not process:
                continue  # already handled through its other handle (and perhaps restarted)
            if ready is slot.conn:
                self._drain(slot, queue, on_row)
            elif not slot.conn.poll(0):  # dead with nothing left to read
                self._died(slot, queue, on_row, f"the worker process {self._stop(slot)}")
        now = time.monotonic()
        for slot in self.slots:
            if slot.process is None:
                continue
            if not slot.ready and now - slot.started_at > START_TIMEOUT_S:
                raise RuntimeError(f"worker {slot.index} did not start within {START_TIMEOUT_S:g} s")
            if slot.task and slot.running not in (None, CONTEXT):
                limit = row_limit(slot.task.case, self.config)
                if now - slot.since > limit:
                    self._stop(slot)
                    self.hung.mark(slot.running, slot.task.case.id, limit)
                    reason = f"timed out after {limit:g} s (the worker was killed); hung: its later rows are skipped"
                    self._abandon(slot, queue, on_row, self._row(slot.task.case, slot.running, slot, "error", reason))

    def _drain(self, slot: _Slot, queue, on_row) -> None:
        while slot.conn is not None and slot.conn.poll(0):
            try:
                message = slot.conn.recv()
            except (EOFError, OSError):
                self._died(slot, queue, on_row, f"the worker process {self._stop(slot)}")
                return
            kind = message[0]
            if kind == "ready":
                slot.ready = True
                self.start_seconds.append(time.monotonic() - slot.started_at)
                self.measure_seconds.append(message[2]["measure_s"])
                self.ledger.add(self.host, slot.gpu, slot.index, message[2])
            elif kind == "start":
                slot.running, slot.since = message[1], time.monotonic()
                if reason := self.hung.reason(slot.running):  # a case sent ahead before the backend hung
                    self._stop(slot)
                    self._abandon(slot, queue, on_row, self._row(slot.task.case, slot.running, slot, "skip", reason))
                    return
            elif kind == "row":
                row = message[1]
                if slot.task and row["backend"] in slot.task.backends:
                    slot.task.backends.remove(row["backend"])
                slot.running = None
                on_row(self.ledger.apply(row))
            elif kind == "done":
                slot.tasks.pop(0)
                slot.running = None
                self.waited_seconds.append(message[1])
                self.busy_seconds.append(message[2])
                self.phase_seconds = add_phases(self.phase_seconds, message[3])

    def _died(self, slot: _Slot, queue, on_row, how: str) -> None:
        """The worker died: keep its sent rows, retry the rest once elsewhere, then error rows."""
        task, running, waiting = slot.task, slot.running, slot.tasks[1:]
        if not slot.ready:
            self.failed_starts += 1
            if self.failed_starts > MAX_FAILED_STARTS:
                raise RuntimeError(f"worker processes keep dying before they are ready (last: {how})")
        self._stop(slot)
        slot.tasks, slot.running = [], None
        queue.extendleft(reversed(waiting))  # sent ahead, not started: back in the queue, untouched
        if task is not None:
            blamed = list(task.backends) if running in (CONTEXT, None) else [running]  # None: between calls
            errors = []
            for name in blamed:
                task.deaths[name] = task.deaths.get(name, 0) + 1
                if task.deaths[name] > RETRIES:
                    errors.append(name)
            for name in errors:
                what = "running this backend" if running == name else f"{CONTEXT} (or between calls)"
                reason = f"{how} while {what}, on {task.deaths[name]} workers (retried {RETRIES}x)"
                on_row(self._row(task.case, name, slot, "error", reason))
                task.backends.remove(name)
            if task.backends:
                task.avoid = slot.index
                queue.appendleft(task)
        if queue or any(s.tasks for s in self.slots):
            self._start(slot)

    def _abandon(self, slot: _Slot, queue, on_row, row: dict) -> None:
        """The stopped worker's running backend gets ``row`` (timed out, or hung before); the rest of its
        case and the cases sent ahead go back to the queue, and a fresh worker takes the slot."""
        task, running, waiting = slot.task, slot.running, slot.tasks[1:]
        slot.tasks, slot.running = [], None
        queue.extendleft(reversed(waiting))
        on_row(row)
        task.backends.remove(running)
        if task.backends:
            queue.appendleft(task)
        self._start(slot)

    def _row(self, case: Case, name: str, slot: _Slot | None, status: str, reason: str) -> dict:
        """A row made without a call (error, or a hung backend's skip); ``slot`` None: no worker ran it."""
        labels = self.labels(slot) if slot is not None else {"host": self.host}
        return self.ledger.apply({**row_without_call(case, REGISTRY[name], self.config, status, reason), **labels})

    def timings(self) -> dict:
        """Where a sharded run's time went besides the cases (meta.json's ``scale``), in seconds."""
        return {
            "workers": self.workers,
            "worker_start_s": [round(s, 3) for s in self.start_seconds],
            "ceilings_measure_s": [round(s, 3) for s in self.measure_seconds],
            "cases": len(self.busy_seconds),
            "dispatch_wait_s": round(sum(self.waited_seconds), 3),
            "case_busy_s": round(sum(self.busy_seconds), 3),
            "phase_s": rounded(self.phase_seconds),
            "gpus": self.ledger.to_meta(),
        }


def worker_threads(run_threads: int | None, workers: int) -> int:
    """torch intra-op threads per worker: the run's (or every core) split between the workers.

    On CUDA too: each worker still builds its case's inputs and grades on the host, with
    OpenMP-parallel torch ops; two workers that each kept torch's default (every core) ran
    64 spinning threads on a 32-core H200 host, and the pair took 81 s where one worker took
    59 (gpu_results/2026-11-30-h200-variants-split-tiles/scale)."""
    return max(1, (run_threads or os.cpu_count() or 1) // max(1, workers))


def run_sharded(cases, config, on_row, done=(), workers: str | int = "auto") -> ShardedRun:
    """Run ``cases`` over ``workers`` processes (``--workers``); rows to ``on_row``. Returns the run (timings)."""
    count = worker_count(workers, config.device, config.threads)
    threads = worker_threads(config.threads, count)
    sharded = ShardedRun(config, count, config.plugins, threads)
    sharded.run(cases, on_row, done)
    return sharded
