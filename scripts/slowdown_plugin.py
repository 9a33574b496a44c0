"""A plugin backend for the noise check: ``reference`` with a planted, sleep-based slowdown.

``reference_slowable`` calls the built-in reference kernel, then sleeps
``HARNESS_SLOWDOWN`` (e.g. 0.25) times the call's own measured time, so the call takes at
least 25% longer (sleep overshoots by tens of microseconds, never undershoots). With
``HARNESS_SLOWDOWN`` unset or 0 it is the reference kernel plus one clock read.

    python -m harness run cases/cpu.toml --plugin scripts/slowdown_plugin.py
"""

from __future__ import annotations

import os
import time

import kernels
from harness import register_backend

SLOWDOWN = float(os.environ.get("HARNESS_SLOWDOWN", "0") or 0)


def reference_slowable(q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, scale=None, out=None):
    start = time.perf_counter()
    result = kernels.paged_attention_reference(
        q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, out=out
    )
    if SLOWDOWN > 0:
        time.sleep(SLOWDOWN * (time.perf_counter() - start))
    return result


register_backend("reference_slowable", reference_slowable, devices=("cpu", "cuda"))
