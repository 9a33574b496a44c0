"""Fixtures of the harness tests."""

import pytest

from harness.backends.builtin import resolve_backends
from harness.cases.spec import load_case_file
from harness.cli.main import main
from harness.execute.local import run_cases
from harness.run.runner import RunConfig
from tests.tiny_cases import write_cases


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """A real untimed run (``untimed``) and timed run (``timed``) of one tiny case through reference; made once a
    session (a worker's), read and copied but never changed by the tests."""
    root = tmp_path_factory.mktemp("runs")
    cases = write_cases(root / "tiny.toml", {"name": "tiny"})
    for name, extra in (("untimed", ["--no-timing"]), ("timed", [])):
        argv = ["run", str(cases), "--out", str(root / name), "--backend", "reference", "--no-progress", *extra]
        assert main(argv) == 0
    return root


@pytest.fixture
def run_rows():
    """``run_rows(case_file, names, **config)``: rows of ``names`` run in process (untimed by default), by backend."""

    def run(case_file, names, timing=False, **config):
        config = RunConfig(device="cpu", backends=resolve_backends(names), timing=timing, progress=False, **config)
        return run_cases(load_case_file(case_file), config).set_index("backend")

    return run
