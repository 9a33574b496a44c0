"""The one per-case loop every executor runs (:func:`case_events`), and the bookkeeping every driver of
other processes shares (:class:`Tracker`)."""

import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import torch

from harness.backends.builtin import REGISTRY, Backend
from harness.cases.spec import Case
from harness.execute.output import captured_output, report_output, row_log
from harness.run.oracle_cache import PoisonedCacheError
from harness.run.runner import CaseContext, RunConfig, build_context, error_reason, row_without_call, run_backend
from harness.timing.ceilings import GpuLedger
from harness.timing.measure import row_time_limit
from harness.timing.phases import add_phases, rounded, take_phases

CONTEXT = "building inputs/oracle"  # what a case does before its first backend


class Executor(Protocol):
    def run(self, cases: list[Case], config: RunConfig, on_row: Callable[[dict], None], done: Collection) -> dict:
        """Every (case id, backend name) pair not in ``done``, each row to ``on_row``; meta.json's ``scale``."""


def row_limit(case: Case, config: RunConfig) -> float:
    """Seconds one row of ``case`` may take (grade and timing) before its backend counts as hung."""
    return case.timeout_s or config.timeout_s or row_time_limit(case, config.device, config.ceilings)


@dataclass
class Contexts:
    """The last case's inputs and oracle (:class:`harness.run.runner.CaseContext`), or why they could not
    be built: one case's tensors are held at a time, and a case's backends share them."""

    case_id: str | None = None
    ctx: CaseContext | str | None = None

    def holds(self, case: Case) -> bool:
        return self.case_id == case.id

    def get(self, case: Case, config: RunConfig) -> CaseContext | str:
        """The case's context, built on first use; a str is why building it failed. PoisonedCacheError
        is raised: a bad oracle cache entry is not the case's fault, and the run stops on it."""
        if not self.holds(case):
            self.drop(config)  # the last case's tensors first: the next oracle may want one large block
            try:
                self.ctx = build_context(case, config.device, config.oracle_device)
            except PoisonedCacheError:
                raise
            except Exception as error:  # out of memory, say: every row of the case is an error
                self.ctx = f"{CONTEXT}: {error_reason(error)}"
            self.case_id = case.id
        return self.ctx

    def drop(self, config: RunConfig) -> None:
        if self.ctx is not None:
            self.case_id = self.ctx = None
            if torch.device(config.device).type == "cuda":
                torch.cuda.empty_cache()


def case_events(case: Case, backends: list[Backend], config: RunConfig, contexts: Contexts,
                labels: dict | None = None) -> Iterator[tuple]:  # fmt: skip
    """A case's work as events: ``("start", what)`` before each step (:data:`CONTEXT`, then each backend),
    ``("row", row)`` after each backend (skips first); ``labels`` go on every row."""
    labels = labels or {}
    to_run = []
    for backend in backends:
        if reason := backend.skip_reason(case, config.device):
            yield "row", {**row_without_call(case, backend, config, "skip", reason), **labels}
        else:
            to_run.append(backend)
    if not to_run:
        return
    if not contexts.holds(case):
        yield "start", CONTEXT
    ctx = contexts.get(case, config)
    for backend in to_run:
        if isinstance(ctx, str):
            yield "row", {**row_without_call(case, backend, config, "error", ctx), **labels}
            continue
        yield "start", backend.name
        log = row_log(config, case.id, backend.name) if backend.kind == "plugin" else None
        with captured_output(log[0] if log else None):  # what it prints, to its own log file
            row = run_backend(ctx, backend, config)
        yield "row", {**row, **labels}


def timed_case(case: Case, names: list[str], config: RunConfig, contexts: Contexts, labels: dict,
               waited_s: float = 0.0) -> Iterator[tuple]:  # fmt: skip
    """:func:`case_events` in a worker process or a Ray task, then ``("done", waited_s, busy_s, phases)``;
    a bad oracle cache entry ends it with ``("poisoned", why)``."""
    started = time.perf_counter()
    take_phases()  # this case's phases only
    try:
        yield from case_events(case, [REGISTRY[name] for name in names], config, contexts, labels)
    except PoisonedCacheError as error:
        yield "poisoned", str(error)
        return
    contexts.drop(config)
    yield "done", waited_s, time.perf_counter() - started, take_phases()


@dataclass
class Task:
    """A case sent out of this process, and its backends still without a row; which runs, since when."""

    case: Case
    names: list[str]
    deaths: dict[str, int] = field(default_factory=dict)  # per backend, carried to the task that retries it
    labels: dict = field(default_factory=dict)  # where it runs (host, gpu_index, worker): on rows made here
    running: str | None = None  # CONTEXT or a backend, after its "start" event
    since: float = 0.0  # when it started (this process's clock)
    avoid: object = None  # the worker it last died on (a process pool tries another)


class Tracker:
    """What every out-of-process driver does with its tasks: rows to ``on_row`` (each GPU's percentages
    applied), time limits and hung backends, deaths and retries, and the cases' busy time by phase."""

    def __init__(self, config: RunConfig, on_row: Callable[[dict], None], retries: int, tried: str = "on {} workers",
                 hangs: bool = True):  # fmt: skip
        self.config, self.on_row, self.retries, self.tried, self.hangs = config, on_row, retries, tried, hangs
        self.hung: dict[str, tuple[str, float]] = {}  # backend past its limit -> (case id, limit in seconds)
        self.ledger = GpuLedger()
        self.waited_s: list[float] = []  # per case: a worker free, waiting for it (dispatch)
        self.busy_s: list[float] = []  # per case: inputs, oracle and every backend of it
        self.phase_s: dict[str, float] = {}

    def row(self, row: dict) -> None:
        report_output(row_log(self.config, row["case"], row["backend"]), f"{row['backend']} on {row['case']}")
        self.on_row(self.ledger.apply(row))

    def made(self, task: Task, name: str, status: str, reason: str) -> None:
        """A row made here, without a call (an error, or a hung backend's skip)."""
        task.names.remove(name)
        self.row({**row_without_call(task.case, REGISTRY[name], self.config, status, reason), **task.labels})

    def hung_reason(self, backend: str) -> str | None:
        if backend in self.hung:
            return f"hung on {self.hung[backend][0]} after {self.hung[backend][1]:g} s; not run"
        return None

    def skip_hung(self, task: Task) -> None:
        for name in list(task.names):
            if reason := self.hung_reason(name):
                self.made(task, name, "skip", reason)

    def event(self, task: Task, event: tuple) -> bool:
        """Take one of a task's events; False when it started a backend hung meanwhile (stop it, then
        :meth:`abandon`). ``done`` ends the task: counted here, the driver forgets it."""
        kind = event[0]
        if kind == "start":
            task.running, task.since = event[1], time.monotonic()
            return event[1] == CONTEXT or not self.hung_reason(event[1])
        if kind == "row":
            if event[1]["backend"] in task.names:
                task.names.remove(event[1]["backend"])
            task.running = None
            self.row(event[1])
        elif kind == "done":
            task.running = None
            self.waited_s.append(event[1])
            self.busy_s.append(event[2])
            self.phase_s = add_phases(self.phase_s, event[3])
        elif kind == "poisoned":  # the worker's oracle cache check failed: the run stops, as in one process
            raise PoisonedCacheError(event[1])
        return True

    def overdue(self, task: Task, now: float) -> float | None:
        if task.running in (None, CONTEXT):
            return None
        limit = row_limit(task.case, self.config)
        return limit if now - task.since > limit else None

    def timed_out(self, task: Task, limit: float, how: str) -> None:
        """The running backend ran past ``limit`` and was stopped (``how``): an error row; it is hung (with ``hangs``)."""
        reason = f"timed out after {limit:g} s ({how})"
        if self.hangs:
            self.hung.setdefault(task.running, (task.case.id, limit))
            reason += "; hung: its later rows are skipped"
        self.made(task, task.running, "error", reason)
        task.running = None

    def abandon(self, task: Task) -> None:
        """The stopped task had started a backend that hung meanwhile: its skip row."""
        self.made(task, task.running, "skip", self.hung_reason(task.running))
        task.running = None

    def died(self, task: Task, how: str) -> None:
        """The task's process died (``how``): the running backend is blamed (every remaining one outside a
        call); one blamed more than ``retries`` times is an error row."""
        blamed = [task.running] if task.running not in (None, CONTEXT) else list(task.names)
        what = "running this backend" if task.running not in (None, CONTEXT) else f"{CONTEXT} (or between calls)"
        for name in blamed:
            task.deaths[name] = task.deaths.get(name, 0) + 1
            if task.deaths[name] > self.retries:
                tried = f", {self.tried.format(task.deaths[name])} (retried {self.retries}x)" if self.retries else ""
                self.made(task, name, "error", f"{how} while {what}{tried}")
        task.running = None

    def timings(self) -> dict:
        """The cases' count, dispatch wait, busy time and phases, and each GPU (meta.json's ``scale``)."""
        return {"cases": len(self.busy_s), "dispatch_wait_s": round(sum(self.waited_s), 3),
                "case_busy_s": round(sum(self.busy_s), 3), "phase_s": rounded(self.phase_s),
                "gpus": self.ledger.to_meta()}  # fmt: skip
