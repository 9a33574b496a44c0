"""Kernels that try to forge their verdict (tests/harness/data/adversarial/) get none; an honest control passes."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from harness.cli.main import main
from tests.tiny_cases import plugin_run_scope, write_cases

PLUGINS = Path(__file__).parent / "data" / "adversarial"
DEFAULTS = {"num_q_heads": 4, "num_kv_heads": 2, "head_dim": 32, "block_size": 16, "dtype": "float32",
            "layout": "shuffled"}  # fmt: skip
CASES = (
    {"name": "decode", "seq_lens": [40, 17, 33], "q_lens": 1},
    {"name": "prefill", "seq_lens": [24, 9], "q_lens": [5, 3]},
)
pytestmark = pytest.mark.usefixtures("clean_registry")


def run(tmp_path: Path, plugins: list[str], names: list[str], *extra: str) -> tuple[int, pd.DataFrame]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    cases = write_cases(tmp_path / "cases.toml", *CASES, defaults=DEFAULTS)
    out = tmp_path / "run"
    args = ["run", str(cases), "--out", str(out), "--no-progress", "--device", "cpu", *extra]
    args += [arg for plugin in plugins for arg in ("--plugin", str(PLUGINS / plugin))]
    args += [arg for name in names for arg in ("--backend", name)]
    code = main(args)
    return code, pd.read_parquet(out / "results.parquet").set_index(["backend", "case"])


@pytest.fixture(scope="module")
def forged(tmp_path_factory):
    """One run of the plugins that touch nothing but their own calls, beside the honest control."""
    names = ["honest", "stale_cached", "stale_untouched", "stale_zeros", "knows_timed", "fresh",
             "refuses_in_a_call", "wrong_then_refuses"]  # fmt: skip
    folder = tmp_path_factory.mktemp("forged")
    with plugin_run_scope(folder):
        return run(folder, ["honest.py", "stale.py", "knows_timed.py", "contract.py"], names)


def test_the_honest_control_passes_with_its_timing_credited(forged):
    code, rows = forged
    honest = rows.loc["honest"]
    assert (honest["status"] == "pass").all(), honest["reason"].tolist()
    assert honest["latency_us"].notna().all() and honest["call_us"].notna().all()
    assert code == 1  # the forgers fail the run


@pytest.mark.parametrize(
    ("backend", "words"),
    [
        ("stale_cached", "graded call pass; latency call 1 (inputs changed) wrong"),
        ("stale_untouched", "graded call pass; latency call 1 (inputs changed) wrong: "),
        ("stale_zeros", "graded call pass; latency call 1 (inputs changed) wrong"),
        ("knows_timed", "graded call pass; latency call 1 (inputs changed) wrong"),
        ("fresh", "returned a tensor other than out and left out unwritten"),
        ("wrong_then_refuses", "then raised Unsupported from a call (not from prepare)"),
    ],
)
def test_a_forger_fails_every_row_and_the_reason_names_the_call(forged, backend, words):
    rows = forged[1].loc[backend]
    assert (rows["status"] == "fail").all(), rows[["status", "reason"]].to_string()
    assert all(words in reason for reason in rows["reason"]), rows["reason"].tolist()


def test_unsupported_raised_from_a_call_is_an_error_not_a_skip(forged):
    rows = forged[1].loc["refuses_in_a_call"]
    assert (rows["status"] == "error").all(), rows["status"].tolist()
    assert all(r.startswith("Unsupported from a call (not from prepare)") for r in rows["reason"])


@pytest.mark.slow  # a run with isolated plugin workers
def test_a_plugin_reaches_no_grader_journal_cache_source_or_baseline(tmp_path, monkeypatch):
    """Patching the grader or journal, reading the oracle or its cache, writing the source: none reaches the verdict."""
    cache, log = tmp_path / "cache", tmp_path / "adversary.log"
    monkeypatch.setenv("HARNESS_ORACLE_CACHE", str(cache))
    monkeypatch.setenv("HARNESS_ADVERSARY_LOG", str(log))
    run(tmp_path / "warm", ["honest.py"], ["reference"])  # fills the oracle cache
    assert any(cache.glob("*.oracle"))
    code, rows = run(tmp_path, ["reach_grader.py"], ["reference", "copies_expected"])
    assert code == 1
    assert (rows.loc["copies_expected", "status"] == "fail").all()
    assert (rows.loc["reference", "status"] == "pass").all() and rows.loc["reference", "latency_us"].notna().all()
    seen = log.read_text()
    assert "found the expected output" not in seen
    assert "cache entries seen: 0" in seen, seen
    assert not (cache / "planted.oracle").exists()
    assert "could open the grader's source for writing" not in seen, seen


@pytest.mark.slow  # timed runs with isolated plugin workers
def test_a_plugin_that_slows_the_clock_is_not_credited(tmp_path):
    """Slowed time.perf_counter and CUDA events miss the timer; its own clock slowed is caught by the driver's."""
    _, rows = run(tmp_path, ["clock.py"], ["reference", "slow_clock"])
    assert (rows.loc["reference", "status"] == "pass").all()
    slow = rows.loc["slow_clock"]
    assert (slow["status"] == "fail").all(), slow["reason"].tolist()
    assert all("timing not credited: call_us" in reason for reason in slow["reason"])
    assert slow["latency_us"].isna().all() and all("claimed latency" in note for note in slow["note"])


@pytest.mark.gpu
def test_on_a_gpu_no_forger_passes_and_the_honest_control_does(tmp_path):
    """On a GPU: idle while captured, a side stream, slowed clocks and stale output all fail; the control passes."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    names = ["honest", "stale_cached", "stale_untouched", "knows_timed", "side_stream", "fresh"]
    _, rows = run(tmp_path / "forged", ["honest.py", "stale.py", "knows_timed.py", "contract.py", "side_stream.py"],
                     names, "--device", "cuda")  # fmt: skip
    assert (rows.loc["honest", "status"] == "pass").all(), rows.loc["honest", "reason"].tolist()
    for name in names[1:]:
        assert (rows.loc[name, "status"] == "fail").all(), (name, rows.loc[name, "reason"].tolist())
    _, rows = run(tmp_path / "clock", ["clock.py"], ["reference", "slow_clock"], "--device", "cuda")
    assert (rows.loc["slow_clock", "status"] == "fail").all(), rows.loc["slow_clock", "reason"].tolist()
