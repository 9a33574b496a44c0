"""Paged-attention harness: case files -> inputs -> backends -> graded, timed pandas reports.

Plug in a kernel with :func:`register_backend` in a module named by ``--plugin``.
``register_backend`` is :func:`harness.backends.builtin.register_backend` itself, looked up on
first use: importing ``harness`` imports neither the kernels nor Triton, so the CLI and
pytest can still choose between Triton's compiler and its interpreter.
"""

from __future__ import annotations

__all__ = ["register_backend"]


def __getattr__(name: str):
    if name == "register_backend":
        from harness.backends.builtin import register_backend

        return register_backend
    raise AttributeError(f"module 'harness' has no attribute {name!r}")
