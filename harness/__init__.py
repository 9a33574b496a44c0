"""Paged-attention harness: case files -> inputs -> backends -> graded, timed pandas reports.

:func:`register_backend` is looked up on first use: importing ``harness`` imports neither the kernels nor Triton."""

__all__ = ["register_backend"]


def __getattr__(name: str):
    if name == "register_backend":
        from harness.backends.builtin import register_backend

        return register_backend
    raise AttributeError(f"module 'harness' has no attribute {name!r}")
