"""The benchmark suite takes the harness's options: --cases, --backend, --device, --plugin, --tag."""

from kernels import use_interpreter_if_no_gpu

use_interpreter_if_no_gpu()  # before anything imports Triton, which picks compiler or interpreter then

pytest_plugins = ["harness.pytest_plugin"]
