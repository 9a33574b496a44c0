"""Paged-attention harness: case files -> inputs -> backends -> graded, timed pandas reports.

Plug in a kernel with :func:`register_backend` in a module named by ``--plugin``.
"""

from __future__ import annotations


def register_backend(name, fn, devices=("cpu", "cuda"), **options) -> None:
    """Register ``fn`` (the kernel contract) as backend ``name``; see harness.backends.register_backend.

    Imported lazily so that ``import harness`` does not import Triton before the CLI or
    pytest has chosen between the compiler and the interpreter.
    """
    from .backends import register_backend as _register

    _register(name, fn, tuple(devices), **options)


__all__ = ["register_backend"]
