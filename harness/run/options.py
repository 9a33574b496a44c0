"""Run options, defined once and added to both the CLI (argparse) and pytest.

Destinations carry a ``harness_`` prefix: pytest itself keeps ``-p`` in ``plugins``.

The noxfile passes its arguments through to these same flags.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.cases.packaged import default_cases

DEFAULT_CASES = default_cases()  # what `run`, `list` and pytest read when given no case file


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _positive_int(text: str) -> str:
    if not text.isdigit() or int(text) < 1:
        raise ValueError("give a positive integer")
    return str(int(text))


def _fraction(text: str) -> str:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:
        raise ValueError("give a fraction in (0, 1]")
    return repr(value)


class SetEnv(argparse.Action):
    """Checks the value with ``check`` and puts it in the environment variable ``env`` as well as in
    the namespace: read where the setting is used (the case loader, the oracle cache, a worker
    process) without threading it through every call."""

    def __init__(self, *args, env: str, check, **kwargs):
        self.env, self.check = env, check
        super().__init__(*args, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            value = self.check(str(values))
        except ValueError as error:
            parser.error(f"{option_string} {values}: {error}")
        os.environ[self.env] = value
        setattr(namespace, self.dest, value)


def _set_env(env: str, check=_positive_int):
    return lambda *args, **kwargs: SetEnv(*args, env=env, check=check, **kwargs)


@dataclass(frozen=True)
class Option:
    flag: str
    help: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    advanced: bool = False  # listed under "oracle and inputs" in --help, after the everyday options


RUN_OPTIONS = [
    Option("--backend", "run only this backend (repeatable); default: every registered backend",
           {"action": "append", "dest": "harness_backends", "metavar": "NAME"}),
    Option("--device", "cpu or cuda; default: cuda when a GPU is present",
           {"choices": ["cpu", "cuda"], "dest": "harness_device"}),
    Option("--plugin", "import MODULE_OR_PATH, which calls harness.register_backend (repeatable)",
           {"action": "append", "dest": "harness_plugins", "default": [], "metavar": "MODULE_OR_PATH"}),
    Option("--tag", "run only cases carrying this tag (repeatable)", {"action": "append", "dest": "harness_tags", "metavar": "TAG"}),
    Option("--oracle-device", "where the float64 oracle runs; default: the CPU",
           {"choices": ["cpu", "cuda"], "dest": "harness_oracle_device"}, advanced=True),
    Option("--max-sweep-points", "most cases a case file's [case.sweep] tables may expand to, counted before any is "
           "built (default 10000; also $HARNESS_MAX_SWEEP_POINTS)",
           {"dest": "harness_max_sweep_points", "metavar": "N", "action": _set_env("HARNESS_MAX_SWEEP_POINTS")}, advanced=True),
    Option("--no-oracle-cache", "compute every float64 oracle; neither read nor write the oracle cache",
           {"dest": "harness_no_oracle_cache", "nargs": 0, "const": "off",
            "action": _set_env("HARNESS_ORACLE_CACHE", check=lambda _: "off")}, advanced=True),
    Option("--verify-oracle-cache", "recompute this fraction of the oracle cache's hits, chosen at random, and stop "
           "with exit 2 naming an entry that differs (default 1: every hit)",
           {"dest": "harness_verify_oracle_cache", "nargs": "?", "const": "1", "metavar": "FRACTION",
            "action": _set_env("HARNESS_ORACLE_CACHE_VERIFY", check=_fraction)}, advanced=True),
    Option("--threads", "torch intra-op threads for the run: N (at most the machine's cores) or 'auto' (torch's default); "
           "default 1 on a CPU",
           {"dest": "harness_threads", "metavar": "N|auto"}, advanced=True),
]  # fmt: skip


def apply_threads(value: str | None, device: str) -> int:
    """Set torch's intra-op thread count for the run and return it.

    Default on a CPU: 1. On a shared 2-core machine one thread ran the CPU suite about 4x
    faster than two and made reruns of one commit agree (two threads fight the neighbours
    for cores, and one run's reference timings came out 3.4x off the other's), so timings
    compare across commits. On CUDA the host threads hardly matter: torch's default stays.
    ``auto`` keeps torch's default anywhere. A count past this machine's cores is taken as
    the cores (more threads only fight each other; a resumed journal from a larger host, or a
    file's absurd count, must not spawn thousands): the returned count is what ran.
    """
    if value is None:
        value = "1" if torch.device(device).type == "cpu" else "auto"
    if value != "auto":
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"--threads {value}: give a positive integer or 'auto'")
        cores = os.cpu_count() or 1
        if int(value) > cores:
            print(f"warning: --threads {value}: this machine has {cores} cores; the run uses {cores}", file=sys.stderr)
        torch.set_num_threads(min(int(value), cores))
    return torch.get_num_threads()


def add_to_argparse(parser: argparse.ArgumentParser, advanced=None) -> None:
    """The run options on ``parser``; the advanced ones on ``advanced`` (an argument group) when given."""
    for option in RUN_OPTIONS:
        target = advanced if option.advanced and advanced is not None else parser
        target.add_argument(option.flag, help=option.help, **option.kwargs)


def add_to_pytest(group) -> None:
    """``group`` is a pytest OptionGroup (parser.getgroup(...)); it takes argparse-style kwargs."""
    for option in RUN_OPTIONS:
        group.addoption(option.flag, help=option.help, **option.kwargs)
