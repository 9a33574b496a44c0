"""On a CPU machine torch is pinned to its CPU build (TORCH_SPEC, default torch==2.13.0, which
this team's machines keep on local disk); an unpinned `torch` would pull a multi-GB CUDA
build. The gpu session reuses the CUDA machine's own torch and Triton instead.

Virtualenvs are made and filled by uv where it is installed (`pip install nox uv`), else by virtualenv and pip.
The suite starts hundreds of interpreters, and each would compile torch's bytecode again where none is cached
(an import of torch twice as slow). So the sessions write bytecode as they import, into .nox/pycache
(PYTHONPYCACHEPREFIX, which keeps it out of the source tree and the folders tests watch), clearing the
PYTHONDONTWRITEBYTECODE that CI machines often set. That compiles only the modules imported, where compiling the
venv at install (pip's way) made a 4 s install 41 s on 2 cores. The mutants session compiles at install instead,
since scripts/mutants.py turns writing off. uv reads no pip configuration, so a wheel folder handed to pip through
PIP_FIND_LINKS is handed to uv too (UV_FIND_LINKS).
"""

from __future__ import annotations

import os
from pathlib import Path

import nox
from nox.command import CommandFailed

nox.options.sessions = ["tests"]
# Reuse a session's virtualenv (skips the install; `-N` rebuilds after a dependency change):
# every session installs the project in editable mode, so a reused one runs the current code.
nox.options.reuse_existing_virtualenvs = True
nox.options.default_venv_backend = "uv|virtualenv"
ROOT = Path(__file__).parent
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
os.environ["PYTHONPYCACHEPREFIX"] = str(ROOT / ".nox" / "pycache")
if os.environ.get("PIP_FIND_LINKS") and not os.environ.get("UV_FIND_LINKS"):
    os.environ["UV_FIND_LINKS"] = os.environ["PIP_FIND_LINKS"]
TORCH_SPEC = os.environ.get("TORCH_SPEC", "torch==2.13.0")
# Where the default index serves the CUDA build (PyPI does for Linux): TORCH_INDEX=https://download.pytorch.org/whl/cpu.
TORCH_INDEX = os.environ.get("TORCH_INDEX")


def install_cpu(session: nox.Session, extras: str = "test,triton", compile_bytecode: bool = False) -> None:
    env = {"UV_COMPILE_BYTECODE": "1"} if compile_bytecode else None
    session.install(TORCH_SPEC, *(["--index-url", TORCH_INDEX] if TORCH_INDEX else []), env=env)
    session.install("-e", f".[{extras}]", env=env)


# Two workers (`-- -n 0` turns them off): on a 2-core box the suite is mostly single-threaded Python, so two
# halve it; worksteal: a worker that runs out takes the other's queued tests, leaving no core idle at the end.
PYTEST_ON_TWO_CORES = ("python", "-m", "pytest", "-n", "2", "--dist", "worksteal")


@nox.session
def tests(session: nox.Session) -> None:
    """Unit tests of kernels and harness, and the smoke case suite; the Triton kernel runs interpreted.

    With the ray and xdist extras, so the scale-out equivalences run in CI instead of skipping. The tests marked
    slow are `nox -s slow`'s (run by hand, about 8 minutes), the mutants' catch run `nox -s mutants`' (a later -m
    wins)."""
    install_cpu(session, "test,triton,ray,xdist")
    session.run(*PYTEST_ON_TWO_CORES, "-m", "not slow and not mutants", *session.posargs,
                env={"TRITON_INTERPRET": "1"})  # fmt: skip


@nox.session
def slow(session: nox.Session) -> None:
    """The tests marked slow, and only those: worker faults and a local 2-CPU Ray cluster, the kernels
    compiled for sm_90 and through torch.compile on the CPU, the scripts' and the example plugin's dry runs."""
    install_cpu(session, "test,triton,ray,xdist")
    session.run(*PYTEST_ON_TWO_CORES, "-m", "slow and not mutants", *session.posargs,
                env={"TRITON_INTERPRET": "1"})  # fmt: skip


@nox.session
def cpu(session: nox.Session) -> None:
    """The CPU case suite through every CPU backend, with its report (about two minutes on 2 cores); the unit
    tests are `nox -s tests`' job."""
    install_cpu(session)
    env = {"TRITON_INTERPRET": "1"}
    session.run("python", "-m", "harness", "run", "cases/cpu.toml", "--device", "cpu", *session.posargs, env=env)


@nox.session(venv_backend="none")
def gpu(session: nox.Session) -> None:
    """On a CUDA box, in under 10 minutes on one H200: the GPU tests natively, then every backend on the smoke,
    peer, GPU and 128k-token suites, with a report and where the time went (outputs under $OUT, default gpu_out/;
    arguments after ``--`` go to ``harness run``). The machine's own Python, installing nothing: a CUDA box's
    torch and Triton are matched to its driver."""
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    session.run("bash", "scripts/gpu_run.sh", "all", *session.posargs, env=env, external=True)


@nox.session
def bench(session: nox.Session) -> None:
    """pytest-benchmark suite: run, compare with the last passing run (same statistics as
    `harness compare`, every benchmark re-timed in paired rounds), and save the run only when it passes.

        nox -s bench                                  # baseline: the newest saved run of this machine
        nox -s bench -- --baseline 0003               # or a named one (number, part of the name, or a path)
        nox -s bench -- --min-effect 0.2 --cases cases/cpu.toml   # other arguments go to pytest

    On the CPU it times with one intra-op thread unless OMP_NUM_THREADS is set.
    """
    install_cpu(session)
    args, compare_args = list(session.posargs), []
    for flag in ("--baseline", "--min-effect"):
        if flag in args:
            i = args.index(flag)
            compare_args += args[i : i + 2]
            del args[i : i + 2]
    new = Path(session.create_tmp()) / "bench-new.json"
    env = {"TRITON_INTERPRET": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    try:
        session.run(
            "python", "-m", "pytest", "benchmarks", "-q", "-p", "no:cacheprovider", "--benchmark-only",
            f"--benchmark-json={new}", "--benchmark-columns=median,iqr,rounds", *args, env=env,
        )  # fmt: skip
    except CommandFailed:
        session.error("bench: the benchmark run failed (see above): nothing saved")
    try:
        session.run("python", "benchmarks/saved.py", "compare", str(new), "--confirm", *compare_args)
    except CommandFailed:
        session.error("bench: slower than the baseline (see the summary above): this run is not saved")
    session.run("python", "benchmarks/saved.py", "save", str(new))


@nox.session
def fuzz(session: nox.Session) -> None:
    """The wide sweeps, long: the hypothesis property test over the case space (1000 examples; CI runs 30)
    and the kernel sweep over the contract's ranges (200 examples; the quick loop runs their edges)."""
    install_cpu(session)
    env = {
        "TRITON_INTERPRET": "1",
        "HARNESS_HYPOTHESIS_EXAMPLES": os.environ.get("HARNESS_HYPOTHESIS_EXAMPLES", "1000"),
        "KERNEL_SWEEP_EXAMPLES": os.environ.get("KERNEL_SWEEP_EXAMPLES", "200"),
    }
    session.run("python", "-m", "pytest", "tests/harness/test_hypothesis_cases.py", "tests/kernels/test_kernel_contract_sweep.py",
                *session.posargs, env=env)  # fmt: skip


@nox.session
def coverage(session: nox.Session) -> None:
    """Branch coverage of kernels/ by the quick kernel tests, the Triton kernel interpreted (coverage.py
    follows its Python): the modules' percentages and the lines and branches not reached (docs/mutants.md
    names the unreached ones and why). Arguments go to pytest (`-- tests/kernels/test_dispatch.py` adds a file)."""
    install_cpu(session, "test,triton,xdist")
    quick = ["tests/kernels/test_kernel_edges.py", "tests/kernels/test_kernel_contract_edges.py"]  # README's loop
    session.run("python", "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", *quick, "--cov",
                "--cov-report=term-missing", *session.posargs, env={"TRITON_INTERPRET": "1"})  # fmt: skip


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, then the import contracts in pyproject.toml (the layers of harness/, kernels never importing it)."""
    session.install("ruff", "import-linter")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("lint-imports", env={"PYTHONPATH": str(ROOT)})


@nox.session
def mutants(session: nox.Session) -> None:
    """Plant each kernel slip of scripts/mutants.toml in a copy of the tree and run the quick tests against it:
    fails on any survivor, on a mutant whose text is no longer in the code, and when the tests fail on the
    unmutated tree (docs/mutants.md).

        nox -s mutants                                  # all of them, two at a time
        nox -s mutants -- --only triton-alibi-sign      # some (arguments go to scripts/mutants.py)
        nox -s mutants -- --record                      # rewrite each mutant's caught_by
    """
    install_cpu(session, compile_bytecode=True)
    env = {"TRITON_INTERPRET": "1", "PYTHONPYCACHEPREFIX": None}  # the venv's own __pycache__, compiled at install
    session.run("python", "scripts/mutants.py", *session.posargs, env=env)
