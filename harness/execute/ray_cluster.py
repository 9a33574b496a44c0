"""The Ray executor: a run's cases as Ray tasks, one task per case, on any number of hosts (docs/scaling.md)."""

import dataclasses
import os
import shutil
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.cases.spec import Case
from harness.execute.loop import Contexts, Task, Tracker, timed_case
from harness.execute.processes import worker_setup
from harness.run.oracle_cache import ENV_DIR
from harness.run.runner import RunConfig
from harness.timing.ceilings import SHARE_ENV
from harness.timing.metrics import case_cost

RETRIES = 1
LOCAL = "local"  # --ray without an address: a local Ray started for the run


def ray_missing() -> str | None:
    """None when Ray imports; else the message telling the user how to install it."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return ("--ray: Ray is not installed; install the optional extra: "
                "pip install 'paged-attention-harness[ray]' (or pip install 'ray>=2.9')")  # fmt: skip
    return None


def case_task(case, names: list[str], config, plugins: tuple[str, ...]) -> Iterator[tuple]:
    """A Ray task's body (plain Python, testable without Ray): ``("device", report, labels)`` with where it runs
    (host, Ray's GPU ids and worker id), then :func:`harness.execute.loop.timed_case`'s events."""
    device = worker_setup(plugins, config.threads, config)
    if device["ceilings"]:
        config = dataclasses.replace(config, ceilings=device["ceilings"])
    ray = sys.modules.get("ray")  # imported in every Ray worker; asking Ray outside one would start a local Ray
    labels = {"host": socket.gethostname(), "gpu_index": "", "worker": str(os.getpid())}  # outside Ray: a direct call
    if ray is not None and ray.is_initialized():
        labels["gpu_index"] = ",".join(map(str, ray.get_gpu_ids()))
        labels["worker"] = ray.get_runtime_context().get_worker_id()[:12]
    yield "device", device, labels
    yield from timed_case(case, names, config, Contexts(), labels)


@dataclass
class RayCluster:
    """The ``--ray [ADDRESS]`` executor: ``address`` is :data:`LOCAL` for a local Ray of ``workers`` CPUs."""

    address: str = LOCAL
    workers: str | None = None

    def run(self, cases: list[Case], config: RunConfig, on_row: Callable[[dict], None], done) -> dict:
        import ray

        started = time.perf_counter()
        owns = not ray.is_initialized()
        if owns:
            env = {key: os.environ[key] for key in (ENV_DIR, "TRITON_INTERPRET") if key in os.environ}
            env[SHARE_ENV] = str(Path(tempfile.gettempdir()) / f"harness-ceilings-{uuid.uuid4().hex[:12]}")  # per node
            kwargs = {"runtime_env": {"env_vars": env}, "include_dashboard": False, "log_to_driver": False}
            if self.address != LOCAL:
                ray.init(address=self.address, **kwargs)
            else:
                ray.init(**kwargs, **({} if self.workers in (None, "auto") else {"num_cpus": int(self.workers)}))
        init_s = time.perf_counter() - started
        resources = {"num_gpus": 1} if config.device.startswith("cuda") else {"num_cpus": 1}
        # A death is retried here, knowing who died only if the task's "start" event reached this driver
        # first: with a backpressure of one object, a task waits at each yield until the driver took the item.
        remote = ray.remote(max_retries=0, _generator_backpressure_num_objects=1, **resources)(case_task)
        shipped = dataclasses.replace(config, backends=[], progress=False, isolated=frozenset(), logs=None)
        tracker = Tracker(config, on_row, RETRIES, tried="in {} tasks", hangs=False)
        live: dict = {}
        tasks = 0

        def submit(task: Task) -> None:
            nonlocal tasks
            tracker.skip_hung(task)
            if task.names:
                task = Task(task.case, list(task.names), task.deaths, labels={"host": "", "gpu_index": ""})
                live[remote.remote(task.case, task.names, shipped, tuple(config.plugins))] = task
                tasks += 1

        def stop(stream) -> None:
            ray.cancel(stream, force=True)  # kills the task's worker process
            del live[stream]

        for case in sorted(cases, key=case_cost, reverse=True):
            submit(Task(case, [b.name for b in config.backends if (case.id, b.name) not in done]))
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
                        tracker.died(task, f"the Ray task failed ({type(error).__name__}: "
                                           f"{str(error).splitlines()[0][:300]})")  # fmt: skip
                        submit(task)
                        continue
                    if event[0] == "device":
                        _, report, task.labels = event
                        tracker.ledger.add(task.labels["host"], task.labels["gpu_index"], task.labels["worker"], report)
                    elif not tracker.event(task, event):  # it started a backend hung meanwhile
                        stop(stream)
                        tracker.abandon(task)
                        submit(task)
                now = time.monotonic()
                for stream, task in list(live.items()):
                    if limit := tracker.overdue(task, now):
                        stop(stream)
                        tracker.timed_out(task, limit, "the Ray task was cancelled")
                        submit(task)
        finally:
            for stream in live:
                ray.cancel(stream, force=True)
            if owns:
                ray.shutdown()
                shutil.rmtree(env[SHARE_ENV], ignore_errors=True)  # this host's; other nodes' are a few bytes each
        return {"mode": "ray", "ray": self.address, "workers": self.workers, "init_s": round(init_s, 3),
                "tasks": tasks, **tracker.timings()}  # fmt: skip
