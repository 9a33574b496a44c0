"""pytest plugin (``pytest_plugins = ["harness.pytest_plugin"]``): one test per (case, backend); a test asks
for ``harness_case`` and ``harness_backend`` and ``harness_session.run(case, backend)`` returns the row."""

import sys
from pathlib import Path

import pytest

from harness.backends.builtin import REGISTRY, load_plugin, resolve_backends
from harness.cases.loading import load_cases
from harness.cases.packaged import resolve_case_arg
from harness.cases.spec import CaseFileError, check_backend_names
from harness.cli.options import DEFAULT_CASES, add_run_options, apply_threads, default_device
from harness.cli.resume import ordered
from harness.execute import xdist as xdist_rows
from harness.execute.loop import Contexts, case_events
from harness.results import report
from harness.results.environment import collect_meta
from harness.results.storage import write_run
from harness.run import oracle_cache
from harness.run.runner import COLUMNS, RunConfig, to_frame


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("paged-attention harness")
    group.addoption("--cases", action="append", default=None, metavar="PATH", help="case file or folder (repeatable)")
    add_run_options(group)
    group.addoption("--harness-report", type=Path, default=None, metavar="DIR", help="write a run folder at the end")
    group.addoption("--harness-timing", action="store_true", help="time every (case, backend) row too")


PLUGIN_NOTE = (
    "note: under pytest a plugin is imported into the process that grades it, so it can reach its own "
    "verdict; `harness run --plugin` keeps it in a worker of its own (docs/contract.md#threat-model)\n"
)


class HarnessSession:
    """Per pytest session: the selected cases and backends, the last case's inputs and oracle, the rows."""

    def __init__(self, config: pytest.Config):
        self.device = config.getoption("harness_device") or default_device()
        try:
            for plugin in config.getoption("harness_plugins"):
                load_plugin(plugin)
            if config.getoption("harness_plugins"):  # the route's limit, said where it runs
                sys.stderr.write(PLUGIN_NOTE)
            backends = resolve_backends(config.getoption("harness_backends"))
            given = [resolve_case_arg(p) for p in config.getoption("cases") or []]
            paths = given or [config.rootpath / p for p in DEFAULT_CASES]
            self.cases = load_cases(paths, self.device, config.getoption("harness_tags"))
            check_backend_names(self.cases, list(REGISTRY))  # a misspelt backend in a case file is bad input
        except (CaseFileError, ValueError) as error:
            raise pytest.UsageError(str(error)) from None
        threads = None
        if config.getoption("harness_timing"):
            threads = apply_threads(config.getoption("harness_threads"), self.device)
        oracle_device = config.getoption("harness_oracle_device") or "cpu"
        self.config = RunConfig(self.device, backends, timing=config.getoption("harness_timing"),
                                oracle_device=oracle_device, progress=False, threads=threads)  # fmt: skip
        self.rows: list[dict] = []
        self.contexts = Contexts()  # the case's inputs and oracle, shared by its tests

    def run(self, case, backend) -> dict:
        """The row of ``backend`` on ``case``, from the one per-case loop every executor runs."""
        *_, (_, row) = case_events(case, [backend], self.config, self.contexts)
        self.rows.append(row)
        return row


_SESSION_KEY = pytest.StashKey[HarnessSession]()


def _session(config: pytest.Config) -> HarnessSession:
    if _SESSION_KEY not in config.stash:
        config.stash[_SESSION_KEY] = HarnessSession(config)
    return config.stash[_SESSION_KEY]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "harness_case" not in metafunc.fixturenames:
        return
    session = _session(metafunc.config)
    backends = session.config.backends
    params = [pytest.param(case, b, id=f"{case.id}-{b.name}") for case in session.cases for b in backends]
    metafunc.parametrize(("harness_case", "harness_backend"), params)


@pytest.fixture
def harness_session(request: pytest.FixtureRequest) -> HarnessSession:
    return _session(request.config)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    target = session.config.getoption("harness_report", None)
    if getattr(session.config, "workerinput", {}).get(xdist_rows.ROWS_DIR):  # pytest -n: the controller writes the run
        if _SESSION_KEY in session.config.stash:
            xdist_rows.save_worker_rows(session.config, session.config.stash[_SESSION_KEY].rows)
        return
    merged = xdist_rows.collect_rows(session.config)  # None without pytest -n
    if target is None or (merged is None and _SESSION_KEY not in session.config.stash):
        return
    harness = _session(session.config)
    frame = to_frame(harness.rows if merged is None else merged)
    meta = collect_meta(harness.device, ["pytest", *sys.argv[1:]], {}, oracle_cache.meta_record())
    if merged is not None:  # in test order: case order, then backend order
        frame = ordered(frame, harness.cases, harness.config.backends, COLUMNS)
        meta["gpus"], note = xdist_rows.run_gpus(merged)
        meta["device_name"] = note or meta["device_name"]
    path = write_run(frame, meta, target, page=report.render_html)
    print(f"\nharness report: {path / 'report.html'}")


# pytest-xdist (pytest -n N): a GPU per worker, and the workers' rows merged into one run folder.


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config: pytest.Config, specs) -> None:
    xdist_rows.pin_gpus(config, specs)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    xdist_rows.hand_rows_folder(node)
