"""The timer's sample floor and budget, hang limits, the call/latency split, the derived metrics and the scaling fit."""

from __future__ import annotations

import dataclasses
import os
import time

import numpy as np
import pandas as pd
import pytest
import torch

import kernels
from harness.backends.builtin import REGISTRY, register_backend
from harness.backends.registry import Backend, contract_prepare
from harness.cases.loading import load_cases
from harness.cases.spec import expand_spec, load_case_file
from harness.cli.main import main
from harness.execute.local import run_cases
from harness.results import environment
from harness.results.storage import load_run
from harness.run import runner
from harness.run.grading import locate
from harness.run.runner import RunConfig
from harness.timing import measure, timer
from harness.timing.measure import LIMIT_FLOOR_S, row_time_limit
from harness.timing.metrics import attended_pairs, bytes_moved, flops, kv_tokens_read, tflops
from harness.timing.scaling import fit_line, fit_scaling, fit_verdict
from harness.timing.timer import probe_call, time_call, time_wall
from tests.tiny_cases import write_cases

pytestmark = pytest.mark.usefixtures("clean_registry")  # backends registered here vanish after each test


def test_time_call_keeps_its_floor_of_samples_past_its_budget_and_time_wall_measures_the_whole_call():
    timing = time_call(lambda: time.sleep(0.002), "cpu", target_s=0.001, min_reps=10)
    assert len(timing.samples_us) == 10 and min(timing.samples_us) >= 2000
    assert time_wall(lambda: time.sleep(0.003), "cpu", min_reps=5, target_s=0.0).median_us >= 3000
    probe = probe_call(lambda: None, "cpu")  # off CUDA: nothing to say about graphs or syncs
    assert probe.graph_capturable is None and probe.device_syncs is None


def test_time_wall_on_cuda_splits_the_hosts_return_from_the_drained_wall(monkeypatch):
    """host_samples are the call's own return time; the wall adds the drain (a fake 4 ms drain, 1 ms call)."""
    monkeypatch.setattr(timer, "_is_cuda", lambda device: True)
    monkeypatch.setattr(timer, "L2_FLUSH_BYTES", 16)
    drains = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: drains.append(time.sleep(0.004)))
    host: list[float] = []
    wall = time_wall(lambda: time.sleep(0.001), "cpu", min_reps=10, max_reps=10, host_samples=host)
    assert len(host) == len(wall.samples_us) == 10 and len(drains) == 20
    assert all(1000 <= h < w - 3000 for h, w in zip(host, wall.samples_us, strict=True))


def one_case(**fields):
    (case,) = expand_spec({"name": "c", "num_q_heads": 2, "num_kv_heads": 1, "head_dim": 32, "block_size": 4,
                           "dtype": "float16", **fields}, "test")  # fmt: skip
    return case


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_call_that_cannot_be_captured_leaves_the_cuda_rng_usable():
    """A host sync inside the probe's capture fails it; the device generator must not stay in capture mode."""
    x = torch.ones(4, device="cuda")
    assert not probe_call(lambda: x.sum().item(), "cuda").graph_capturable
    first = torch.randn(4, device="cuda")  # raised "Offset increment outside graph capture" before
    assert first.isfinite().all() and not torch.equal(first, torch.randn(4, device="cuda"))


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        # seq 0: queries at positions 3, 4 see 4 + 5 keys; seq 1: positions 0, 1, 2 see 1 + 2 + 3
        ({"seq_lens": [5, 3], "q_lens": [2, 3], "block_size": 16, "dtype": "float32"},
         {"attended_pairs": 9 + 6, "flops": 4 * 15 * 2 * 32}),
        # seq 0: queries at 17..19 see keys from 13 on (7 keys; 5 + 5 + 5 pairs); seq 1: queries at 0..5 see keys
        # 0..5 (6 keys; 1 + 2 + 3 + 4 + 5 + 5 pairs)
        ({"seq_lens": [20, 6], "q_lens": [3, 6], "sliding_window": 5},
         {"kv_tokens_read": 7 + 6, "bytes_moved": 2 * 13 * 1 * 64 + 2 * 9 * 2 * 64, "attended_pairs": 15 + 20,
          "flops": 2 * 35 * 2 * 64}),
        # keys 0..7 are the same two pages in all three sequences: read once
        ({"seq_lens": [10, 13, 9], "q_lens": [1, 2, 1], "layout": "shared_prefix", "cascade": True},
         {"prefix_blocks": 2, "kv_tokens_read": 8 + (10 - 8) + (13 - 8) + (9 - 8),
          "bytes_moved": 2 * 16 * 1 * 64 + 2 * 4 * 2 * 64}),
        ({"seq_lens": [10, 13, 9], "q_lens": [1, 2, 1]}, {"kv_tokens_read": 32}),
        # a shared prefix under a window: keys 0..11; seq 0 reads 8..11 (inside it), seq 1 reads 16..19 (its own)
        ({"seq_lens": [12, 20], "q_lens": [1, 1], "layout": "shared_prefix", "sliding_window": 4},
         {"kv_tokens_read": 4 + 4}),
    ],
)  # fmt: skip
def test_the_metrics_count_each_key_read_and_each_causal_pair_once(fields, expected):
    case = one_case(**fields)
    metrics = {"kv_tokens_read": kv_tokens_read, "bytes_moved": bytes_moved, "attended_pairs": attended_pairs,
               "flops": flops, "prefix_blocks": lambda case: case.prefix_blocks}  # fmt: skip
    assert {name: metrics[name](case) for name in expected} == expected
    assert tflops(flops(case), 1.0) == pytest.approx(flops(case) / 1e6)


def test_fit_scaling_fits_each_backend_and_skips_too_few_points():
    frame = pd.DataFrame({"backend": ["a"] * 4 + ["b"] * 2, "total_kv_tokens": [100, 200, 400, 800, 100, 200],
                          "num_seqs": [1, 1, 1, 1, 1, 2], "latency_us": [11.0, 12.0, 14.0, 18.0, 5.0, 6.0]})  # fmt: skip
    fits = fit_scaling(frame)
    assert list(fits["backend"]) == ["a"], "b has two points; num_seqs of a has one distinct value"
    (fit,) = fits.itertuples()
    assert fit.x == "total_kv_tokens" and fit.per_unit_us == pytest.approx(0.01) and fit.fixed_us == pytest.approx(10.0)
    assert fit.fitted and fit.reason == "" and fit.r2 > 0.99
    x = np.array([1.0, 2.0, 4.0, 8.0])
    assert fit_line(x, 3.0 + 0.5 * x) == pytest.approx((0.5, 3.0, 1.0))
    # just under the bar: 0.899 is rejected, 0.9 itself kept; a zero fixed cost is not negative
    assert fit_verdict(0.1, 1.0, 0.899) == "r² 0.90 < 0.9" and fit_verdict(0.1, 1.0, 0.9) == ""
    assert fit_verdict(0.1, 0.0, 1.0) == ""


@pytest.mark.parametrize(
    ("latency_us", "reason"),
    [
        ([20.0, 40.0, 12.0, 30.0], "r² 0.00 < 0.9"),  # a cloud: the least-squares line explains nothing
        ([18.0, 14.0, 11.0, 3.0], "negative per-unit cost"),  # faster with more work: r2 0.99, not a cost
        ([1.0, 6.0, 16.0, 36.0], "negative fixed cost"),  # -4 + 0.05 x: r2 1.0, but a negative launch cost
    ],
)
def test_a_fit_below_r2_0_9_or_with_a_negative_term_is_no_fit_and_says_why(latency_us, reason):
    frame = pd.DataFrame({"backend": "a", "total_kv_tokens": [100, 200, 400, 800], "num_seqs": 1,
                          "latency_us": latency_us})  # fmt: skip
    (fit,) = fit_scaling(frame).itertuples()
    assert not fit.fitted and fit.reason == reason, fit
    assert np.isnan(fit.per_unit_us) and np.isnan(fit.fixed_us)


def test_a_timed_cli_run_writes_every_timing_column_and_the_page(tmp_path, drawn_plots):
    cases = write_cases(tmp_path / "c.toml", {"name": "c", "block_size": 16, "seq_lens": [9, 3], "q_lens": [2, 1]})
    out = tmp_path / "run"
    args = ["--backend", "reference", "--backend", "sdpa_contiguous", "--out", str(out), "--no-progress"]
    assert main(["run", str(cases), *args]) == 0
    frame, meta = load_run(out)
    # the CLI's page with its plots drawn: latency and bandwidth, error against tolerance
    assert (out / "report.html").read_text().count('<img src="data:image/svg+xml;base64,') >= 2
    assert frame["latency_us"].notna().all() and frame["call_us"].notna().all()
    assert (frame["timing_reps"] >= 10).all() and all(len(s) >= 10 for s in frame["latency_samples_us"])
    assert (frame["timing_method"] == "cpu_perf_counter").all()
    assert frame["latency_us"].between(frame["latency_p10_us"], frame["latency_p90_us"]).all()
    assert list(frame["gbps"]) == pytest.approx(list(frame["bytes_moved"] / (frame["latency_us"] * 1e3)))
    assert list(frame["pct_of_ceiling"]) == pytest.approx(list(100 * frame["gbps"] / meta["ceilings"]["read_gbps"]))
    assert frame["tflops"].gt(0).all() and frame["pct_of_peak"].gt(0).all(), "q_len 2 makes it a prefill row"
    assert meta["ceilings"]["read_gbps"] > 0 and meta["timing_threads"] == 1
    assert "float32" in meta["ceilings"]["peak_tflops"]


def test_a_declared_commit_wins_over_a_stale_git_and_the_disagreement_is_recorded(monkeypatch):
    monkeypatch.setattr(environment, "git", lambda *args: "a" * 40)
    monkeypatch.setenv("HARNESS_COMMIT", "b" * 40)
    record = environment.commit_record()
    assert record["commit"] == "b" * 40 and "aaaaaaaaaaaa" in record["commit_source"] and record["dirty"] is None
    monkeypatch.delenv("HARNESS_COMMIT")
    assert environment.commit_record() == {"commit": "a" * 40, "commit_source": "git"}


def test_a_failing_row_names_the_sequence_query_position_and_head_of_its_worst_element(tmp_path, run_rows):
    assert locate(3, [0, 2, 2, 5], [4, 7, 9]) == "seq 2, query 1 (position 7)", "seq 1 has no query"

    def off_at_one_element(*args, **kwargs):
        result = kernels.paged_attention_reference(*args, **kwargs)
        result[3, 1, 0] += 1.0  # token 3 = seq 1's second query
        return result

    register_backend("off_at_one_element", off_at_one_element)
    path = write_cases(tmp_path / "c.toml", {"name": "c", "seq_lens": [5, 9], "q_lens": [2, 3], "block_size": 16})
    row = run_rows(path, ["off_at_one_element"]).loc["off_at_one_element"]
    assert row["status"] == "fail" and row["fail_count"] == 1
    assert row["worst_location"] == "seq 1, query 1 (position 7), head 1"


def _one_row_within_a_short_budget(tmp_path, monkeypatch, fn, model=False, budget_s=0.1, device="cpu"):
    """The row of one tiny case through a backend calling ``fn``, every row's timing budget ``budget_s``."""
    short = dataclasses.replace(runner.TimingSettings(device, {}), budget_s=budget_s)
    monkeypatch.setattr(runner, "TimingSettings", lambda *a, **k: short)
    cases = load_cases([write_cases(tmp_path / "c.toml", {"name": "tiny"})], device=device)
    backend = Backend("slow", contract_prepare(fn), (device,), "plugin", "sleeps past the budget", model=model)
    config = RunConfig(device=device, backends=[backend], timing=True, progress=False)
    (row,) = run_cases(cases, config).to_dict("records")
    assert row["status"] == "pass", row["reason"]
    return row


@pytest.mark.parametrize(
    "device, model, every_call_slow",
    [
        pytest.param("cuda", False, False, marks=pytest.mark.gpu, id="kernel_on_a_gpu"),
        pytest.param("cuda", False, True, marks=pytest.mark.gpu, id="kernel_slow_on_every_call_on_a_gpu"),
        pytest.param("cuda", True, False, marks=pytest.mark.gpu, id="python_model_on_a_gpu"),
        pytest.param("cpu", False, False, id="kernel_on_a_cpu"),
        pytest.param("cpu", True, False, id="python_model"),
    ],
)
def test_a_kernel_compiling_past_the_budget_is_timed_on_a_gpu(tmp_path, monkeypatch, device, model, every_call_slow):
    """On a GPU a kernel's call past the budget gets a second call (its first may compile); elsewhere one decides."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    calls = []

    def compiles_once(*args, **kwargs):
        if not calls or every_call_slow:
            time.sleep(0.3)  # the "compile"
        calls.append(1)
        return kernels.paged_attention_reference(*args, **kwargs)

    row = _one_row_within_a_short_budget(tmp_path, monkeypatch, compiles_once, model=model, device=device)
    if device == "cuda" and not model and not every_call_slow:
        assert "not timed" not in str(row["note"]) and row["latency_us"] > 0
    else:
        assert "not timed: one call took" in row["note"] and len(calls) == 1 + every_call_slow, "the calls that decide"
        why = "a Python model on a GPU is graded" if device == "cuda" and model else "0.1 s timing budget"
        assert why in row["note"] and row["latency_us"] != row["latency_us"], "an untimed row"


def test_a_python_model_on_a_gpu_is_graded_not_timed(tmp_path, monkeypatch):
    gpu, cpu = measure.TimingSettings("cuda", {}), measure.TimingSettings("cpu", {})
    assert REGISTRY["tlsim"].model and REGISTRY["reference"].model and not REGISTRY["triton"].model
    assert measure.MODEL_BUDGET_S == 0
    assert gpu.for_backend(REGISTRY["tlsim"]).budget_s == measure.MODEL_BUDGET_S
    assert gpu.for_backend(REGISTRY["triton"]).budget_s == measure.ROW_BUDGET_S  # kernels keep the row budget
    assert cpu.for_backend(REGISTRY["tlsim"]).budget_s == measure.ROW_BUDGET_S  # on a CPU the models are the subject
    assert dataclasses.replace(gpu, budget_s=None).for_backend(REGISTRY["tlsim"]).budget_s is None  # unbudgeted
    # the row it makes (its timing settings' budget 0): graded, its note saying why it has no latency
    row = _one_row_within_a_short_budget(tmp_path, monkeypatch, kernels.paged_attention_reference, True, 0.0)
    assert "not timed: one call took" in row["note"] and "graded, not timed" in row["note"]
    assert row["latency_us"] != row["latency_us"]


@pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="the Triton reader runs on CUDA, or interpreted with TRITON_INTERPRET=1",
)
def test_the_read_ceilings_streaming_reader_reads_every_element_once():
    """A reader that skipped part of the buffer would raise the ceiling: its program sums must add up to the whole."""
    pytest.importorskip("triton")
    from harness.timing.ceilings import _streaming_reader

    device = "cuda" if torch.cuda.is_available() else "cpu"
    src = torch.rand(3 * 4096 * 8 + 1000, dtype=torch.float32, device=device)  # a ragged last program
    reader = _streaming_reader(src)
    assert reader is not None
    read, sums = reader
    read()
    assert sums.numel() == 4
    torch.testing.assert_close(sums.sum(), src.sum(), rtol=1e-5, atol=1e-3)


# --- hangs: one time limit each; the default limit follows the row's cost ---------------------------------------------


CASES = [{"name": "first"}, {"name": "second", "seed": 1}, {"name": "third", "seed": 2}]
LIMIT = 1  # seconds from the call's start: a worker's start does not count


@pytest.mark.parametrize("scale", [[], ["--workers", "1"]], ids=["isolated", "workers"])
def test_a_backend_hanging_on_its_first_case_costs_one_limit_then_its_rows_are_skips_naming_it(tmp_path, plugin, scale):
    write_cases(tmp_path / "cases.toml", *CASES)
    out = tmp_path / "run"
    started = time.monotonic()
    code = main(["run", str(tmp_path / "cases.toml"), "--plugin", str(plugin), "--backend", "hangs",
                 "--no-timing", "--no-progress", "--timeout", str(LIMIT), "--device", "cpu", "--out", str(out), *scale])  # fmt: skip
    elapsed = time.monotonic() - started
    assert code == 1
    rows = pd.read_parquet(out / "results.parquet").set_index("case")
    assert rows.loc["first", "status"] == "error" and f"timed out after {LIMIT} s" in rows.loc["first", "reason"]
    for case in ("second", "third"):
        assert rows.loc[case, "status"] == "skip"
        assert rows.loc[case, "reason"] == f"hung on first after {LIMIT} s; not run"
    assert len((tmp_path / "hung").read_text().split()) == 1  # called once: the hung backend got no more cases
    assert elapsed < 3 * LIMIT + 60  # one limit, plus starting workers on a busy machine; not three limits each


def test_the_default_limit_has_a_floor_and_grows_with_the_rows_cost(tmp_path):
    shape = {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "block_size": 16, "dtype": "bfloat16"}
    write_cases(tmp_path / "cases.toml", {"name": "small", "seq_lens": [16]},
                {"name": "big", "seq_lens": [131072], "q_lens": [4096]},
                {"name": "bigger", "seq_lens": [131072] * 4, "q_lens": [4096] * 4}, defaults=shape)  # fmt: skip
    small, big, bigger = load_case_file(tmp_path / "cases.toml")
    measured = {"read_gbps": 4000.0, "peak_tflops": {"bfloat16": 989.0}}
    assert row_time_limit(small, "cpu") == row_time_limit(small, "cuda", measured) == LIMIT_FLOOR_S
    assert LIMIT_FLOOR_S < row_time_limit(big, "cpu") < row_time_limit(bigger, "cpu")
    # the same case against a measured GPU is expected to run far faster than on the CPU
    assert row_time_limit(bigger, "cuda", measured) < row_time_limit(bigger, "cpu")


def test_a_deadline_stops_sampling_and_marks_the_timing_cut_short():
    started = time.monotonic()
    timing = time_call(lambda: time.sleep(0.05), "cpu", deadline=started + 0.2)
    assert timing.cut_short and 1 <= len(timing.samples_us) < 10
    assert time.monotonic() - started < 1.0
    fast = time_call(lambda: None, "cpu", deadline=time.monotonic() + 5)
    assert not fast.cut_short and len(fast.samples_us) >= 10


def test_a_row_timed_past_its_budget_says_so_in_its_note(tmp_path, monkeypatch):
    assert measure.ROW_BUDGET_S >= 1  # lowered below for speed
    slow = lambda *args, **kwargs: time.sleep(0.05) or kernels.paged_attention_tlsim(*args, **kwargs)  # noqa: E731
    row = _one_row_within_a_short_budget(tmp_path, monkeypatch, slow, budget_s=0.3)  # 50 ms a call
    assert "timed within a 0.3 s budget:" in row["note"] and row["timing_reps"] < 10
