"""nox -s bench's comparison of saved pytest-benchmark runs: a rerun passes, a planted slowdown fails."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import saved


def _run(path, seed: int, slow: dict[str, float] | None = None, samples: bool = True, case_file=None, **doc):
    """A saved run of 8 cases x 2 backends; ``case_file`` in each benchmark's extra_info, ``doc`` at the top."""
    rng = np.random.default_rng(seed)
    benchmarks = []
    for i in range(8):
        for backend in ("reference", "tlsim"):
            median = (200 + 50 * i) * (slow or {}).get(backend, 1.0)
            data = sorted(median * np.exp(rng.normal(0, 0.05, 15)))
            quart = np.quantile(data, [0.25, 0.5, 0.75]) * 1e-6
            benchmarks.append({
                "fullname": f"benchmarks/test_bench_backends.py::test_bench[case{i}-{backend}]",
                "stats": {"median": quart[1], "q1": quart[0], "q3": quart[2]},
                "extra_info": {"device": "cpu", **({"samples_us": [float(x) for x in data]} if samples else {}),
                               **({"case_file": case_file} if case_file else {})},
            })  # fmt: skip
    path.write_text(json.dumps({"benchmarks": benchmarks, **doc}))
    return path


def test_a_rerun_passes_and_a_planted_slowdown_fails_with_a_readable_summary(tmp_path):
    base = _run(tmp_path / "base.json", 1)
    passed, summary = saved.compare_files(base, _run(tmp_path / "rerun.json", 2))
    assert passed, summary
    passed, summary = saved.compare_files(base, _run(tmp_path / "slow.json", 3, slow={"tlsim": 1.25}))
    assert not passed
    assert summary.count("SLOWER") == 8 and "test_bench[case0-tlsim]" in summary
    assert summary.splitlines()[-1] == "bench: FAIL: 8 benchmark(s) slower"
    assert "Traceback" not in summary


def test_runs_without_samples_fall_back_to_quartiles_marked_weak(tmp_path):
    base = _run(tmp_path / "base.json", 1, samples=False)
    passed, summary = saved.compare_files(base, _run(tmp_path / "slow.json", 3, slow={"tlsim": 1.5}, samples=False))
    assert not passed and "(weak evidence)" in summary


def test_saved_runs_are_numbered_and_the_newest_is_the_default_baseline(tmp_path, capsys):
    storage = tmp_path / ".benchmarks"
    assert saved.main(["compare", str(_run(tmp_path / "a.json", 1)), "--storage", str(storage)]) == 0
    assert "nothing to compare with" in capsys.readouterr().out
    first = saved.save(_run(tmp_path / "a.json", 1), storage)
    second = saved.save(_run(tmp_path / "b.json", 2), storage)
    assert first.name.startswith("0001_") and second.name.startswith("0002_")
    assert saved.find_baseline(None, storage) == second and saved.find_baseline("0001", storage) == first
    with pytest.raises(SystemExit, match="no saved run matches '0009'"):
        saved.find_baseline("0009", storage)
    slow = _run(tmp_path / "c.json", 3, slow={"reference": 1.3})
    assert saved.main(["compare", str(slow), "--storage", str(storage)]) == 1
    assert saved.main(["compare", str(slow), "--storage", str(storage), "--min-effect", "0.5"]) == 0


@pytest.mark.parametrize(("commit_info", "why"), [
    ({"id": "fetched"}, "the baseline's commit_info: field 'commit': {fetched} is not in your history"),
    ({"id": "head", "dirty": True}, "the baseline was made from a tree with uncommitted changes"),
])  # fmt: skip
def test_a_baselines_commit_is_re_timed_only_from_your_own_clean_history(
    tmp_path, git_history, monkeypatch, commit_info, why
):
    """A saved baseline is data: --confirm checks out its commit only when it is in your history and clean."""
    ids = git_history
    monkeypatch.setattr(saved, "ROOT", tmp_path / "repo")
    base = _run(tmp_path / "base.json", 1, commit_info={**commit_info, "id": ids[commit_info["id"]]})
    new = _run(tmp_path / "slow.json", 3, slow={"tlsim": 1.25}, case_file=str(tmp_path / "cases.toml"))
    passed, summary = saved.compare_files(base, new, confirm="all")
    assert not passed and f"confirm: skipped: {why.format(**ids)}" in summary
