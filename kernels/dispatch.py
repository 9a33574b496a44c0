"""Which backend serves a paged-attention read: the Triton kernel on a CUDA device when Triton imports, tlsim
everywhere else. ``PAGED_ATTENTION_BACKEND`` or the ``backend`` argument forces one of ``triton``, ``tlsim`` or
``reference``; forcing one that cannot run here is an error, never a silent fallback.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import sys
import warnings
from collections.abc import Callable

import torch

from .reference import paged_attention_reference
from .tlsim import paged_attention_tlsim

BACKEND_ENV = "PAGED_ATTENTION_BACKEND"
DISPATCH_BACKENDS = ("triton", "tlsim", "reference")


class BackendUnavailableError(RuntimeError):
    """A forced backend cannot run on this machine or device."""


@functools.cache
def has_triton() -> bool:
    """True when Triton is installed; found without importing it (see use_interpreter_if_no_gpu)."""
    return importlib.util.find_spec("triton") is not None


def use_interpreter_if_no_gpu() -> bool:
    """Set TRITON_INTERPRET=1 when no CUDA device is present and the variable is unset; whether the interpreter
    is (to be) on. Triton reads it at its first import, so call this before (a warning says when it is too late).
    """
    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        if "triton" in sys.modules:
            warnings.warn("Triton was imported before use_interpreter_if_no_gpu(): it stays compiled", stacklevel=2)
        os.environ["TRITON_INTERPRET"] = "1"
    return os.environ.get("TRITON_INTERPRET") == "1"


def triton_unavailable_reason(device: torch.device | str) -> str | None:
    """Why the Triton kernel cannot run on ``device``, or None when it can (on a CPU only under Triton's
    interpreter, TRITON_INTERPRET=1: minutes for what a GPU does in microseconds)."""
    device_type = _device_type(device)
    if not has_triton():
        return "Triton is not installed (pip install triton, or a CUDA build of torch)"
    if device_type == "cuda" or (device_type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"):
        return None
    return f"the Triton kernel needs a CUDA device (or TRITON_INTERPRET=1 on the CPU), got {device_type}"


def _unforced(cuda: bool) -> str:
    return "triton" if cuda and has_triton() else "tlsim"


def _device_type(device: torch.device | str) -> str:
    """``torch.device(device).type``, without building a second device from a device."""
    return device.type if type(device) is torch.device else torch.device(device).type


def select_backend(device: torch.device | str, backend: str | None = None) -> str:
    """Name of the backend that serves a read on ``device``, by the module docstring's rule (``backend`` before
    $PAGED_ATTENTION_BACKEND). Raises ValueError for an unknown name and BackendUnavailableError when the forced
    backend cannot run on ``device``."""
    forced = backend or os.environ.get(BACKEND_ENV) or None
    if forced is None:
        return _unforced(_device_type(device) == "cuda")
    if forced not in DISPATCH_BACKENDS:
        source = "backend argument" if backend else f"${BACKEND_ENV}"
        raise ValueError(f"{source} is {forced!r}; expected one of {', '.join(DISPATCH_BACKENDS)}")
    if forced == "triton" and (reason := triton_unavailable_reason(device)):
        raise BackendUnavailableError(f"backend 'triton' was forced but cannot run: {reason}")
    return forced


_TORCH_BACKENDS = {"tlsim": paged_attention_tlsim, "reference": paged_attention_reference}
_triton_module = None  # kernels.triton_paged once imported (it imports Triton: not at module load)


def _backend_fn(name: str) -> Callable[..., torch.Tensor]:
    global _triton_module
    if name != "triton":
        return _TORCH_BACKENDS[name]
    if _triton_module is None:
        from . import triton_paged

        _triton_module = triton_paged
    return _triton_module.paged_attention_triton  # read at call time, as an import statement would


def paged_attention_dispatch(*args, backend: str | None = None, **kwargs):
    """Paged attention through the backend :func:`select_backend` picks for q's device (``backend`` forces one);
    every other argument goes to it unchanged. Selecting reads no tensor value, so a dispatched Triton call is as
    sync-free as a direct one."""
    q = args[0] if args else kwargs["q"]
    if backend or os.environ.get(BACKEND_ENV):
        name = select_backend(q.device, backend)
    else:  # select_backend's unforced rule, on q.is_cuda (q.device builds a device object)
        name = _unforced(q.is_cuda)
    return _backend_fn(name)(*args, **kwargs)


# The contract's signature (kernels.contract.contract_entry), plus ``backend``, for inspect and help().
_contract = inspect.signature(paged_attention_reference)
_backend = inspect.Parameter("backend", inspect.Parameter.KEYWORD_ONLY, default=None, annotation="str | None")
paged_attention_dispatch.__signature__ = _contract.replace(parameters=[*_contract.parameters.values(), _backend])
