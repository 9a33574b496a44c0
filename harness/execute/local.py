"""The one-process executor: cases run here, ``config.isolated`` backends in a :class:`processes.Worker` process."""

import dataclasses
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

import pandas as pd
from tqdm import tqdm

from harness.cases.spec import Case
from harness.execute.loop import Contexts, Task, Tracker, case_events
from harness.execute.processes import Worker
from harness.run.runner import RunConfig, row_without_call, to_frame
from harness.timing.phases import rounded, take_phases


def run_cases(cases: Iterable[Case], config: RunConfig, on_row: Callable[[dict], None] | None = None,
              done: Collection[tuple[str, str]] = (), worker: Worker | None = None) -> pd.DataFrame:  # fmt: skip
    """Every (case, backend) not in ``done``, rows to ``on_row``; ``config.isolated`` backends run in ``worker``."""
    cases = list(cases)
    done = set(done)
    rows: list[dict] = []
    total = sum((c.id, b.name) not in done for c in cases for b in config.backends)
    order = {b.name: i for i, b in enumerate(config.backends)}
    if worker is None and config.isolated:
        worker = Worker(config.plugins, config.threads)
    shipped = dataclasses.replace(config, backends=[], progress=False)  # what the worker is sent with a case
    case_rows: list[dict] = []  # this case's rows, in the order they finish
    contexts = Contexts()
    try:
        with tqdm(total=total, desc="cases x backends", unit="run", disable=not config.progress or total < 4) as bar:

            def emit(row: dict) -> None:
                case_rows.append(row)
                if on_row:
                    on_row(row)
                bar.update()

            tracker = Tracker(config, emit, retries=0)
            for case in cases:
                todo = [b for b in config.backends if (case.id, b.name) not in done]
                if not todo:
                    continue
                bar.set_postfix_str(case.id[-40:])
                case_rows.clear()
                local = [b for b in todo if b.name not in config.isolated]
                for kind, row in case_events(case, local, config, contexts):
                    if kind == "row":
                        tracker.row(row)  # its output shown, then emit
                called = []
                for backend in (b for b in todo if b.name in config.isolated):  # skips made here, the rest there
                    if reason := backend.skip_reason(case, config.device):
                        emit(row_without_call(case, backend, config, "skip", reason))
                    else:
                        called.append(backend.name)
                if called:  # called in the worker, graded here against this process's oracle
                    worker.call_case(Task(case, called), shipped, tracker, contexts.get(case, config))
                contexts.drop(config)
                rows.extend(sorted(case_rows, key=lambda row: order[row["backend"]]))
    finally:
        if worker is not None:
            worker.stop()
    return to_frame(rows)


@dataclass
class InProcess:
    """The executor of a run without ``--workers`` or ``--ray``; ``worker``: the CLI's isolation worker."""

    worker: Worker | None = None

    def run(self, cases: list[Case], config: RunConfig, on_row: Callable[[dict], None], done) -> dict:
        take_phases()
        run_cases(cases, config, on_row=on_row, done=done, worker=self.worker)  # isolated backends' phases included
        return {"mode": "one process", "gpus": [], "phase_s": rounded(take_phases())}
