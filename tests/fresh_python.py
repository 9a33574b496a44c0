"""Python in a fresh interpreter from the repository's root, for tests whose subject is a new process:
a script's command line, an environment variable read at import, Triton compiling instead of interpreting;
and git in a repository of the test's own."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import kernels

ROOT = Path(__file__).resolve().parent.parent


def run_script(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """python ARGS with the repository on PYTHONPATH and the Triton kernel interpreted."""
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": pythonpath, "TRITON_INTERPRET": "1"}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def run_fresh(*args: str) -> subprocess.CompletedProcess:
    """python ARGS, Triton compiling (not interpreting)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_DEFAULT_FP_FUSION": "1"}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True)


def git_in(root: Path) -> Callable[..., str]:
    """``git(*args)`` in ``root``, made a new repository (branch main), by a fixed author and without the user's
    git config; it returns git's stdout, stripped."""
    root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": "/dev/null"}  # fmt: skip

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, env=env, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    git("init", "-q", "-b", "main")
    return git


def _ptxas_available() -> bool:
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return False
    tools = Path(next(iter(spec.submodule_search_locations))) / "backends" / "nvidia" / "bin"
    return (tools / "ptxas").exists() and (tools / "cuobjdump").exists()


needs_ptxas = pytest.mark.skipif(
    not kernels.has_triton() or not _ptxas_available(), reason="needs Triton with its NVIDIA backend (ptxas, cuobjdump)"
)
