"""A plugin backend for the noise check: ``reference`` with a planted slowdown.

``reference_slowable`` calls the built-in reference kernel, then waits ``HARNESS_SLOWDOWN``
(e.g. 0.25) times the call's own measured time, so the call takes 25% longer. The wait
spins on ``time.perf_counter`` by default (``HARNESS_SLOWDOWN_MODE=spin``): on a loaded
machine ``time.sleep`` wakes up late (a 0.25x sleep made calls 2-3x slower here, an easy
target); ``HARNESS_SLOWDOWN_MODE=sleep`` sleeps instead. With ``HARNESS_SLOWDOWN`` unset
or 0 it is the reference kernel plus one clock read.

    HARNESS_SLOWDOWN=0.25 python -m harness run cases/cpu.toml --plugin scripts/slowdown_plugin.py
"""

from __future__ import annotations

import os
import time

import kernels
from harness import register_backend

PLANTED = 0.0  # edit to plant a slowdown in the code itself (what a commit would do); the env var wins
SLOWDOWN = float(os.environ.get("HARNESS_SLOWDOWN", PLANTED) or 0)
MODE = os.environ.get("HARNESS_SLOWDOWN_MODE", "spin")


def reference_slowable(q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, scale=None, out=None):
    start = time.perf_counter()
    result = kernels.paged_attention_reference(
        q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, out=out
    )
    if SLOWDOWN > 0:
        elapsed = time.perf_counter() - start
        if MODE == "sleep":
            time.sleep(SLOWDOWN * elapsed)
        else:
            until = start + (1 + SLOWDOWN) * elapsed
            while time.perf_counter() < until:
                pass
    return result


register_backend("reference_slowable", reference_slowable, devices=("cpu", "cuda"))
