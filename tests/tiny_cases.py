"""The small case most harness tests run, written once, and a writer of case files around it.

``TINY`` is a two-sequence GQA decode-and-prefill mix (4 query heads over 2 KV heads,
head_dim 32, block_size 4, KV lengths 3 and 9 with 1 and 2 queries) that every built-in
backend grades in well under a second on a CPU. A test says only what its cases change:

    write_cases(path, {"name": "first"}, {"name": "second", "seed": 1})
    write_cases(path, {"name": "big", "head_dim": 128, "input_scale": 6.0})

A run in the test's own process that loads a plugin goes in ``with plugin_run_scope(folder):``.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest


@contextlib.contextmanager
def plugin_run_scope(folder: Path):
    """Inside: HARNESS_TEST_DIR (which workers inherit) is ``folder``; after, even on an error, the variable and the
    backend registry are as they were (a plugin loaded in this process registers its backends)."""
    from harness.backends.registry import REGISTRY

    saved = dict(REGISTRY)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HARNESS_TEST_DIR", str(folder))
        try:
            yield
        finally:
            REGISTRY.clear()
            REGISTRY.update(saved)


TINY: dict[str, Any] = {
    "num_q_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 32,
    "block_size": 4,
    "seq_lens": [3, 9],
    "q_lens": [1, 2],
}


def toml_value(value: Any) -> str:
    """One TOML value: booleans, numbers, strings, lists and (inline) tables."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string of printable text is a TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{key} = {toml_value(v)}" for key, v in value.items()) + " }"
    raise TypeError(f"no TOML for {type(value).__name__}")


def case_file_text(*cases: dict[str, Any], defaults: dict[str, Any] = TINY) -> str:
    """A case file: ``defaults`` as its ``[defaults]`` table, then one ``[[case]]`` per dict, in order."""
    tables = [("[defaults]", defaults)] * bool(defaults) + [("[[case]]", case) for case in cases]
    return "\n".join(
        "\n".join([header, *(f"{key} = {toml_value(value)}" for key, value in fields.items())]) + "\n"
        for header, fields in tables
    )


def write_cases(path: Path, *cases: dict[str, Any], defaults: dict[str, Any] = TINY) -> Path:
    """Write :func:`case_file_text` to ``path``; returns ``path``."""
    path.write_text(case_file_text(*cases, defaults=defaults))
    return path
