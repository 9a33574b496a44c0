"""Where rows run by default: every case in this process, a backend named in ``config.isolated``
in a worker process (harness.execute.processes), one row per (case, backend).

An isolated backend that runs past its row's limit (:func:`harness.execute.processes.row_limit`)
is an error row "timed out", and is hung for the rest of the run: its later rows are skips
"hung on <case> after N s; not run", made without starting a worker."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

import pandas as pd
import torch
from tqdm import tqdm

from harness.cases.spec import Case
from harness.execute.processes import TIMED_OUT, Hung, Worker, captured_output, report_output, row_limit, row_log
from harness.run.oracle_cache import PoisonedCacheError
from harness.run.runner import RunConfig, build_context, error_reason, row_without_call, run_backend, to_frame


def run_cases(
    cases: Iterable[Case],
    config: RunConfig,
    on_row: Callable[[dict], None] | None = None,
    done: Collection[tuple[str, str]] = (),
    worker=None,
) -> pd.DataFrame:
    """Every case through every configured backend; one row per (case, backend).

    ``on_row`` gets each row as it finishes (the journal). Pairs in ``done`` (case id,
    backend name; a resumed run's journal) are not run and not returned. Backends named
    in ``config.isolated`` run in a worker process (:mod:`harness.execute.processes`), under
    :func:`harness.execute.processes.row_limit` per call (a backend past it is hung: its
    later rows are skips); ``worker``, a started
    :class:`harness.execute.processes.Worker` to use (the CLI's, which imported the plugins first).
    """
    cases = list(cases)
    done = set(done)
    rows: list[dict] = []
    total = sum((c.id, b.name) not in done for c in cases for b in config.backends)
    order = {b.name: i for i, b in enumerate(config.backends)}
    if worker is None and config.isolated:
        worker = Worker(config.plugins)
    case_rows: list[dict] = []  # this case's rows, in the order they finish
    hung = Hung()
    try:
        with tqdm(total=total, desc="cases x backends", unit="run", disable=not config.progress or total < 4) as bar:

            def emit(row: dict) -> None:
                case_rows.append(row)
                if on_row:
                    on_row(row)
                bar.update()

            for case in cases:
                todo = [b for b in config.backends if (case.id, b.name) not in done]
                if not todo:
                    continue
                bar.set_postfix_str(case.id[-40:])
                case_rows.clear()

                local, remote = [], []
                for backend in todo:
                    if reason := backend.skip_reason(case, config.device):
                        emit(row_without_call(case, backend, config, "skip", reason))
                    else:
                        (remote if backend.name in config.isolated else local).append(backend)
                if local:
                    try:
                        ctx = build_context(case, config.device, config.oracle_device)
                    except PoisonedCacheError:
                        raise  # not this case's fault: the run stops, bad input (exit 2)
                    except Exception as error:  # inputs or oracle failed (out of memory, say): every row errors
                        reason = f"building inputs/oracle: {error_reason(error)}"
                        for backend in local:
                            emit(row_without_call(case, backend, config, "error", reason))
                    else:
                        for backend in local:
                            if backend.kind == "plugin":  # its output to its log file, as in the worker
                                log = row_log(config, case.id, backend.name)
                                with captured_output(log[0] if log else None):
                                    row = run_backend(ctx, backend, config)
                                report_output(log, f"{backend.name} on {case.id}")
                                emit(row)
                            else:
                                emit(run_backend(ctx, backend, config))
                        del ctx
                        if torch.device(config.device).type == "cuda":
                            torch.cuda.empty_cache()  # the next case's oracle may want one large block
                for backend in remote:
                    if reason := hung.reason(backend.name):
                        emit(row_without_call(case, backend, config, "skip", reason))
                        continue
                    limit = row_limit(case, config)
                    result = worker.run(case, backend.name, config, limit)
                    if isinstance(result, str):
                        if result.startswith(TIMED_OUT):
                            hung.mark(backend.name, case.id, limit)
                        result = row_without_call(case, backend, config, "error", result)
                    emit(result)
                rows.extend(sorted(case_rows, key=lambda row: order[row["backend"]]))
    finally:
        if worker is not None:
            worker.stop()
    return to_frame(rows)
