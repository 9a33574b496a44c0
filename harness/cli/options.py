"""What the verbs share: the run options (for the CLI and pytest, so destinations carry a ``harness_`` prefix:
pytest keeps ``-p`` in ``plugins``), ``-k``, bad input and the exit codes."""

import argparse
import contextlib
import fnmatch
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from harness.cases.loading import load_cases
from harness.cases.packaged import packaged_suites, resolve_case_arg

EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_INTERRUPTED, EXIT_BROKEN_PIPE, EXIT_TERMINATED = 130, 141, 143  # 128 + SIGINT, SIGPIPE, SIGTERM

DEFAULT_CASES = [str(packaged_suites()["smoke"])]  # what `run`, `list` and pytest read when given no case file


class BadInput(Exception):
    """An argument or input the user must fix; printed as one message, exit code 2."""


@contextlib.contextmanager
def as_bad_input(caught: type[Exception] = ValueError):
    try:
        yield
    except caught as error:
        raise BadInput(str(error)) from None


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def chosen_device(given: str | None) -> str:
    """``--device`` as given, else :func:`default_device`; BadInput for cuda where torch sees no GPU."""
    device = given or default_device()
    if device == "cuda" and not torch.cuda.is_available():
        raise BadInput("--device cuda: no CUDA device is visible to torch")
    return device


def prog() -> str:
    """How the user called us: the console script ``harness``, else ``python -m harness`` (for --help and meta.json)."""
    return "harness" if Path(sys.argv[0]).name == "harness" else "python -m harness"


def _positive_int(text: str) -> str:
    if not text.isdigit() or int(text) < 1:
        raise ValueError("give a positive integer")
    return str(int(text))


def _fraction(text: str) -> str:
    with contextlib.suppress(ValueError):
        if 0.0 < (value := float(text)) <= 1.0:
            return repr(value)
    raise ValueError("give a fraction in (0, 1]")


def _set_env(env: str, check=_positive_int) -> type[argparse.Action]:
    """An action that checks the value with ``check`` and puts it in the environment variable ``env`` as well as
    in the namespace: the case loader, the oracle cache and workers read it without threading it through."""

    class SetEnv(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            try:
                value = check(str(values))
            except ValueError as error:
                parser.error(f"{option_string} {values}: {error}")
            os.environ[env] = value
            setattr(namespace, self.dest, value)

    return SetEnv


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
    """Set torch's intra-op thread count for the run and return it: default 1 on a CPU (more threads fight
    the neighbours for cores), torch's default on CUDA and for ``auto``; at most this machine's cores."""
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


def add_run_options(parser, advanced=None) -> None:
    """The run options on ``parser``, an argparse parser (the advanced ones on ``advanced``, an argument group, when
    given) or a pytest OptionGroup (parser.getgroup(...), whose addoption takes argparse's keywords)."""
    for option in RUN_OPTIONS:
        target = advanced if option.advanced and advanced is not None else parser
        add = target.addoption if hasattr(target, "addoption") else target.add_argument
        add(option.flag, help=option.help, **option.kwargs)


PATTERN_HELP = (
    "only cases whose id matches EXPRESSION, as pytest's -k: a word matches ids containing it (any case), a word "
    "with * ? or [ is a glob over the whole id; words join with and, or, not and parentheses "
    "('decode and not fp8', 'prefill_*/dtype=float32')"
)


def add_pattern(parser: argparse.ArgumentParser) -> None:
    """``-k EXPRESSION`` on ``parser`` (the CLI's only: pytest has a -k of its own)."""
    parser.add_argument("-k", dest="pattern", metavar="EXPRESSION", help=PATTERN_HELP)


def compile_pattern(text: str) -> Callable[[str], bool]:
    """``-k``'s expression (:data:`PATTERN_HELP`) as a test of a case id; BadInput naming what is wrong with it.
    ``expr := term ('or' term)*``, ``term := factor ('and' factor)*``, ``factor := 'not' factor | '(' expr ')' | WORD``.
    """
    tokens = re.findall(r"[()]|[^\s()]+", text)[::-1]  # taken from the end

    def fail(what: str):
        raise BadInput(f"-k {text!r}: {what}")

    def peek() -> str | None:
        return tokens[-1] if tokens else None

    def joined(word: str, part: Callable, combine: Callable) -> Callable[[str], bool]:
        parts = [part()]
        while peek() == word:
            tokens.pop()
            parts.append(part())
        return parts[0] if len(parts) == 1 else lambda name: combine(p(name) for p in parts)

    def expr() -> Callable[[str], bool]:
        return joined("or", lambda: joined("and", factor, all), any)

    def factor() -> Callable[[str], bool]:
        if not tokens:
            fail("the expression ends where a name was expected")
        token = tokens.pop()
        if token == "not":
            inner = factor()
            return lambda name: not inner(name)
        if token == "(":
            inner = expr()
            if peek() != ")":
                fail("a '(' is never closed")
            tokens.pop()
            return inner
        if token in (")", "and", "or"):
            fail(f"{token!r} where a name was expected")
        word = token.lower()
        if any(c in word for c in "*?["):
            return lambda name: fnmatch.fnmatchcase(name.lower(), word)
        return lambda name: word in name.lower()

    if not tokens:
        fail("an empty expression")
    matches = expr()
    if peek() is not None:
        fail(f"{peek()!r} after a complete expression (join names with and / or)")
    return matches


def resolved_cases(cases: list[str]) -> list:
    """Case arguments as paths (a packaged suite's name resolved); a name that is neither is bad input."""
    resolved = [resolve_case_arg(c) for c in cases]
    for given, found in zip(cases, resolved, strict=True):
        if not Path(found).exists():
            raise BadInput(f"{given}: no such case file or folder, and not a packaged suite "
                           f"(packaged suites: {', '.join(packaged_suites())})")  # fmt: skip
    return resolved


def load(cases: list[str], device: str, tags: list[str] | None, backends: list[str] | None = None,
         pattern: str | None = None) -> list:  # fmt: skip
    paths = resolved_cases(cases) or DEFAULT_CASES
    keep = compile_pattern(pattern) if pattern is not None else None
    loaded = load_cases(paths, device=device, tags=tags, backends=backends, keep=keep)
    if not loaded:
        raise BadInput(f"no cases selected from {' '.join(map(str, paths))}"
                       + (f" with tags {tags}" if tags else "")
                       + (f" matching -k {pattern!r}" if pattern else ""))  # fmt: skip
    return loaded
