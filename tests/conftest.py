"""Shared pytest setup.

Triton decides between compiling and interpreting when it is first imported, so on a
machine without a GPU the interpreter is switched on here, before anything imports it.
"""

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest_plugins = ["harness.pytest_plugin"]
