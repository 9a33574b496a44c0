"""The one list of backends: what each is, where it runs, how it prepares a call.

``prepare(case, inputs, out)`` does the setup outside the timed region and returns a :class:`Prepared`."""

import importlib
import importlib.util
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from harness.backends.interpreter import correct_bf16, interpreting
from harness.backends.plugins import CaseFacts, Limits, case_facts
from harness.cases.inputs import PagedInputs
from harness.cases.spec import Case
from harness.cases.variants import VARIANT_KEYS, variant_key
from kernels.cascade import cascade_attention

KINDS = ("kernel", "engine path", "peer", "plugin")


class Unsupported(Exception):
    """Raised by ``prepare`` when a backend cannot serve this case; the row is a skip with the message."""


@dataclass(frozen=True)
class Prepared:
    """What a backend times, and how its result (``to_packed``) becomes [num_tokens, num_q_heads, head_dim]."""

    run: Callable[[], Any]  # the call graded and timed for device time (latency_us)
    to_packed: Callable[[Any], torch.Tensor] = lambda result: result
    note: str = ""  # shown in the report: which path a dispatch chose, which peer variant ran
    call: Callable[[], Any] | None = None  # the call as a user makes it (call_us); None: the same as run
    out: torch.Tensor | None = None  # the buffer run() is handed, poisoned with NaN before every timed call
    follows_inputs: bool = False  # run() reads the case's input tensors themselves: in-place changes reach it
    plan_us: float | None = None  # microseconds of the backend's plan step in prepare; None: none


@dataclass(frozen=True)
class Backend:
    name: str
    prepare: Callable[[Case, PagedInputs, torch.Tensor], Prepared]
    devices: tuple[str, ...]
    kind: str  # one of KINDS
    description: str = ""
    graphable: bool = True  # False: never time it from a CUDA graph (a capture is tried otherwise)
    unavailable: Callable[[Case, str], str | None] = field(default=lambda case, device: None)
    variants: frozenset[str] = frozenset()  # the VARIANT_KEYS it computes; a case turning on another is a skip row
    model: bool = False  # a Python model over torch ops (reference, tlsim): on a GPU graded, not timed (MODEL_BUDGET_S)
    limits: Limits = field(default_factory=Limits)  # the cases it serves (harness.backends.plugins)
    plan_step: bool = False  # prepare runs a plan step: its rows carry plan_us
    supports_hook: bool = False  # a supports(facts) hook in ``unavailable`` (run where the backend's code is)

    def __post_init__(self):
        if unknown := set(self.variants) - set(VARIANT_KEYS):
            raise ValueError(f"backend {self.name!r}: unknown variant(s) {sorted(unknown)}; known: {VARIANT_KEYS}")

    def skip_reason(self, case: Case, device: str) -> str | None:
        """Why this backend does not run ``case`` on ``device``, or None when it does (checked before ``prepare``)."""
        device_type = torch.device(device).type
        if device_type not in self.devices:
            return f"{self.name} runs on {', '.join(self.devices)}, not {device_type}"
        if not case.wants(self.name):
            return "excluded by the case file"
        if missing := sorted(case.variants - self.variants):
            return f"{self.name} does not support {', '.join(missing)} (it declares: {', '.join(sorted(self.variants)) or 'none'})"
        if refusal := self.limits.refusal(case, device):
            return f"{self.name} {refusal}"
        return self.unavailable(case, device)


REGISTRY: dict[str, Backend] = {}


def facts_of(case: Case, device: str) -> CaseFacts:
    """The case's :class:`harness.backends.plugins.CaseFacts` in this process (whether Triton is interpreted here)."""
    return case_facts(case, device, torch.device(device).type == "cpu" and interpreting())


def timed_us(fn: Callable[[], Any], cuda: bool, device: torch.device | None = None) -> tuple[Any, float]:
    """(what ``fn()`` returned, its microseconds), ``device`` drained around it when ``cuda``."""
    if cuda:
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    made = fn()
    if cuda:
        torch.cuda.synchronize(device)
    return made, (time.perf_counter() - started) * 1e6


def contract_prepare(fn: Callable[..., torch.Tensor], plan: Callable[[CaseFacts], Any] | None = None,
                     decode_form: bool = True, **hints: Callable[[Case], Any]):  # fmt: skip
    """prepare() for a function with the kernel contract signature. run() passes the NaN-poisoned ``out`` and
    the keyword ``hints`` computed from the case; call() is the bare default call, ``query_start_loc=None``
    in a decode case (unless not ``decode_form``). Both pass the case's variants' keywords and the plan
    step's result as ``plan=`` (its time: ``Prepared.plan_us``)."""

    def prepare(case: Case, inputs: PagedInputs, out: torch.Tensor) -> Prepared:
        args = inputs.args()
        options = dict(inputs.options)
        extra = {name: make(case) for name, make in hints.items()}
        plan_us = None
        if case.cascade:  # kernels.cascade: the shared prefix and the rest as two calls, merged by lse
            if plan is not None:
                raise Unsupported("cascade calls the kernel on the prefix and the suffix, shapes other than the "
                                  "case's: its plan step is made for the case's own")  # fmt: skip
            del options["return_lse"]
            run = partial(cascade_attention, fn, *args, case.prefix_blocks, out=out, **options)
            return Prepared(run=run, note=f"cascade: {case.prefix_blocks} shared blocks + suffix, merged by lse",
                            out=out, follows_inputs=True)  # fmt: skip
        if plan is not None:
            facts = facts_of(case, str(inputs.q.device))
            cuda = facts.device == "cuda" and torch.cuda.is_initialized()
            options["plan"], plan_us = timed_us(lambda: plan(facts), cuda)
        call_args = (*args[:5], None) if decode_form and all(q_len == 1 for q_len in case.q_lens) else args
        return Prepared(run=lambda: fn(*args, out=out, **extra, **options), call=lambda: fn(*call_args, **options),
                        out=out, follows_inputs=True, plan_us=plan_us)  # fmt: skip

    return prepare


def add_backend(backend: Backend) -> Backend:
    """Put a backend in the registry; a taken name is an error (nothing can be shadowed)."""
    if backend.kind not in KINDS:
        raise ValueError(f"backend {backend.name!r}: kind must be one of {KINDS}, got {backend.kind!r}")
    if backend.name in REGISTRY:
        raise ValueError(f"backend {backend.name!r} is already registered ({REGISTRY[backend.name].kind})")
    REGISTRY[backend.name] = backend
    return backend


def _runs_in_its_worker(case: Case, inputs: PagedInputs, out: torch.Tensor) -> Prepared:
    raise RuntimeError("a plugin's backend is called in its worker process, never in the driver")


def add_remote_backend(registration: dict) -> Backend:
    """Register in the driver a plugin backend its worker reported (plain values), without importing the
    plugin; ValueError on a field of the wrong type, an unknown variant or a limit that is not one."""

    def checked(what: str, kind: type, default=None, value=...):
        """The registration's ``what`` (or ``value``, one of its items) if a ``kind`` (a name not blank)."""
        value = registration.get(what, default) if value is ... else value
        if not isinstance(value, kind) or (what == "name" and not value.strip()):
            words = {str: "a string", bool: "a bool"}.get(kind, "a list")
            raise ValueError(f"a plugin reported a backend whose {what} is not {words}: {value!r}")
        return value

    def texts(what: str, default=None) -> tuple[str, ...]:
        return tuple(checked(what, str, value=item) for item in checked(what, list | tuple, default))

    name = checked("name", str)
    return add_backend(Backend(name, _runs_in_its_worker, texts("devices"), "plugin", checked("description", str, ""),
                               bool(registration.get("graphable", True)),
                               variants=frozenset(map(variant_key, texts("variants", []))),
                               limits=Limits.from_plain(registration.get("limits", {}), f"backend {name!r}: limits"),
                               plan_step=checked("plan", bool, False),
                               supports_hook=checked("supports", bool, False)))  # fmt: skip


class PluginLoadError(ValueError):
    """A plugin that cannot be imported; ``detail``: the cause and where it arose, what a worker reports."""

    def __init__(self, message: str, detail: str):
        super().__init__(message)
        self.detail = detail


def load_plugin(module_or_path: str) -> None:
    """Import a plugin module by dotted name or file path (it calls register_backend), bf16 corrected first
    under Triton's CPU interpreter; PluginLoadError (a ValueError) with the cause when it cannot be imported."""
    correct_bf16()
    path = Path(module_or_path)
    try:
        if path.suffix == ".py" or path.exists():
            if not path.is_file():
                raise FileNotFoundError(f"no such file: {path}")
            module_name = f"harness_plugin_{path.stem}"
            spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
        else:
            importlib.import_module(module_or_path)
    except Exception as error:  # any failure to import is bad input, reported with its cause and where it arose
        frames = [f for f in traceback.extract_tb(error.__traceback__) if "importlib" not in f.filename]
        detail = f"{type(error).__name__}: {error}"
        if frames[1:]:  # the innermost frame past this function's own
            detail += f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})"
        if isinstance(error, ModuleNotFoundError) and Path(f"{module_or_path}.py").is_file():
            detail += f"; to import the file, give its path: --plugin {module_or_path}.py"
        raise PluginLoadError(f"--plugin {module_or_path}: could not import it: {detail}", detail) from error


class UnnamedPluginError(ValueError):
    """A journal or run folder needs a plugin the command line did not name (bad input, exit 2)."""


def plugin_key(plugin: str) -> str:
    """A plugin as compared across command lines: a file by its resolved path, a module by its name."""
    path = Path(plugin)
    return str(path.resolve()) if path.suffix == ".py" or path.exists() else plugin


def require_plugins(needed: list[str], given: list[str], where: str) -> None:
    """Refuse (UnnamedPluginError) unless every plugin in ``needed`` (named by a journal or a run's meta.json) was
    given with --plugin on this command line: a file handed to the harness never chooses code to import."""
    keys = {plugin_key(p) for p in given}
    if missing := [p for p in dict.fromkeys(needed) if plugin_key(p) not in keys]:
        flags = " ".join(f"--plugin {p}" for p in missing)
        raise UnnamedPluginError(
            f"{where} names plugin(s) {', '.join(missing)}; plugins are imported only when named on the command "
            f"line: check the file(s) and pass {flags}"
        )
