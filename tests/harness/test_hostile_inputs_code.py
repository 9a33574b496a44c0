"""Files a colleague hands you are data, never code: plugins, meta commits, journals, workers' output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.backends import builtin as backends_module
from harness.cli.main import build_parser, main
from harness.cli.resume import resume
from harness.results.journal import journal_path
from harness.review import confirm
from tests.harness import review_frames as rf

ROOT = Path(__file__).resolve().parents[2]
_BUILT_IN = dict(backends_module.REGISTRY)

EVIL = """
from pathlib import Path
Path({marker!r}).write_text("imported")
"""

PLUGIN = """
import os, sys, time
from pathlib import Path
import torch
import kernels
from harness import register_backend

DIR = Path(os.environ["HARNESS_TEST_DIR"])

def os_exit(*args, **kwargs):
    os._exit(0)

def hangs(*args, **kwargs):
    (DIR / "worker.pid").write_text(str(os.getpid()))
    time.sleep(3600)

def flood(*args, out=None, **kwargs):
    sys.stdout.write("o" * 50_000 + "\\n")
    sys.stderr.write("e" * 50_000 + "\\n")
    return kernels.paged_attention_tlsim(*args, out=out, **kwargs)

def threads(*args, out=None, **kwargs):
    (DIR / "threads").write_text(str(torch.get_num_threads()))
    return kernels.paged_attention_tlsim(*args, out=out, **kwargs)

for fn in (os_exit, hangs, flood, threads):
    register_backend(fn.__name__, fn)
"""

# On PYTHONPATH, a sitecustomize that makes a spawned worker sleep at start, before any harness code runs.
SLOW_WORKER_START = """
import os, sys, time
if "--multiprocessing-fork" in sys.argv:
    open(os.path.join(os.environ["HARNESS_TEST_DIR"], "starting"), "w").write(str(os.getpid()))
    time.sleep(120)
"""


@pytest.fixture(autouse=True)
def fresh_registry(clean_registry):
    """Each test starts with the built-in backends only (a plugin a test imports goes with it)."""
    backends_module.REGISTRY.clear()
    backends_module.REGISTRY.update(_BUILT_IN)


@pytest.fixture
def setup(tmp_path, monkeypatch, case_file):
    (tmp_path / "plugin.py").write_text(PLUGIN)
    (tmp_path / "evil.py").write_text(EVIL.format(marker=str(tmp_path / "evil_ran")))
    monkeypatch.setenv("HARNESS_TEST_DIR", str(tmp_path))
    return tmp_path


def _harness(setup, *args, env=(), **popen):
    """`python -m harness ARGS` in a new session (a killed test leaves nothing behind)."""
    command = [sys.executable, "-m", "harness", *map(str, args)]
    env = {**os.environ, "HARNESS_TEST_DIR": str(setup), "TRITON_INTERPRET": "1", **dict(env)}
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **popen)  # fmt: skip


def _finish(proc, timeout=240):
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _gone(pid: int) -> bool:
    """No such process, or a zombie (dead, waiting for whoever adopted it to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state == "Z"


def _wait_for(path: Path, proc, seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.2)


# --- 1. only the command line names code -------------------------------------------------------


def _slower_runs(tmp_path, backend: str, **meta_extra) -> tuple[Path, Path]:
    """Two run folders where ``backend`` is 1.5x slower in the new one, meta.json as given."""
    rng = np.random.default_rng(0)
    meta = rf.meta(case_files=[str(tmp_path / "tiny.toml")], timing_threads=1, **meta_extra)
    base = rf.write(pd.DataFrame([rf.row("tiny", backend, 300.0, rng)]), meta, tmp_path / "base")
    new = rf.write(pd.DataFrame([rf.row("tiny", backend, 450.0, rng)]), meta, tmp_path / "new")
    return base, new


def _head() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def test_confirm_never_imports_a_plugin_named_in_a_runs_meta_command(setup, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # git runs here
    evil = setup / "evil.py"
    base, new = _slower_runs(setup, "evil_backend", commit=_head(),
                             command=f"python -m harness run tiny.toml --plugin {evil}")  # fmt: skip
    assert main(["compare", str(base), str(new), "--confirm", "slower"]) == 2
    err = capsys.readouterr().err
    assert f"{new}/meta.json names plugin(s) {evil}" in err and f"pass --plugin {evil}" in err
    assert not (setup / "evil_ran").exists(), "the plugin named by meta.json was imported"


@pytest.mark.parametrize("commit", ["--no-checkout", "deadbeef" * 5, ["a" * 40]])
def test_a_meta_commit_that_is_not_a_commit_id_is_bad_input_before_git_worktree(setup, capsys, monkeypatch, commit):
    monkeypatch.chdir(ROOT)
    added = []  # commits handed to `git worktree add`: none may be, the check comes first
    monkeypatch.setattr(confirm, "worktree", lambda commit, *rest: added.append(commit))
    base, new = _slower_runs(setup, "reference", commit=commit)
    assert main(["compare", str(base), str(new), "--confirm", "slower"]) == 2
    err = capsys.readouterr().err
    assert f"{base}/meta.json: field 'commit'" in err, err
    assert added == []


def test_resume_imports_a_journals_plugin_given_again_with_plugin_by_any_spelling(setup, monkeypatch):
    out = setup / "run"
    rf.journal(out, setup / "tiny.toml", plugins=[str(setup / "evil.py")])
    monkeypatch.chdir(setup)  # the same file by another spelling: matched by its resolved path
    assert main(["run", "--resume", str(out), "--no-progress", "--plugin", "./evil.py"]) == 0
    assert (setup / "evil_ran").exists(), "given with --plugin, it is imported"


# --- 2. resume is honest and exclusive ------------------------------------------------------


def test_resume_lets_timeout_win_and_keeps_the_runs_other_options(setup):
    out = setup / "run"
    rf.journal(out, setup / "tiny.toml")
    args = build_parser().parse_args(["run", "--resume", str(out), "--timeout", "5"])
    resume(args).close(stopped=True)
    assert args.timeout == 5.0, "--timeout given with --resume wins over the journal's 300"
    args = build_parser().parse_args(["run", "--resume", str(out)])
    resume(args).close(stopped=True)
    assert args.timeout == 300.0 and args.isolate == "plugins"


def test_a_second_resume_of_a_journal_being_written_is_refused_naming_the_holder(setup, capsys, monkeypatch):
    out = setup / "run"
    path = rf.journal(out, setup / "tiny.toml")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom harness.results.journal import Journal\n"
         "journal = Journal.read(sys.argv[1])\njournal.lock()\nprint('locked', flush=True)\ntime.sleep(120)", str(path)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert main(["run", "--resume", str(out), "--no-progress"]) == 2
        assert f"process {holder.pid}" in capsys.readouterr().err
        # the pid check aside (another host's pid, a reused one), the lock alone refuses it
        monkeypatch.setattr("harness.cli.resume.pid_alive", lambda pid: False)
        assert main(["run", "--resume", str(out), "--no-progress"]) == 2
        assert f"process {holder.pid} holds this journal's lock" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    assert main(["run", "--resume", str(out), "--no-progress"]) == 0, "the lock goes with its holder"


def test_duplicated_journal_rows_are_dropped_with_a_warning_and_the_folder_loads(setup, capsys):
    done = setup / "done"
    assert main(["run", str(setup / "tiny.toml"), "--out", str(done), "--backend", "tlsim", "--no-timing",
                 "--no-progress"]) == 0  # fmt: skip
    row = {k: (None if isinstance(v, float) and v != v else v) for k, v in pd.read_parquet(done / "results.parquet")
           .iloc[0].to_dict().items()}  # fmt: skip
    row = json.loads(json.dumps(row, default=lambda v: v.tolist() if hasattr(v, "tolist") else str(v)))
    out = setup / "run"
    rf.journal(out, setup / "tiny.toml", rows=[row, {**row, "reason": "second"}])
    capsys.readouterr()
    assert main(["run", "--resume", str(out), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert f"warning: {journal_path(out)}: dropped 1 duplicated row(s)" in err and "tiny tlsim (line 3)" in err
    assert len(pd.read_parquet(out / "results.parquet")) == 1
    assert main(["compare", str(done), str(out)]) in (0, 4), "the written folder is loadable by compare"


# --- 3. processes and output ----------------------------------------------------------------


def test_an_isolated_worker_dies_with_its_sigkilled_parent(setup):
    proc = _harness(setup, "run", setup / "tiny.toml", "--out", setup / "run", "--no-timing", "--no-progress",
                    "--plugin", setup / "plugin.py", "--backend", "hangs")  # fmt: skip
    try:
        _wait_for(setup / "worker.pid", proc)
        worker = int((setup / "worker.pid").read_text())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while not _gone(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(worker), f"worker {worker} outlived its SIGKILLed parent"
    finally:
        _finish(proc, 30)
        if (setup / "worker.pid").exists() and not _gone(int((setup / "worker.pid").read_text())):
            os.kill(int((setup / "worker.pid").read_text()), signal.SIGKILL)


def test_profile_of_a_plugin_that_calls_os_exit_cannot_end_the_run(setup):
    out = setup / "run"
    proc = _harness(setup, "run", setup / "tiny.toml", "--out", out, "--no-timing", "--no-progress",
                    "--plugin", setup / "plugin.py", "--backend", "os_exit", "--backend", "tlsim",
                    "--profile", "tiny:os_exit", "--profile", "tiny:tlsim")  # fmt: skip
    _, err = _finish(proc)
    assert proc.returncode == 1, err[-3000:]  # the os_exit row is an error; the profile did not end the run with 0
    assert "profile: tiny:os_exit failed: the worker process exited with code 0" in err, err[-3000:]
    assert (out / "profiles" / "tiny__tlsim.trace.json").exists(), "the other pair is still profiled"
    rows = pd.read_parquet(out / "results.parquet").set_index("backend")
    assert rows.loc["os_exit", "status"] == "error" and rows.loc["tlsim", "status"] == "pass"


def test_a_plugins_flood_of_output_goes_to_its_row_log_and_the_terminal_gets_its_head(setup, capsys):
    out = setup / "run"
    assert main(["run", str(setup / "tiny.toml"), "--out", str(out), "--no-timing", "--no-progress",
                 "--plugin", str(setup / "plugin.py"), "--backend", "flood", "--backend", "tlsim"]) == 0  # fmt: skip
    captured = capsys.readouterr()
    log = out / "logs" / "tiny__flood.log"
    assert log.stat().st_size >= 100_000 and log.read_text().count("o") >= 50_000
    assert f"more bytes not shown: see {log}" in captured.err
    assert len(captured.err) + len(captured.out) < 8_000, "the flood reached the terminal"
    assert sorted(p.name for p in (out / "logs").iterdir()) == ["tiny__flood.log"], "silent rows leave no log"
    assert not (setup / "run.logs").exists()


def test_an_isolated_worker_runs_with_the_thread_count_its_rows_record(setup):
    out = setup / "run"
    assert main(["run", str(setup / "tiny.toml"), "--out", str(out), "--no-progress", "--threads", "1",
                 "--plugin", str(setup / "plugin.py"), "--backend", "threads"]) == 0  # fmt: skip
    recorded = pd.read_parquet(out / "results.parquet")["timing_threads"].iloc[0]
    assert recorded == 1 and (setup / "threads").read_text() == "1"


def test_ctrl_c_while_a_worker_starts_is_one_line_not_a_childs_traceback(setup):
    (setup / "site").mkdir()
    (setup / "site" / "sitecustomize.py").write_text(SLOW_WORKER_START)
    path = os.pathsep.join(filter(None, [str(setup / "site"), os.environ.get("PYTHONPATH")]))
    proc = _harness(setup, "run", setup / "tiny.toml", "--out", setup / "run", "--no-timing", "--no-progress",
                    "--plugin", setup / "plugin.py", env={"PYTHONPATH": path})  # fmt: skip
    try:
        _wait_for(setup / "starting", proc)
        child = int((setup / "starting").read_text())
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to the whole process group
        _, err = proc.communicate(timeout=60)
    finally:
        _finish(proc, 30)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert [line for line in err.splitlines() if line.strip()] == ["interrupted: nothing was written"], err
    deadline = time.monotonic() + 10
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(child)


def test_a_recorded_thread_count_past_the_cores_runs_on_the_cores():
    """A recorded thread count of a million runs on the cores; the count that ran is returned."""
    import torch

    from harness.cli.options import apply_threads

    before = torch.get_num_threads()
    try:
        assert apply_threads(str(10**6), "cpu") == (os.cpu_count() or 1)
        assert apply_threads("1", "cpu") == 1
    finally:
        torch.set_num_threads(before)


def test_a_planted_link_in_a_runs_log_folder_is_replaced_never_written_through(tmp_path):
    """A link planted in a run's log folder, to a file or as the folder, is replaced, never written through."""
    from harness.execute.output import captured_output

    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    logs = tmp_path / "run.logs"
    logs.mkdir()
    (logs / "c__plug.log").symlink_to(victim)
    with captured_output(str(logs / "c__plug.log")):
        os.write(1, b"the plugin's output\n")
    assert victim.read_text() == "mine"
    assert not (logs / "c__plug.log").is_symlink() and (logs / "c__plug.log").read_text() == "the plugin's output\n"
    (tmp_path / "linked.logs").symlink_to(tmp_path)
    with (
        pytest.raises(OSError, match=r"linked\.logs: a symbolic link"),
        captured_output(str(tmp_path / "linked.logs" / "victim.txt")),
    ):
        pass
    assert victim.read_text() == "mine"
