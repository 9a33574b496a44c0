"""The benchmark suite takes the harness's options: --cases, --backend, --device, --plugin, --tag.

Triton chooses compiler or interpreter when first imported: on a machine without a GPU the
interpreter is switched on here, before anything imports it.
"""

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest_plugins = ["harness.pytest_plugin"]
