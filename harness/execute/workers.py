"""The process-pool executor: one host's worker processes (one per GPU, or N on a CPU) run the cases, longest
first, ``PREFETCH`` ahead; a dead worker loses only its current row, retried once (docs/scaling.md)."""

import collections
import contextlib
import dataclasses
import multiprocessing
import os
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from multiprocessing.connection import wait

from harness.cases.spec import Case
from harness.execute.loop import Task, Tracker
from harness.execute.processes import DIED, START_TIMEOUT_S, Worker, spawn
from harness.run.runner import RunConfig
from harness.timing.metrics import case_cost

MAX_FAILED_STARTS = 3  # workers dying before they are ready (a broken install): the run stops
PREFETCH = 2  # cases sent to a worker ahead of the one it runs: no parent round trip between cases
RETRIES = 1  # a backend whose worker died is run again this many times, then it is an error row
EXTRA_COLUMNS = ("host", "gpu_index", "worker")  # the labels on every row a worker makes


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


class _Slot(Worker):
    """One worker of the pool: its GPU ("" on a CPU), the cases sent to it (the first runs), whether it is ready."""

    def __init__(self, index: int, gpu: str):
        super().__init__()
        self.index, self.gpu, self.tasks, self.ready, self.started_at = index, gpu, [], False, 0.0

    @property
    def task(self) -> Task | None:
        return self.tasks[0] if self.tasks else None


class PoolRun:
    def __init__(self, config: RunConfig, workers: int):
        self.config, self.workers = config, workers
        self.plugins, self.threads = tuple(config.plugins), worker_threads(config.threads, workers)
        self.host = socket.gethostname()
        self.gpus = visible_gpus() if config.device.startswith("cuda") else []
        self.slots = [_Slot(i, self.gpus[i % len(self.gpus)] if self.gpus else "") for i in range(workers)]
        self.context = multiprocessing.get_context("spawn")
        self.worker_config = dataclasses.replace(config, backends=[], progress=False, isolated=frozenset())
        self.start_seconds: list[float] = []  # spawn -> ready, per worker start (measured)
        self.measure_seconds: list[float] = []  # of which measuring the worker's own GPU's ceilings
        self.failed_starts = 0
        self.tracker = Tracker(config, lambda row: None, RETRIES)

    def labels(self, slot: _Slot) -> dict:
        return {"host": self.host, "gpu_index": slot.gpu, "worker": slot.index}

    def _start(self, slot: _Slot) -> None:
        args = (self.plugins, self.threads, self.worker_config, self.labels(slot))
        slot.process, slot.conn = spawn(self.context, slot.gpu, f"harness-worker-{slot.index}", args)
        slot.ready, slot.tasks, slot.started_at = False, [], time.monotonic()

    def stop_all(self, wait: bool = True) -> None:
        """Ask idle workers to exit, kill busy ones; ``wait=False``: reap them on a daemon thread (nothing waits)."""
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
            slot.stop()

    def run(
        self, cases: Iterable[Case], on_row: Callable[[dict], None], done: Collection[tuple[str, str]] = ()
    ) -> None:
        done = set(done)
        self.tracker.on_row = on_row
        names = [b.name for b in self.config.backends]
        queue: collections.deque[Task] = collections.deque()
        for case in sorted(cases, key=case_cost, reverse=True):
            if todo := [n for n in names if (case.id, n) not in done]:
                queue.append(Task(case, todo, labels={"host": self.host}))
        if not queue:
            return
        for slot in self.slots[: max(1, min(len(self.slots), len(queue)))]:
            self._start(slot)
        finished = False
        try:
            while queue or any(s.tasks for s in self.slots):
                self._assign(queue)
                self._poll(queue)
            finished = True
        finally:
            self.stop_all(wait=not finished)

    def _assign(self, queue: collections.deque[Task]) -> None:
        """Keep each worker PREFETCH cases ahead (one when few cases are left: no idle tail). A hung
        backend's rows of a case are skips, made here; a case left with none is not sent."""
        for task in list(queue):
            self.tracker.skip_hung(task)
            if not task.names:
                queue.remove(task)
        depth = PREFETCH if len(queue) >= len(self.slots) else 1
        alone = sum(s.process is not None for s in self.slots) == 1
        for slot in self.slots:
            while slot.process is not None and queue and len(slot.tasks) < depth:
                pick = next((t for t in queue if t.avoid != slot.index or alone), None)
                if pick is None:
                    break
                queue.remove(pick)
                pick.labels = self.labels(slot)
                slot.tasks.append(pick)
                slot.conn.send(("case", pick.case, list(pick.names), self.worker_config))

    def _poll(self, queue: collections.deque[Task]) -> None:
        live = [s for s in self.slots if s.process is not None]
        handles = {s.conn: (s, s.process) for s in live} | {s.process.sentinel: (s, s.process) for s in live}
        for ready in wait(list(handles), timeout=0.5):
            slot, process = handles[ready]
            if slot.process is not process:
                continue  # already handled through its other handle (and perhaps restarted)
            if ready is slot.conn:
                self._drain(slot, queue)
            elif not slot.conn.poll(0):  # dead with nothing left to read
                self._died(slot, queue)
        now = time.monotonic()
        for slot in self.slots:
            if slot.process is None:
                continue
            if not slot.ready and now - slot.started_at > START_TIMEOUT_S:
                raise RuntimeError(f"worker {slot.index} did not start within {START_TIMEOUT_S:g} s")
            if slot.task and (limit := self.tracker.overdue(slot.task, now)):
                slot.stop()
                self.tracker.timed_out(slot.task, limit, "the worker was killed")
                self._requeue(slot, queue)

    def _drain(self, slot: _Slot, queue) -> None:
        while slot.conn is not None and slot.conn.poll(0):
            try:
                message = slot._read()
            except (EOFError, OSError):
                message = DIED
            if message == DIED:
                self._died(slot, queue)
                return
            if message[0] == "ready":
                slot.ready = True
                self.start_seconds.append(time.monotonic() - slot.started_at)
                self.measure_seconds.append(message[2]["measure_s"])
                self.tracker.ledger.add(self.host, slot.gpu, slot.index, message[2])
            elif message[0] == "plugin_error":
                raise RuntimeError(f"worker {slot.index} could not import the plugins: {message[1]}")
            elif not self.tracker.event(slot.task, message):  # a case sent ahead before the backend hung
                slot.stop()
                self.tracker.abandon(slot.task)
                self._requeue(slot, queue)
                return
            elif message[0] == "done":
                slot.tasks.pop(0)

    def _died(self, slot: _Slot, queue) -> None:
        """The worker died: keep its sent rows, retry the rest once elsewhere, then error rows."""
        how = f"the worker process {slot.stop()}"
        if not slot.ready:  # died before it said it is ready (slot.ready: reset by _start)
            self.failed_starts += 1
            if self.failed_starts > MAX_FAILED_STARTS:
                raise RuntimeError(f"worker processes keep dying before they are ready (last: {how})")
        if slot.task is not None:
            self.tracker.died(slot.task, how)
            slot.task.avoid = slot.index
        self._requeue(slot, queue)

    def _requeue(self, slot: _Slot, queue) -> None:
        """The slot's worker is stopped: its case's backends left, then the cases sent ahead, go back to the front
        of the queue; a fresh worker takes the slot while work is left."""
        task, waiting = slot.task, slot.tasks[1:]
        slot.tasks = []
        queue.extendleft(reversed(waiting))
        if task is not None and task.names:
            queue.appendleft(task)
        if queue or any(s.tasks for s in self.slots):
            self._start(slot)

    def timings(self) -> dict:
        """Where a pool run's time went besides the cases (meta.json's ``scale``), in seconds."""
        return {"workers": self.workers, "worker_start_s": [round(s, 3) for s in self.start_seconds],
                "ceilings_measure_s": [round(s, 3) for s in self.measure_seconds], **self.tracker.timings()}  # fmt: skip


def worker_threads(run_threads: int | None, workers: int) -> int:
    """torch intra-op threads per worker: the run's (or every core) split between the workers, on CUDA too."""
    return max(1, (run_threads or os.cpu_count() or 1) // max(1, workers))


def run_pool(cases, config, on_row, done=(), workers: str | int = "auto") -> PoolRun:
    count = min(worker_count(workers, config.device, config.threads), max(1, len(cases)))  # no idle worker
    pool = PoolRun(config, count)
    pool.run(cases, on_row, done)
    return pool


@dataclass
class ProcessPool:
    """The ``--workers N|auto`` executor (:class:`harness.execute.loop.Executor`)."""

    workers: str | int = "auto"

    def run(self, cases: list[Case], config: RunConfig, on_row: Callable[[dict], None], done) -> dict:
        return {"mode": "workers", **run_pool(cases, config, on_row, done, self.workers).timings()}
