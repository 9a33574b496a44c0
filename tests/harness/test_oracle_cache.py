"""The oracle cache: the same inputs hit, anything else misses; a damaged or untrusted entry is never used blindly."""

from __future__ import annotations

import hashlib
import io
import json
import os

import pandas as pd
import pytest
import torch

from harness.cases.loading import load_cases
from harness.cli.main import main
from harness.run import oracle_cache, runner
from tests.tiny_cases import write_cases


@pytest.fixture
def cache_folder(tmp_path, monkeypatch):
    """The test's own cache folder (not made yet): no size cap, no verify fraction, no warning given yet."""
    folder = tmp_path / "private" / "oracle"
    monkeypatch.setenv(oracle_cache.ENV_DIR, str(folder))
    monkeypatch.delenv(oracle_cache.ENV_MAX_BYTES, raising=False)
    monkeypatch.delenv(oracle_cache.ENV_VERIFY, raising=False)
    oracle_cache._warned.clear()
    return folder


def _built(tmp_path, **changes):
    """The tiny case (seed 3), with ``changes``, built on the CPU: its inputs, oracle output and error bound."""
    path = write_cases(tmp_path / "cases.toml", {"name": "tiny", "seed": 3, **changes})
    return runner.build_context(load_cases([path], "cpu")[0], "cpu", "cpu")


def _oracle_must_not_run(*args, **kwargs):
    raise AssertionError("the oracle ran although its output was cached")


def _run(tmp_path, out: str, *extra: str) -> int:
    """An untimed ``harness run`` of the tiny case through reference into ``tmp_path / out``."""
    cases = write_cases(tmp_path / "tiny.toml", {"name": "tiny"})
    return main(["run", str(cases), "--out", str(tmp_path / out), "--backend", "reference", "--no-progress",
                 "--no-timing", *extra])  # fmt: skip


def _cached(run) -> list:
    return pd.read_parquet(run / "results.parquet")["oracle_cached"].tolist()


def _poison(entry) -> None:
    """Rewrite a cache entry with zeros under a valid header (magic and the payload's sha256)."""
    blob = entry.read_bytes()
    tensor = torch.load(io.BytesIO(blob[len(oracle_cache.MAGIC) + 32 :]), weights_only=True)
    buffer = io.BytesIO()
    torch.save(torch.zeros_like(tensor), buffer)
    payload = buffer.getvalue()
    entry.write_bytes(oracle_cache.MAGIC + hashlib.sha256(payload).digest() + payload)


# --- builds: hits, misses and damaged entries ------------------------------------------------------


@pytest.mark.parametrize("second", [{}, {"name": "renamed"}], ids=["same_case", "renamed_case"])
def test_the_same_inputs_built_again_read_oracle_and_bound_from_the_cache(tmp_path, cache_folder, monkeypatch, second):
    first = _built(tmp_path)
    assert len(list(cache_folder.glob("*.oracle"))) == len(list(cache_folder.glob("*.derived"))) == 1
    monkeypatch.setattr(runner, "paged_attention_oracle", _oracle_must_not_run)
    monkeypatch.setattr(runner, "forward_error_bound", _oracle_must_not_run)
    again = _built(tmp_path, **second)
    assert torch.equal(first.expected, again.expected) and torch.equal(first.bound, again.bound)
    assert again.expected.dtype == again.bound.dtype == torch.float64
    monkeypatch.setattr(runner, "BOUND_RESULT", "forward_error_bound:an edited grading.py")
    with pytest.raises(AssertionError, match="oracle ran"):  # the bound of another grading.py is computed anew
        _built(tmp_path)


@pytest.mark.parametrize(
    "damage",
    [lambda blob: blob[:-100] + bytes([blob[-100] ^ 0xFF]) + blob[-99:], lambda blob: blob[:50]],
    ids=["one_flipped_byte", "truncated"],
)
def test_a_damaged_cache_file_is_a_miss_rewritten_whole_not_an_error(tmp_path, cache_folder, monkeypatch, damage):
    good = _built(tmp_path).expected
    (entry,) = cache_folder.glob("*.oracle")
    damaged = damage(entry.read_bytes())
    entry.write_bytes(damaged)
    assert torch.equal(_built(tmp_path).expected, good)
    assert entry.read_bytes() != damaged
    monkeypatch.setattr(runner, "paged_attention_oracle", _oracle_must_not_run)
    assert torch.equal(_built(tmp_path).expected, good)


def test_cap_prunes_the_least_recently_used_entries_first(tmp_path):
    cache = oracle_cache.OracleCache(tmp_path, limit_bytes=10_000)
    tensor = torch.zeros(200, dtype=torch.float64)  # about 2.7 kB a file with torch.save's framing
    for i, key in enumerate(["a", "b", "c"]):
        cache.put(key, tensor)
        os.utime(cache.path(key), (1000 + i, 1000 + i))  # a oldest, c newest
    assert cache.get("a", "cpu") is not None  # a hit: a becomes the most recently used
    cache.put("d", tensor)  # 4 x ~2.7 kB > 10 kB: prune to 9 kB
    left = {path.stem for _, _, path in cache.entries()}
    assert "b" not in left and {"a", "d"} <= left
    assert sum(size for _, size, _ in cache.entries()) <= 10_000


@pytest.mark.parametrize(
    ("folder", "device"), [("off", "cpu"), (None, "cuda")], ids=["cache_off", "gpu_oracle_hashing_would_cost_more"]
)
def test_an_oracle_off_the_cache_is_computed_every_time_and_nothing_written(cache_folder, monkeypatch, folder, device):
    if folder is not None:
        monkeypatch.setenv(oracle_cache.ENV_DIR, folder)
    calls, args = [], [torch.zeros(1, 1, 1)]
    for _ in range(2):
        key = oracle_cache.oracle_key(args, device)
        result, cached = oracle_cache.lookup(key, "out", device, (1,), lambda: calls.append(1) or torch.ones(1))
    assert calls == [1, 1] and torch.equal(result, torch.ones(1)) and not cached and not cache_folder.exists()


def test_key_covers_every_input_tensor_the_oracle_device_and_the_attention_variants():
    args = [torch.zeros(2, 4, 8), torch.zeros(3, 4, 2, 8), torch.zeros(3, 4, 2, 8),
            torch.zeros(1, 3, dtype=torch.int32), torch.ones(1, dtype=torch.int32), torch.tensor([0, 2], dtype=torch.int32)]  # fmt: skip
    base = oracle_cache.cache_key(args, "cpu")
    for i in range(len(args)):
        changed = list(args)
        changed[i] = args[i].clone()
        changed[i].view(-1)[0] += 1
        assert oracle_cache.cache_key(changed, "cpu") != base, oracle_cache.ARG_NAMES[i]
    assert oracle_cache.cache_key(args, "cuda") != base
    window = oracle_cache.cache_key(args, "cpu", options={"sliding_window": 2})
    assert window != base and window != oracle_cache.cache_key(args, "cpu", options={"sliding_window": 3})
    sinks = oracle_cache.cache_key(args, "cpu", options={"sinks": torch.tensor([0.5, 1.0])})
    assert sinks != oracle_cache.cache_key(args, "cpu", options={"sinks": torch.tensor([0.5, 2.0])})


# --- runs: verify, off, and entries that are not trusted -------------------------------------------


def test_verify_passes_sound_entries_catches_poisoned_ones_used_without_it(tmp_path, cache_folder, capsys, monkeypatch):
    assert _run(tmp_path, "first") == 0
    assert cache_folder.stat().st_mode & 0o777 == 0o700
    assert _cached(tmp_path / "first") == [False]
    assert json.loads((tmp_path / "first" / "meta.json").read_text())["oracle_cache"] == {
        "mode": "on", "folder": str(cache_folder)}  # fmt: skip
    monkeypatch.setenv(oracle_cache.ENV_VERIFY, "")  # restored after the flag sets it
    assert _run(tmp_path, "sound", "--verify-oracle-cache", "1") == 0
    assert _cached(tmp_path / "sound") == [False]  # recomputed, so not from the cache
    meta = json.loads((tmp_path / "sound" / "meta.json").read_text())
    assert meta["oracle_cache"] == {"mode": "verify", "folder": str(cache_folder), "verify_fraction": 1.0}
    monkeypatch.setenv(oracle_cache.ENV_VERIFY, "")  # verify off again
    (entry,) = cache_folder.glob("*.oracle")
    _poison(entry)
    # Trusted blindly, the zeros fail the kernel; the row says its oracle came from the cache.
    assert _run(tmp_path, "trusting") == 1
    assert _cached(tmp_path / "trusting") == [True]
    capsys.readouterr()
    assert _run(tmp_path, "verified", "--verify-oracle-cache") == 2
    err = capsys.readouterr().err
    assert f"oracle cache entry {entry} (out) differs from the oracle recomputed" in err
    assert "Traceback" not in err and not entry.exists()
    assert not (tmp_path / "verified").exists()


def test_no_oracle_cache_neither_reads_nor_writes(tmp_path, cache_folder):
    assert _run(tmp_path, "first", "--no-oracle-cache") == 0
    assert not cache_folder.exists()
    assert _cached(tmp_path / "first") == [False]
    assert json.loads((tmp_path / "first" / "meta.json").read_text())["oracle_cache"]["mode"] == "off"


def test_a_group_or_world_writable_cache_folder_is_not_used(tmp_path, cache_folder, capsys):
    assert _run(tmp_path, "first") == 0
    cache_folder.chmod(0o777)
    (entry,) = cache_folder.glob("*.oracle")
    _poison(entry)  # anyone could have written it: it must not be read
    assert _run(tmp_path, "second") == 0
    assert _cached(tmp_path / "second") == [False]
    assert f"warning: oracle cache {cache_folder} may be written by group or others (mode 777): not used" in (
        capsys.readouterr().err
    )


def test_a_symlinked_entry_is_not_read(tmp_path, cache_folder):
    key = "ab" * 32
    store = oracle_cache.OracleCache(cache_folder)
    elsewhere = tmp_path / "elsewhere"
    oracle_cache.OracleCache(elsewhere).put(key, torch.zeros(2, dtype=torch.float64))
    cache_folder.mkdir(parents=True)
    store.path(key).symlink_to(elsewhere / f"{key}.oracle")
    assert store.get(key, "cpu") is None
