"""Fixtures of the harness tests."""

from pathlib import Path

import pytest

from harness.backends.builtin import resolve_backends
from harness.cases.spec import load_case_file
from harness.cli.main import main
from harness.execute.local import run_cases
from harness.run.runner import RunConfig
from tests.tiny_cases import write_cases


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """Untimed (``untimed``) and timed (``timed``) runs of one tiny case through reference, shared read-only."""
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


# Backends of the ``plugin`` fixture's plugin.py, each misbehaving its own way; they log under HARNESS_TEST_DIR.
PLUGIN = """
import ctypes, os, signal, sys, time
from pathlib import Path
import torch
import kernels
from harness import register_backend

DIR = Path(os.environ.get("HARNESS_TEST_DIR", "/nonexistent"))

def _marker(name):  # True once the test has made DIR / name, which it takes
    return (DIR / name).exists() and (DIR / name).unlink() is None

def good(*args, out=None, **kwargs):
    if DIR.exists():
        with (DIR / "calls").open("a") as f:
            f.write("call\\n")
    return kernels.paged_attention_tlsim(*args, out=out, **kwargs)

def hangs(*args, **kwargs):  # its pid a line in DIR / "hung" a call, and in DIR / "worker.pid"
    if DIR.exists():
        with (DIR / "hung").open("a") as f:
            f.write(f"{os.getpid()}\\n")
        (DIR / "worker.tmp").write_text(str(os.getpid()))
        (DIR / "worker.tmp").rename(DIR / "worker.pid")  # a reader never sees the file empty
    time.sleep(3600)

def sigterm_once(*args, out=None, **kwargs):
    if _marker("sigterm"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    return kernels.paged_attention_tlsim(*args, out=out, **kwargs)

def sigkill_once(*args, out=None, **kwargs):
    if _marker("sigkill"):
        os.kill(os.getpid(), signal.SIGKILL)
    return kernels.paged_attention_tlsim(*args, out=out, **kwargs)

def flood(*args, out=None, **kwargs):
    sys.stdout.write("o" * 50_000 + "\\n")
    sys.stderr.write("e" * 50_000 + "\\n")
    return kernels.paged_attention_tlsim(*args, out=out, **kwargs)

def threads(*args, out=None, **kwargs):
    (DIR / "threads").write_text(str(torch.get_num_threads()))
    return kernels.paged_attention_tlsim(*args, out=out, **kwargs)

def scaled_wrong(q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, scale=None, out=None):  # 1% off
    scale = q.shape[-1] ** -0.5 * 1.01
    return kernels.paged_attention_tlsim(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, out)

def raises(*args, **kwargs):
    raise RuntimeError("no kernel here")

def killer(q, *args, out=None, **kwargs):  # head_dim 48: a hang; head_dim 64: its worker killed (logged), every time
    if q.shape[-1] == 48:
        time.sleep(3600)
    if q.shape[-1] == 64:
        with (DIR / "kills").open("a") as f:
            f.write(f"{os.getpid()}\\n")
        os.kill(os.getpid(), signal.SIGKILL)
    return kernels.paged_attention_tlsim(q, *args, out=out, **kwargs)

for fn in (good, hangs, sigterm_once, sigkill_once, flood, threads, scaled_wrong, raises, killer):
    register_backend(fn.__name__, fn)
register_backend("cuda_only", kernels.paged_attention_tlsim, devices=("cuda",))
register_backend("os_exit", lambda *args, **kwargs: os._exit(0))
register_backend("segfault", lambda *args, **kwargs: ctypes.string_at(0))
register_backend("sys_exit", lambda *args, **kwargs: sys.exit(0))
"""


@pytest.fixture(scope="session")
def write_plugin():
    """``write_plugin(folder)``: writes PLUGIN's backends to ``folder / "plugin.py"`` and returns that path."""

    def write(folder: Path) -> Path:
        (folder / "plugin.py").write_text(PLUGIN)
        return folder / "plugin.py"

    return write


@pytest.fixture
def plugin(tmp_path, monkeypatch, write_plugin) -> Path:
    """tmp_path / "plugin.py" (PLUGIN's backends); HARNESS_TEST_DIR, which workers inherit, is tmp_path."""
    monkeypatch.setenv("HARNESS_TEST_DIR", str(tmp_path))
    return write_plugin(tmp_path)
