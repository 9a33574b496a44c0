"""Sessions: `nox -s tests` (what CI runs), `nox -s cpu` (a laptop's full run), `nox -s gpu`
(a CUDA box), `nox -s bench` (pytest-benchmark, saved and compared across commits), `nox -s lint`.

On a CPU machine torch is pinned to its CPU build (TORCH_SPEC, default torch==2.13.0, which
this team's machines keep on local disk); an unpinned `torch` would pull a multi-GB CUDA
build. The gpu session reuses the CUDA machine's own torch and Triton instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

nox.options.sessions = ["tests"]
# Reuse a session's virtualenv when it exists (`nox -s tests` the second time skips the
# ~2 min install); `nox --no-reuse-existing-virtualenvs` or `-N` rebuilds after a
# dependency change. Safe here: every session installs the project in editable mode, so a
# reused environment always runs the current code.
nox.options.reuse_existing_virtualenvs = True
TORCH_SPEC = os.environ.get("TORCH_SPEC", "torch==2.13.0")
# Where a CPU-only torch comes from on a machine whose default index serves the CUDA build
# (PyPI does for Linux): TORCH_INDEX=https://download.pytorch.org/whl/cpu. Unset, pip's
# configured index is used (this team's machines keep the CPU wheel on local disk).
TORCH_INDEX = os.environ.get("TORCH_INDEX")
ROOT = Path(__file__).parent


def install_cpu(session: nox.Session, extras: str = "test,triton") -> None:
    session.install(TORCH_SPEC, *(["--index-url", TORCH_INDEX] if TORCH_INDEX else []))
    session.install("-e", f".[{extras}]")


@nox.session
def tests(session: nox.Session) -> None:
    """Unit tests of kernels and harness, and the smoke case suite; the Triton kernel runs interpreted."""
    install_cpu(session)
    session.run("python", "-m", "pytest", *session.posargs, env={"TRITON_INTERPRET": "1"})


@nox.session
def cpu(session: nox.Session) -> None:
    """Everything a laptop can run: the tests, then the CPU case suite through every CPU backend, with a report."""
    install_cpu(session)
    env = {"TRITON_INTERPRET": "1"}
    session.run("python", "-m", "pytest", env=env)
    session.run("python", "-m", "harness", "run", "cases/cpu.toml", "--device", "cpu", *session.posargs, env=env)


@nox.session(venv_backend="none")
def gpu(session: nox.Session) -> None:
    """On a CUDA box: the tests natively (Triton compiled), then the GPU case suites, with a report.

    Runs in the machine's own Python, installing nothing: a CUDA box's torch and Triton are
    matched to its driver, and images often keep them in a virtualenv that a nested
    virtualenv's --system-site-packages would not see. The float64 oracle runs on the GPU
    (the CPU would take minutes on the 128k-token cases).
    """
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    session.run("python", "-m", "pytest", env=env)
    session.run(
        "python", "-m", "harness", "run", "cases/smoke.toml", "cases/gpu_peers.toml", "cases/gpu.toml", "cases/gpu_long.toml",
        "--device", "cuda", "--oracle-device", "cuda", *session.posargs, env=env,
    )  # fmt: skip


@nox.session
def bench(session: nox.Session) -> None:
    """pytest-benchmark suite; saved under .benchmarks/ and compared with the last saved run.

    The first run has nothing to compare with: it only saves. Later runs fail when a
    benchmark's median grew more than 25% over the previous saved run.
    """
    install_cpu(session)
    compare = []
    if any(ROOT.glob(".benchmarks/*/*.json")):
        compare = ["--benchmark-compare", "--benchmark-compare-fail=median:25%"]
    else:
        session.log("no saved benchmark run yet: this run is saved as the baseline")
    session.run(
        "python", "-m", "pytest", "benchmarks", "--benchmark-only", "--benchmark-autosave", *compare,
        *session.posargs, env={"TRITON_INTERPRET": "1"},
    )  # fmt: skip


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
