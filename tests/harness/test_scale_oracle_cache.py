"""The float64 oracle cache: a second build of the same inputs never recomputes; anything else does."""

from __future__ import annotations

import os

import pytest
import torch

from harness.cases.loading import load_cases
from harness.run import oracle_cache, runner
from tests.tiny_cases import write_cases


@pytest.fixture
def cache_folder(tmp_path, monkeypatch):
    folder = tmp_path / "oracle"
    monkeypatch.setenv(oracle_cache.ENV_DIR, str(folder))
    monkeypatch.delenv(oracle_cache.ENV_MAX_BYTES, raising=False)
    return folder


def _case(tmp_path, **changes):
    """The tiny case (seed 3), with ``changes``, loaded."""
    path = write_cases(tmp_path / "cases.toml", {"name": "tiny", "seed": 3, **changes})
    return load_cases([path], "cpu")[0]


def _oracle_must_not_run(*args, **kwargs):
    raise AssertionError("the oracle ran although its output was cached")


@pytest.mark.parametrize("second", [{}, {"name": "renamed"}], ids=["same_case", "renamed_case"])
def test_a_second_build_of_the_same_inputs_reads_the_cache_instead_of_the_oracle(
    tmp_path, cache_folder, monkeypatch, second
):
    first = runner.build_context(_case(tmp_path), "cpu", "cpu")
    assert len(list(cache_folder.glob("*.oracle"))) == 1
    monkeypatch.setattr(runner, "paged_attention_oracle", _oracle_must_not_run)
    again = runner.build_context(_case(tmp_path, **second), "cpu", "cpu")
    assert torch.equal(first.expected, again.expected)
    assert again.expected.dtype == torch.float64


def test_second_build_context_reads_the_error_bound_from_the_cache_too(tmp_path, cache_folder, monkeypatch):
    case = _case(tmp_path)
    first = runner.build_context(case, "cpu", "cpu")
    assert len(list(cache_folder.glob("*.derived"))) == 1
    monkeypatch.setattr(runner, "forward_error_bound", _oracle_must_not_run)
    second = runner.build_context(case, "cpu", "cpu")
    assert torch.equal(first.bound, second.bound) and second.bound.dtype == torch.float64
    monkeypatch.setattr(runner, "BOUND_RESULT", "forward_error_bound:an edited grading.py")
    with pytest.raises(AssertionError, match="oracle ran"):
        runner.build_context(case, "cpu", "cpu")


def test_changed_seed_misses_the_cache(tmp_path, cache_folder, monkeypatch):
    runner.build_context(_case(tmp_path), "cpu", "cpu")
    calls = []
    original = runner.paged_attention_oracle

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(runner, "paged_attention_oracle", counting)
    runner.build_context(_case(tmp_path, seed=4), "cpu", "cpu")
    assert calls == [1]
    assert len(list(cache_folder.glob("*.oracle"))) == 2


@pytest.mark.parametrize(
    "damage",
    [lambda blob: blob[:-100] + bytes([blob[-100] ^ 0xFF]) + blob[-99:], lambda blob: blob[:50]],
    ids=["one_flipped_byte", "truncated"],
)
def test_a_damaged_cache_file_is_a_miss_rewritten_whole_not_an_error(tmp_path, cache_folder, monkeypatch, damage):
    case = _case(tmp_path)
    good = runner.build_context(case, "cpu", "cpu").expected
    (entry,) = cache_folder.glob("*.oracle")
    damaged = damage(entry.read_bytes())
    entry.write_bytes(damaged)
    assert torch.equal(runner.build_context(case, "cpu", "cpu").expected, good)
    assert entry.read_bytes() != damaged
    monkeypatch.setattr(runner, "paged_attention_oracle", _oracle_must_not_run)
    assert torch.equal(runner.build_context(case, "cpu", "cpu").expected, good)


def test_cap_prunes_the_least_recently_used_entries_first(tmp_path):
    cache = oracle_cache.OracleCache(tmp_path, limit_bytes=10_000)
    tensor = torch.zeros(200, dtype=torch.float64)  # about 2.7 kB a file with torch.save's framing
    for i, key in enumerate(["a", "b", "c"]):
        cache.put(key, tensor)
        os.utime(cache.path(key), (1000 + i, 1000 + i))  # a oldest, c newest
    assert cache.get("a", "cpu") is not None  # a hit: a becomes the most recently used
    cache.put("d", tensor)  # 4 x ~2.7 kB > 10 kB: prune to 9 kB
    left = {path.stem for _, _, path in cache.entries()}
    assert "b" not in left
    assert {"a", "d"} <= left
    assert sum(size for _, size, _ in cache.entries()) <= 10_000


def test_cache_off_computes_every_time(tmp_path, monkeypatch):
    monkeypatch.setenv(oracle_cache.ENV_DIR, "off")
    calls = []
    result = oracle_cache.cached_oracle([torch.zeros(1, 1, 1)], "cpu", lambda: calls.append(1) or torch.ones(1))
    oracle_cache.cached_oracle([torch.zeros(1, 1, 1)], "cpu", lambda: calls.append(1) or torch.ones(1))
    assert calls == [1, 1] and torch.equal(result, torch.ones(1))


def test_key_covers_every_input_tensor_and_the_oracle_device():
    args = [torch.zeros(2, 4, 8), torch.zeros(3, 4, 2, 8), torch.zeros(3, 4, 2, 8),
            torch.zeros(1, 3, dtype=torch.int32), torch.ones(1, dtype=torch.int32), torch.tensor([0, 2], dtype=torch.int32)]  # fmt: skip
    base = oracle_cache.cache_key(args, "cpu")
    for i in range(len(args)):
        changed = list(args)
        changed[i] = args[i].clone().reshape(-1)
        changed[i][0] += 1
        changed[i] = changed[i].reshape(args[i].shape)
        assert oracle_cache.cache_key(changed, "cpu") != base, oracle_cache.ARG_NAMES[i]
    assert oracle_cache.cache_key(args, "cuda") != base
    assert oracle_cache.cache_key(args, "cpu", scale=0.5) != base


def test_gpu_oracle_is_not_cached_hashing_would_cost_more_than_it(tmp_path, cache_folder):
    calls = []
    for _ in range(2):
        oracle_cache.cached_oracle([torch.zeros(1, 1, 1)], "cuda", lambda: calls.append(1) or torch.ones(1))
    assert calls == [1, 1] and not cache_folder.exists()
