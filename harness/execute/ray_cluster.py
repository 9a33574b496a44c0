"""A run's cases as Ray tasks: one task per case, on any number of hosts.

``harness run --ray [ADDRESS]`` connects to the Ray cluster at ADDRESS (``ray://host:10001``
or ``auto``; no ADDRESS: a local Ray started for the run, ``--workers N`` CPUs of it) and
submits one task per case, longest first (:func:`harness.execute.workers.case_cost`). A task
builds the case's inputs and float64 oracle (through the oracle cache, whose folder the
driver's ``--oracle-cache``/``$HARNESS_ORACLE_CACHE`` names on every node), runs
:func:`harness.run.runner.run_backend` for each backend and streams its events to the driver
as it goes (a generator task: the device it runs on, ``start`` of each backend, each row;
:func:`case_task`). Rows carry ``host``, ``gpu_index`` (Ray's GPU id, "" without one),
``worker`` (Ray's worker id, shortened) and, on CUDA, ``gpu_name``. The driver hands every
row to ``on_row`` (the journal) as it arrives; ``cmd_run`` writes the one run folder.

* **Resources.** On CUDA each task asks for ``num_gpus=1`` (Ray sets its
  ``CUDA_VISIBLE_DEVICES``); otherwise ``num_cpus=1``. Ray gives each GPU task a fresh
  process, so a GPU's ceilings are measured by its first task and left for the next ones in
  a folder of the node (:func:`harness.timing.ceilings.own_device`); its rows are judged against them.
* **Time limit.** A backend running past its limit (``case.timeout_s``, ``--timeout``, else
  the row's expected cost: :func:`harness.execute.processes.row_limit`), counted on the
  driver's clock from the ``start`` the task streamed (a task still queued is not running late), has its task cancelled (Ray kills the worker) and is
  an ``error`` row at once; the case's backends that had not run go out in a new task.
* **Failures.** A task whose worker process dies (killed, out of memory, a lost node) keeps
  the rows it streamed; the backend it was running is blamed (every remaining one if it
  died building the inputs/oracle) and the case's remaining backends go out in a new task
  (Ray's own retries are off: the driver knows which backend was running); a backend
  blamed twice is an ``error`` row with Ray's reason. A backend that raises is an
  ``error`` row inside the task, as in every run. Ctrl-C cancels every pending task.
* **Code on the nodes.** Every node needs this package and the plugins importable (the
  same install, or a ``runtime_env``); plugin paths are resolved on the node.

Ray is optional (``pip install 'paged-attention-harness[ray]'``); :func:`ray_missing` says
how to get it, and the CLI exits 2 with that message.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from harness.backends.builtin import REGISTRY
from harness.execute.processes import row_limit
from harness.execute.workers import CONTEXT, case_events, worker_setup
from harness.run.oracle_cache import ENV_DIR
from harness.run.runner import row_without_call
from harness.timing.ceilings import SHARE_ENV, GpuLedger
from harness.timing.metrics import case_cost
from harness.timing.phases import add_phases, rounded, take_phases

RETRIES = 1


def ray_missing() -> str | None:
    """None when Ray imports; else the message telling the user how to install it."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return (
            "--ray: Ray is not installed; install the optional extra: "
            "pip install 'paged-attention-harness[ray]' (or pip install 'ray>=2.9')"
        )
    return None


def case_task(case, names: list[str], config, plugins: tuple[str, ...]) -> Iterator[tuple]:
    """The body of a Ray task, a generator (Ray streams each item to the driver as it is made):
    ``("device", report, labels)``, then :func:`harness.execute.workers.case_events` (``start`` /
    ``row``), then ``("done", busy_s, phases)`` (:mod:`harness.timing.phases`). Plain Python: testable without Ray."""
    config, device = worker_setup(config, plugins, config.threads)
    labels = _labels()
    yield "device", device, labels
    started = time.perf_counter()
    take_phases()
    yield from case_events(case, names, config, labels)
    yield "done", time.perf_counter() - started, take_phases()


@dataclass
class _Task:
    """A submitted case: the backends still without a row, and the one running (driver's clock)."""

    case: object
    names: list[str]
    deaths: dict[str, int] = field(default_factory=dict)  # per backend, carried to the task that retries it
    labels: dict = field(default_factory=lambda: {"host": "", "gpu_index": ""})
    running: str | None = None
    since: float = 0.0


def _labels() -> dict:
    gpu = ""
    try:
        import ray

        ids = ray.get_gpu_ids()
        gpu = ",".join(str(i) for i in ids)
        worker = ray.get_runtime_context().get_worker_id()[:12]
    except Exception:  # outside a Ray worker (a direct call)
        worker = str(os.getpid())
    return {"host": socket.gethostname(), "gpu_index": gpu, "worker": worker}


def run_on_ray(
    cases,
    config,
    on_row: Callable[[dict], None],
    done: Collection[tuple[str, str]] = (),
    address: str | None = None,
    num_cpus: str | int | None = None,
) -> dict:
    """Every (case, backend) pair not in ``done`` as Ray tasks; rows to ``on_row``.

    Returns what meta.json's ``scale`` keeps: ``init_s`` (connect or start Ray), ``tasks``,
    ``wall_s`` (first submit to last row), ``case_busy_s`` (the tasks' own time), ``gpus``
    (each GPU's name and ceilings, :class:`harness.timing.ceilings.GpuLedger`).
    """
    import ray

    started = time.perf_counter()
    owns = not ray.is_initialized()
    if owns:
        env = {key: os.environ[key] for key in (ENV_DIR, "TRITON_INTERPRET") if key in os.environ}
        env[SHARE_ENV] = str(Path(tempfile.gettempdir()) / f"harness-ceilings-{uuid.uuid4().hex[:12]}")  # per node
        kwargs = {"runtime_env": {"env_vars": env}, "include_dashboard": False, "log_to_driver": False}
        if address is None:
            if num_cpus not in (None, "auto"):
                kwargs["num_cpus"] = int(num_cpus)
            ray.init(**kwargs)
        else:
            ray.init(address=address, **kwargs)
    init_s = time.perf_counter() - started
    resources = {"num_gpus": 1} if config.device.startswith("cuda") else {"num_cpus": 1}
    remote = ray.remote(max_retries=0, **resources)(case_task)  # a death is retried here, knowing who died
    shipped = dataclasses.replace(config, backends=[], progress=False, isolated=frozenset())
    plugins = tuple(config.plugins)
    ledger, busy, live, phases = GpuLedger(), [], {}, {}
    tasks = 0

    def submit(case, names: list[str], deaths: dict | None = None) -> None:
        nonlocal tasks
        live[remote.remote(case, names, shipped, plugins)] = _Task(case, list(names), dict(deaths or {}))
        tasks += 1

    def error_rows(task: _Task, names: list[str], why: str) -> None:
        for name in names:
            task.names.remove(name)
            on_row(ledger.apply({**row_without_call(task.case, REGISTRY[name], config, "error", why), **task.labels}))

    submitted = time.perf_counter()
    done = set(done)
    for case in sorted(cases, key=case_cost, reverse=True):
        if names := [b.name for b in config.backends if (case.id, b.name) not in done]:
            submit(case, names)
    try:
        while live:
            ready, _ = ray.wait(list(live), num_returns=1, timeout=0.5)
            for stream in ready:
                task = live[stream]
                try:
                    event = ray.get(next(stream))
                except StopIteration:
                    del live[stream]
                    continue
                except Exception as error:  # the task's worker died, or Ray failed it
                    del live[stream]
                    _failed(task, error, submit, error_rows)
                    continue
                if event[0] == "device":
                    _, report, task.labels = event
                    ledger.add(task.labels["host"], task.labels["gpu_index"], task.labels["worker"], report)
                elif event[0] == "start":
                    task.running, task.since = event[1], time.monotonic()
                elif event[0] == "row":
                    task.names.remove(event[1]["backend"])
                    task.running = None
                    on_row(ledger.apply(event[1]))
                elif event[0] == "done":
                    busy.append(event[1])
                    phases = add_phases(phases, event[2])
            now = time.monotonic()
            for stream, task in list(live.items()):
                limit = row_limit(task.case, config)
                if task.running not in (None, CONTEXT) and now - task.since > limit:
                    ray.cancel(stream, force=True)  # kills the task's worker process
                    del live[stream]
                    error_rows(task, [task.running], f"timed out after {limit:g} s (the Ray task was cancelled)")
                    if task.names:
                        submit(task.case, task.names, task.deaths)
    finally:
        for stream in live:
            ray.cancel(stream, force=True)
        if owns:
            ray.shutdown()
            shutil.rmtree(env[SHARE_ENV], ignore_errors=True)  # this host's; other nodes' are a few bytes each
    return {"init_s": round(init_s, 3), "tasks": tasks, "wall_s": round(time.perf_counter() - submitted, 3),
            "case_busy_s": round(sum(busy), 3), "phase_s": rounded(phases), "gpus": ledger.to_meta()}  # fmt: skip


def _failed(task: _Task, error: Exception, submit, error_rows) -> None:
    """The task's worker died (or Ray failed the task): the rows it streamed are kept; the
    backend it was running (every remaining one, if it died building the inputs/oracle) is
    blamed; a backend blamed a second time is an ``error`` row; the rest go out again."""
    blamed = [task.running] if task.running not in (None, CONTEXT) else list(task.names)
    what = "running this backend" if task.running not in (None, CONTEXT) else f"{CONTEXT} (or between calls)"
    why = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
    for name in blamed:
        task.deaths[name] = task.deaths.get(name, 0) + 1
    dead = [name for name in blamed if task.deaths[name] > RETRIES]
    error_rows(task, dead, f"the Ray task failed while {what}, in {RETRIES + 1} tasks (retried {RETRIES}x): {why}")
    if task.names:
        submit(task.case, task.names, task.deaths)
