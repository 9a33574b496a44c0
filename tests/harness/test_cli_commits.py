"""continuous and bisect on real commits: a kernel 50 ms a call slower in the second, timed in paired rounds."""

from __future__ import annotations

import json
import subprocess

import pytest

from harness.cli.main import main

PLUGIN = '''
import time

from harness import register_backend


def slowpoke(q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, scale=None, out=None):
    """The reference kernel, then a wait that each commit's slowpoke_kernel.py sets."""
    import slowpoke_kernel  # from the commit's checkout

    from kernels import paged_attention_reference

    result = paged_attention_reference(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, out)
    end = time.perf_counter() + slowpoke_kernel.WAIT_S
    while time.perf_counter() < end:
        pass
    return result


register_backend("slowpoke", slowpoke, devices=("cpu",))
'''
WAITS = {"first": 0.0, "second": 0.05, "third": 0.05}  # the second commit is the slower one (by 50 ms a call)


@pytest.fixture
def repo(tmp_path, monkeypatch, case_file):
    """A repository (the cwd) of three commits of slowpoke_kernel.py, plugin and case_file beside it; short rounds."""
    monkeypatch.setattr("harness.review.confirm.ROUND_S", 0.1)
    root = tmp_path / "repo"
    root.mkdir()
    monkeypatch.chdir(root)
    for key in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{key}_NAME", "t")
        monkeypatch.setenv(f"GIT_{key}_EMAIL", "t@t")
    git = lambda *args: subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()  # noqa: E731
    git("init", "-q", "-b", "main")
    for name, wait in WAITS.items():
        (root / "slowpoke_kernel.py").write_text(f"WAIT_S = {wait}  # {name}\n")
        git("add", "slowpoke_kernel.py")
        git("commit", "-q", "-m", name)
    (tmp_path / "plugin.py").write_text(PLUGIN)
    return tmp_path


@pytest.mark.slow
@pytest.mark.timeout(600)  # fresh worker processes each round: slow on a loaded machine
def test_continuous_runs_both_commits_and_confirms_the_slowdown_in_paired_rounds(repo, capsys):
    common = ["--cases", str(repo / "tiny.toml"), "--plugin", str(repo / "plugin.py"), "--backend", "slowpoke"]
    argv = ["continuous", "HEAD~2", "HEAD", *common, "--min-effect", "0.5", "--out", str(repo / "runs"), "--json",
            "--confirm-time", "3000"]  # fmt: skip
    assert main(argv) == 1
    out, err = capsys.readouterr()
    (row,) = json.loads(out)["rows"]
    assert row["verdict"] == "slower" and "paired rounds" in row["verdict_reason"] and row["ratio"] > 2, row
    assert (repo / "runs" / "base" / "results.parquet").is_file() and (repo / "runs" / "head" / "meta.json").is_file()
    assert "continuous: base" in err and "continuous: head" in err


@pytest.mark.slow
@pytest.mark.timeout(600)  # fresh worker processes each round: slow on a loaded machine
def test_bisect_names_the_first_commit_where_the_row_got_slower(repo, capsys, clean_registry):
    argv = ["bisect", "HEAD~2", "HEAD", "--case", "tiny", "--backend", "slowpoke", "--cases", str(repo / "tiny.toml"),
            "--plugin", str(repo / "plugin.py"), "--min-effect", "0.5", "--step-time", "3000"]  # fmt: skip
    assert main(argv) == 0  # registers the plugin's backend in this process, as a run does: clean_registry
    out, err = capsys.readouterr()
    assert out.startswith("first slower commit: ") and out.strip().endswith(" second"), out
    assert "bisect: 2 commit(s) after" in err
