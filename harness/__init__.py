"""Paged-attention harness: case files -> inputs -> backends -> graded, timed pandas reports.

Plug in a kernel with :func:`register_backend` in a module named by ``--plugin``; it is looked up on
first use, so importing ``harness`` imports neither the kernels nor Triton.
"""

from __future__ import annotations

__all__ = ["register_backend"]


def __getattr__(name: str):
    if name == "register_backend":
        from harness.backends.builtin import register_backend

        return register_backend
    raise AttributeError(f"module 'harness' has no attribute {name!r}")
