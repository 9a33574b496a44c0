"""Fixtures of the harness tests."""

import pytest

from harness.cli.main import main
from tests.tiny_cases import write_cases


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A real untimed run (``untimed``) and timed run (``timed``) of one tiny case through reference."""
    root = tmp_path_factory.mktemp("runs")
    cases = write_cases(root / "tiny.toml", {"name": "tiny"})
    for name, extra in (("untimed", ["--no-timing"]), ("timed", [])):
        argv = ["run", str(cases), "--out", str(root / name), "--backend", "reference", "--no-progress", *extra]
        assert main(argv) == 0
    return root
