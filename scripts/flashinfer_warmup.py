"""Build the FlashInfer kernels a run needs before it starts, so no compile counts against a row's time limit.

    python scripts/flashinfer_warmup.py [CASE_FILES...] [--jobs N]   # default: the suites gpu_run.sh runs, N half the cores (4 at least)
    python scripts/flashinfer_warmup.py --list cases/gpu_peers.toml   # the twins only, nothing called (any machine)

The cases are reduced to one small twin per FlashInfer module (warmup_cases), each called once on the
GPU, ``--jobs`` at a time, into FlashInfer's JIT cache; a line per twin. Without FlashInfer: exit 0
(the rows are skips naming the install); exit 1 when a twin's call fails."""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.backends.flashinfer_peer import INSTALL, module_key, prepare_flashinfer, warmup_cases
from harness.cases.spec import load_case_file, resolve_case_paths
from harness.run.runner import case_inputs

SUITES = [f"cases/{name}.toml" for name in ("smoke", "gpu_peers", "gpu", "gpu_long", "gpu_flashinfer")]


def build(twin) -> str:
    """Prepare and call one twin on the GPU; a line saying how long it took and what ran, or why it failed."""
    started = time.perf_counter()
    try:
        inputs = case_inputs(twin, "cuda")
        prepared = prepare_flashinfer(twin, inputs, inputs.new_out())
        prepared.run()
        torch.cuda.synchronize()
    except Exception as error:  # a twin that cannot run: said, and the rest still built
        return f"  FAILED {twin.id}: {type(error).__name__}: {error}"
    return f"  {time.perf_counter() - started:6.1f} s  {twin.id}: {prepared.note}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("cases", nargs="*", default=SUITES, help="case files (default: the GPU suites)")
    jobs = max(4, (os.cpu_count() or 8) // 2)
    parser.add_argument("--jobs", type=int, default=jobs, help="twins built at once, each in its own process")
    parser.add_argument("--list", action="store_true", help="print the twins and their modules, call nothing")
    args = parser.parse_args(argv)
    cases = [case for path in resolve_case_paths(args.cases) for case in load_case_file(path)]
    twins = warmup_cases(cases)
    print(f"{len(twins)} FlashInfer modules for {len(cases)} cases")
    if args.list:
        for twin in twins:
            print(f"  {twin.id}: {module_key(twin)}")
        return 0
    if importlib.util.find_spec("flashinfer") is None:
        print(f"FlashInfer is not installed (`{INSTALL}`): nothing to build")
        return 0
    context = multiprocessing.get_context("spawn")  # CUDA in each worker: no fork
    with ProcessPoolExecutor(max_workers=max(1, args.jobs), mp_context=context) as pool:
        lines = list(pool.map(build, twins))
    print("\n".join(lines))
    return int(any(line.startswith("  FAILED") for line in lines))


if __name__ == "__main__":
    sys.exit(main())
