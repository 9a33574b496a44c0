"""Where a process's host wall time goes, by named phase (meta.json's ``scale.phase_s``)."""

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

_SPENT: defaultdict[str, float] = defaultdict(float)


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Add the block's wall seconds to phase ``name`` (also when it raises)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        _SPENT[name] += time.perf_counter() - started


def take_phases() -> dict[str, float]:
    """Seconds per phase since the last call, unrounded (sums of many small cases stay exact); then zero."""
    spent = dict(_SPENT)
    _SPENT.clear()
    return spent


def absorb(spent: dict[str, float]) -> None:
    """Count another process's phases (an isolated backend's worker) as this process's own."""
    for name, seconds in spent.items():
        _SPENT[name] += seconds


def add_phases(total: dict[str, float], more: dict[str, float]) -> dict[str, float]:
    return {**total, **{name: total.get(name, 0.0) + seconds for name, seconds in more.items()}}


def rounded(spent: dict[str, float]) -> dict[str, float]:
    return {name: round(seconds, 3) for name, seconds in spent.items()}
