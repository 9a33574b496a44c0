"""A run's cases as Ray tasks: one task per case, on any number of hosts.

``harness run --ray [ADDRESS]`` connects to the Ray cluster at ADDRESS (``ray://host:10001``
or ``auto``; no ADDRESS: a local Ray started for the run, ``--workers N`` CPUs of it) and
submits one task per case, longest first (:func:`harness.parallel.case_cost`). A task
builds the case's inputs and float64 oracle (through the oracle cache, whose folder the
driver's ``--oracle-cache``/``$HARNESS_ORACLE_CACHE`` names on every node), runs
:func:`harness.runner.run_backend` for each backend and returns the case's rows, each
with ``host``, ``gpu_index`` (Ray's GPU id, "" without one) and ``worker`` (Ray's worker
id, shortened). The driver hands every row to ``on_row`` (the journal) as its task
finishes; ``cmd_run`` writes the one run folder, as for a one-process run.

* **Resources.** On CUDA each task asks for ``num_gpus=1`` (Ray sets its
  ``CUDA_VISIBLE_DEVICES``); otherwise ``num_cpus=1``.
* **Failures.** A task whose worker process dies (killed, out of memory) is retried once
  by Ray (``max_retries=1``) on any worker; if it dies again, each of the case's backends
  is run once more in a task of its own (no retry), so the backends that did not kill it
  keep their rows, and the one that does is an ``error`` row with Ray's reason. A backend that raises is an ``error`` row inside the
  task, as in every run. A hung task is not timed out by the harness (Ray gives no start
  time of a queued task to measure from): Ctrl-C cancels every pending task.
* **Code on the nodes.** Every node needs this package and the plugins importable (the
  same install, or a ``runtime_env``); plugin paths are resolved on the node.

Ray is optional (``pip install 'paged-attention-harness[ray]'``); :func:`ray_missing` says
how to get it, and the CLI exits 2 with that message.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import Callable, Collection

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


def run_case_rows(case, names: list[str], config, plugins: tuple[str, ...]) -> list[dict]:
    """A case's rows, one per backend named (the body of a Ray task; plain Python, testable alone)."""
    import kernels

    kernels.use_interpreter_if_no_gpu()
    import torch

    from .backends import REGISTRY, load_plugin
    from .runner import _error_reason, _row_without_call, build_context, run_backend

    for plugin in plugins:
        if not any(plugin == p for p in _LOADED):
            load_plugin(plugin)
            _LOADED.append(plugin)
    if config.threads:
        torch.set_num_threads(config.threads)
    labels = _labels()
    backends = [REGISTRY[name] for name in names]
    rows, to_run = [], []
    for backend in backends:
        if reason := backend.skip_reason(case, config.device):
            rows.append({**_row_without_call(case, backend, config, "skip", reason), **labels})
        else:
            to_run.append(backend)
    if to_run:
        try:
            ctx = build_context(case, config.device, config.oracle_device)
        except Exception as error:
            reason = f"building inputs/oracle: {_error_reason(error)}"
            rows += [{**_row_without_call(case, b, config, "error", reason), **labels} for b in to_run]
        else:
            rows += [{**run_backend(ctx, b, config), **labels} for b in to_run]
    return rows


_LOADED: list[str] = []  # plugins imported in this (long-lived) Ray worker


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

    Returns measured overheads: ``init_s`` (connect or start Ray), ``tasks``,
    ``wall_s`` (submit to last result).
    """
    import ray

    from .oracle_cache import ENV_DIR
    from .parallel import case_cost
    from .runner import _row_without_call

    started = time.perf_counter()
    owns = not ray.is_initialized()
    if owns:
        env = {key: os.environ[key] for key in (ENV_DIR, "TRITON_INTERPRET") if key in os.environ}
        kwargs = {"runtime_env": {"env_vars": env}, "include_dashboard": False, "log_to_driver": False}
        if address is None:
            if num_cpus not in (None, "auto"):
                kwargs["num_cpus"] = int(num_cpus)
            ray.init(**kwargs)
        else:
            ray.init(address=address, **kwargs)
    init_s = time.perf_counter() - started
    cuda = config.device.startswith("cuda")
    resources = {"num_gpus": 1} if cuda else {"num_cpus": 1}
    task = ray.remote(max_retries=RETRIES, **resources)(run_case_rows)
    shipped = dataclasses.replace(config, backends=[], progress=False, isolated=frozenset())
    from .backends import REGISTRY

    alone = ray.remote(max_retries=0, **resources)(run_case_rows)  # one backend, after its case's task died twice
    plugins = tuple(config.plugins)
    pending, by_ref, submitted = [], {}, time.perf_counter()
    tasks = 0
    done = set(done)
    for case in sorted(cases, key=case_cost, reverse=True):
        names = [b.name for b in config.backends if (case.id, b.name) not in done]
        if names:
            ref = task.remote(case, names, shipped, plugins)
            pending.append(ref)
            tasks += 1
            by_ref[ref] = (case, names, False)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=1.0)
            for ref in ready:
                case, names, split = by_ref.pop(ref)
                try:
                    rows = ray.get(ref)
                except Exception as error:  # the task's worker died twice, or Ray failed it
                    if len(names) > 1 and not split:  # which backend kills it? one task each finds out
                        for name in names:
                            one = alone.remote(case, [name], shipped, plugins)
                            pending.append(one)
                            tasks += 1
                            by_ref[one] = (case, [name], True)
                        continue
                    tries = f"after {RETRIES} retry" + (", then alone" if split else "")
                    why = f"Ray task failed {tries}: {type(error).__name__}: {str(error).splitlines()[0][:300]}"
                    rows = [
                        {**_row_without_call(case, REGISTRY[n], config, "error", why), "host": "", "gpu_index": ""}
                        for n in names
                    ]
                for row in rows:
                    on_row(row)
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        if owns:
            ray.shutdown()
    return {"init_s": init_s, "tasks": tasks, "wall_s": time.perf_counter() - submitted}
