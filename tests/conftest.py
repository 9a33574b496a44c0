"""Shared pytest setup.

Triton decides between compiling and interpreting when it is first imported, so on a
machine without a GPU the interpreter is switched on here, before anything imports it
(``import kernels`` does not). The kernels' value checks are switched on for the suite
(PAGED_ATTENTION_CHECK=1); tests of the sync-free default path pass ``check=False`` or
unset the variable themselves.
"""

import os

import kernels

kernels.use_interpreter_if_no_gpu()
os.environ.setdefault(kernels.CHECK_ENV, "1")

pytest_plugins = ["harness.pytest_plugin"]
