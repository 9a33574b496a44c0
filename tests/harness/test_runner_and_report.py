"""Runner rows (pass, fail, skip, error; a peer that raises errs), NaN poisoning, plugins, exit codes, reports."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch

import kernels
from harness import register_backend
from harness.backends import peers
from harness.backends.registry import REGISTRY
from harness.cases.spec import expand_spec
from harness.cli.main import main
from harness.results import storage as storage_module
from harness.run.runner import RunConfig, build_context, exit_code, run_backend
from tests.tiny_cases import TINY, write_cases

pytestmark = pytest.mark.usefixtures("clean_registry")  # backends registered here vanish after each test


def half_written(q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, scale=None, out=None):
    """Writes only the first half of the rows."""
    full = kernels.paged_attention_tlsim(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale)
    out[: q.shape[0] // 2] = full[: q.shape[0] // 2]
    return out


def test_rows_for_pass_fail_skip_and_error_the_run_goes_on_and_its_folder_lists_failures_first(tmp_path, plugin):
    """In process, a plugin from a path (``good``; ``scaled_wrong``, its softmax scale 1% off) beside an error, an
    output half written, a CUDA-only backend and one the case file excludes: a row each, exit 1, the report written."""
    register_backend("half_written", half_written)
    path = write_cases(tmp_path / "c.toml", {"name": "tiny", "exclude_backends": ["reference"]})
    names = ["raises", "half_written", "cuda_only", "reference", "tlsim", "good", "scaled_wrong"]
    run = tmp_path / "run"
    assert main(["run", str(path), "--out", str(run), "--no-progress", "--no-timing", "--plugin", str(plugin),
                 "--isolate", "none", *(arg for name in names for arg in ("--backend", name))]) == 1  # fmt: skip
    rows = pd.read_parquet(run / "results.parquet").set_index("backend")
    assert list(rows.index) == names
    assert rows.loc["raises", "status"] == "error"
    assert "RuntimeError: no kernel here" in rows.loc["raises", "reason"]
    assert rows.loc["half_written", "status"] == "fail"
    assert rows.loc["half_written", "nan_count"] > 0, "unwritten rows stay NaN, and NaN never passes"
    assert "NaN" in rows.loc["half_written", "reason"]
    assert rows.loc["cuda_only", "status"] == "skip"
    assert rows.loc["cuda_only", "reason"] == "cuda_only runs on cuda, not cpu"
    assert rows.loc["reference", "status"] == "skip" and rows.loc["reference", "reason"] == "excluded by the case file"
    assert rows.loc["tlsim", "status"] == "pass", "a backend after an error still runs"
    assert rows.loc[["good", "scaled_wrong"], "status"].tolist() == ["pass", "fail"]
    assert exit_code(rows.loc[["raises", "tlsim"]].reset_index()) == 1, "an error row alone fails the run"
    assert exit_code(rows.loc[["cuda_only", "tlsim"]].reset_index()) == 0, "skips do not"
    assert sorted(p.name for p in run.iterdir()) == sorted(storage_module.RESULT_FILES)
    csv = pd.read_csv(run / "results.csv")
    assert list(csv.columns[:22]) == [
        "case", "backend", "device", "dtype", "num_q_heads", "num_kv_heads", "head_dim", "block_size",
        "num_seqs", "max_seq_len", "status", "reason", "max_abs_err", "max_rel_err", "rel_l2_err",
        "nan_count", "atol", "rtol", "latency_us", "bytes_moved", "gbps", "pct_of_ceiling",
    ]  # fmt: skip
    html = (run / "report.html").read_text()
    assert html.index('<tr class="fail">') < html.index('<tr class="pass">')
    meta = (run / "meta.json").read_text()
    assert '"torch"' in meta and '"commit"' in meta and '"command"' in meta


def test_write_run_refuses_an_existing_folder_and_an_interrupted_write_leaves_nothing(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "keep.txt").write_text("earlier")
    frame = pd.DataFrame([{"case": "c", "backend": "b", "status": "pass"}])
    with pytest.raises(storage_module.RunDirExistsError, match="never overwritten"):
        storage_module.write_run(frame, {}, tmp_path / "run")
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["keep.txt"]

    def interrupted(*args):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        storage_module.write_run(frame, {}, tmp_path / "other", page=interrupted)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"], "no staging folder, no partial one left behind"


def test_sdpa_peers_do_not_leak_pool_nan(case_file, run_rows):
    rows = run_rows(case_file, ["gather_sdpa", "sdpa_contiguous"])
    assert (rows["status"] == "pass").all(), rows["reason"].tolist()


def test_list_verb_prints_the_expanded_cases(case_file, capsys):
    assert main(["list", str(case_file)]) == 0
    out = capsys.readouterr().out
    assert "tiny" in out and "4/2" in out and out.rstrip().endswith("1 case")


def test_timing_samples_are_kept_in_the_parquet_and_left_out_of_the_csv(tmp_path):
    import numpy as np

    frame = pd.DataFrame({"case": ["c"], "backend": ["b"], "status": ["pass"], "latency_us": [2.0],
                          "latency_samples_us": [np.arange(1500.0)], "call_samples_us": [np.ones(3)]})  # fmt: skip
    run = storage_module.write_run(frame, {"device": "cpu"}, tmp_path / "run")
    kept = pd.read_parquet(run / "results.parquet")
    assert list(kept.loc[0, "latency_samples_us"]) == list(range(1500))  # every sample, none elided
    assert list(pd.read_csv(run / "results.csv").columns) == ["case", "backend", "status", "latency_us"]


# --- a peer whose call raises is an error row with its message, never a skip; only declared limits skip ------------


CONFIG = RunConfig(device="cpu", backends=[], timing=False, progress=False)


def case(**fields):
    (made,) = expand_spec({"name": "peer", **TINY, "dtype": "float16", **fields}, "test")
    return made


def _raising(error):
    def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, -1),
                    enable_gqa=False, seqused_k=None, block_table=None):  # fmt: skip
        raise error("varlen kernel exploded: illegal memory access")

    return varlen_attn


def broken_varlen_attn(*args, **kwargs):
    raise AssertionError("a peer outside its declared limits was called")


# (peer, case fields, its varlen_attn (None: not in this torch), the row's status and reason)
PEER_ROWS = [
    *((name, {}, _raising(error), "error", f"{error.__name__}: varlen kernel exploded: illegal memory access")
      for name, error in (("varlen_flash", RuntimeError), ("varlen_flash_paged", RuntimeError),
                          ("varlen_flash", ValueError), ("varlen_flash", TypeError))),
    ("varlen_flash", {"dtype": "float32"}, broken_varlen_attn, "skip",  # never called: decided before
     "FlashAttention's varlen kernel takes fp16/bf16 only"),
    ("varlen_flash", {"head_dim": 36}, broken_varlen_attn, "skip",
     "FlashAttention takes head_dim a multiple of 8 up to 256, not 36"),
    ("varlen_flash", {}, None, "skip", f"torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "fields", "varlen_attn", "status", "reason"), PEER_ROWS)
def test_any_exception_of_a_peers_call_is_an_error_row_with_its_message_only_a_declared_limit_skips(
    name, fields, varlen_attn, status, reason, monkeypatch
):
    monkeypatch.setattr(peers, "_varlen_attn", lambda: varlen_attn)
    backend = dataclasses.replace(REGISTRY[name], devices=("cpu",))  # the fake runs anywhere
    row = run_backend(build_context(case(**fields), "cpu", "cpu"), backend, CONFIG)
    assert (row["status"], row["reason"].split(" (at")[0]) == (status, reason), row
