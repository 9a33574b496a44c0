"""The ``run`` verb's scale-out options, checked before any work, and the choice of executor."""

import argparse
import importlib
import os
import threading
import time

from harness.execute.local import InProcess
from harness.execute.ray_cluster import LOCAL, RayCluster, ray_missing
from harness.execute.shards import parse_shard
from harness.execute.workers import ProcessPool, worker_count
from harness.run.oracle_cache import ENV_DIR


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("scale-out")
    group.add_argument("--workers", metavar="N|auto", help="spread the run over N worker processes: one per GPU, "
                       "pinned by CUDA_VISIBLE_DEVICES (auto: every visible GPU; on a CPU, one per core, torch threads "
                       "split between them)")  # fmt: skip
    group.add_argument("--ray", nargs="?", const=LOCAL, metavar="ADDRESS",
                       help="run the cases as Ray tasks on the cluster at ADDRESS (no ADDRESS: a local Ray); "
                       "needs the optional extra: pip install 'paged-attention-harness[ray]'")  # fmt: skip
    group.add_argument("--shard", metavar="I/N",
                       help="run only slice I of N of the cases (0 <= I < N; by cost, dealt round robin, the same "
                       "split on every host); join the hosts' run folders with `harness merge OUT RUN...`")  # fmt: skip
    group.add_argument("--oracle-cache", metavar="DIR|off",
                       help="cache of the CPU float64 oracle's outputs, by input content (default: "
                       "$HARNESS_ORACLE_CACHE, else ~/.cache/paged-attention-harness/oracle; capped at 2 GiB, least "
                       "recently used pruned); off: no cache")  # fmt: skip


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse bad scale-out options (ValueError, a message for the user); apply --oracle-cache."""
    if args.workers is not None:
        worker_count(args.workers, "cpu")  # ValueError unless a positive integer or 'auto'
    if args.shard is not None:
        parse_shard(args.shard)
    if args.ray is not None and (why := ray_missing()):
        raise ValueError(why)
    if args.oracle_cache:
        os.environ[ENV_DIR] = args.oracle_cache  # read by this process and inherited by its workers


def run_rows(args: argparse.Namespace, cases, config, on_row, done, worker=None) -> dict:
    """Run the cases with --ray, else --workers, else in this process (``worker``: the CLI's isolation worker,
    unused by a process pool); meta.json's ``scale`` (with ``mode``, ``gpus`` and ``wall_s``)."""
    started = time.perf_counter()
    if args.ray is None and args.workers is None:
        executor = InProcess(worker)
    else:  # what writing the run folder needs (the page, its plots) is imported on a thread while the driver waits

        def preload() -> None:
            for name in ("harness.results.report", "harness.results.plots", "harness.timing.scaling"):
                importlib.import_module(name)

        threading.Thread(target=preload, name="preload-report", daemon=True).start()
        executor = RayCluster(args.ray, args.workers) if args.ray is not None else ProcessPool(args.workers)
    record = executor.run(cases, config, on_row, done)
    return {**record, "wall_s": round(time.perf_counter() - started, 3)}
