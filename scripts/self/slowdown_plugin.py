"""A plugin for the noise check: two built-in backends with a planted slowdown.

``reference_slowable``: the reference kernel, then a host busy-wait of ``HARNESS_SLOWDOWN`` times its time;
``triton_slowable``: the Triton kernel, then a device spin of that share (the host wait on a CPU with
``HARNESS_TRITON_SLOWABLE_CPU=1``). ``HARNESS_SLOWED`` names the backends slowed (default ``reference_slowable``).

    HARNESS_SLOWDOWN=0.25 python -m harness run cases/cpu.toml --plugin scripts/self/slowdown_plugin.py"""

from __future__ import annotations

import dataclasses
import functools
import os
import time

import torch

import kernels
from harness import register_backend
from harness.backends.registry import REGISTRY, add_backend

PLANTED = 0.0  # edit to plant a slowdown in the code itself (what a commit would do); the env var wins
SLOWDOWN = float(os.environ.get("HARNESS_SLOWDOWN", PLANTED) or 0)
SLOWED = set(os.environ.get("HARNESS_SLOWED", "reference_slowable").split(","))


def reference_slowable(q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, scale=None, out=None):
    args = (q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale)
    call = functools.partial(kernels.paged_attention_reference, *args, out=out)
    return _host_slowed(call)() if SLOWDOWN > 0 and "reference_slowable" in SLOWED else call()


def _device_slowed(fn, device: torch.device):
    """``fn`` followed by a spin kernel of SLOWDOWN x fn's device time (graph replay, L2 flushed)."""
    from harness.timing.timer import time_call

    kernel_us = time_call(fn, str(device), target_s=0.05).median_us
    probe = 1_000_000
    spin_us = time_call(lambda: torch.cuda._sleep(probe), str(device), target_s=0.05).median_us
    cycles = max(1, int(SLOWDOWN * kernel_us * probe / spin_us))

    def slowed():
        result = fn()
        torch.cuda._sleep(cycles)
        return result

    return slowed


def _host_slowed(fn):
    """``fn`` followed by a host busy-wait of SLOWDOWN x its time."""

    def slowed():
        start = time.perf_counter()
        result = fn()
        end = start + (1 + SLOWDOWN) * (time.perf_counter() - start)
        while time.perf_counter() < end:
            pass
        return result

    return slowed


def _prepare_triton_slowable(case, inputs, out):
    prepared = REGISTRY["triton"].prepare(case, inputs, out)
    if not (SLOWDOWN > 0 and "triton_slowable" in SLOWED):
        return prepared
    device = inputs.q.device
    slow = (lambda fn: _device_slowed(fn, device)) if device.type == "cuda" else _host_slowed
    return dataclasses.replace(prepared, run=slow(prepared.run), call=slow(prepared.call or prepared.run))


register_backend("reference_slowable", reference_slowable, devices=("cpu", "cuda"))
add_backend(dataclasses.replace(
    REGISTRY["triton"], name="triton_slowable", prepare=_prepare_triton_slowable, kind="plugin",
    devices=("cpu", "cuda") if os.environ.get("HARNESS_TRITON_SLOWABLE_CPU") == "1" else ("cuda",),
    description="the triton backend, plus a device spin of HARNESS_SLOWDOWN x its time (noise check)",
))  # fmt: skip
