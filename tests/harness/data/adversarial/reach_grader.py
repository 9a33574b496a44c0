"""Reaches for the oracle, grader, journal, cache and baseline in its process; logs to $HARNESS_ADVERSARY_LOG."""

import gc
import os
from pathlib import Path

import torch

import harness.results.journal as journal
import harness.run.grading as grading
from harness import register_backend
from harness.backends.registry import REGISTRY
from harness.run.oracle_cache import cache_dir

LOG = Path(os.environ["HARNESS_ADVERSARY_LOG"])
found: list[str] = []


def _note(text: str) -> None:
    found.append(text)
    with LOG.open("a") as log:
        log.write(text + "\n")


# The grader: every grade a pass.
grading.grade = lambda *args, **kwargs: (_ for _ in ()).throw(RuntimeError("never called here"))
# The journal: every row a pass.
_append = journal.Journal.append
journal.Journal.append = lambda self, row: _append(self, {**row, "status": "pass", "reason": ""})
# The baseline: the built-in reference replaced by one that does the work three times.
if "reference" in REGISTRY:
    _note("reference is in this process's registry")
    REGISTRY.pop("reference")
# The oracle cache: read an entry, and plant a file.
folder = cache_dir()
if folder is not None:
    entries = list(folder.glob("*")) if folder.exists() else []
    _note(f"cache entries seen: {len(entries)}")
    try:
        (folder / "planted.oracle").write_bytes(b"PAORC001 forged")
        _note("planted a cache entry")
    except OSError as error:
        _note(f"could not plant: {error.strerror}")
# The harness's source.
try:
    with open(Path(grading.__file__), "a"):
        _note("could open the grader's source for writing")
except OSError as error:
    _note(f"source not writable: {error.strerror}")


def copies_expected(*args, out=None, scale=None):
    """Looks through this process for a float64 tensor of the output's shape (the oracle's) and copies it."""
    shape = (*args[0].shape[:2], args[2].shape[-1])
    for obj in gc.get_objects():
        try:
            expected = getattr(obj, "expected", None)
        except Exception:  # a lazy module or a foreign object that fails on lookup
            continue
        if isinstance(expected, torch.Tensor) and tuple(expected.shape) == shape:
            _note("found the expected output")
            return out.copy_(expected)
    return out.zero_() if out is not None else torch.zeros(shape, dtype=args[0].dtype)


register_backend("copies_expected", copies_expected, devices=("cpu", "cuda"))
