"""No backend can end the run, no run is lost, no false green: isolation, journal, resume, exit codes."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest

from harness.backends import builtin as backends_module
from harness.cli.main import main
from harness.results import storage as storage_module
from harness.results.journal import Journal, JournalError, journal_path
from harness.run.runner import to_frame
from tests.tiny_cases import TINY, write_cases

ROOT = Path(__file__).resolve().parents[2]

FIRST, SECOND = {"name": "first"}, {"name": "second", "seed": 1}

PLUGIN = """
import ctypes, os, signal, sys, time
from pathlib import Path
import kernels
from harness import register_backend

def _marker(name):
    path = Path(os.environ.get("HARNESS_TEST_DIR", "/nonexistent")) / name
    if path.exists():
        path.unlink()
        return True
    return False

def good(*args, out=None, **kwargs):
    count = Path(os.environ.get("HARNESS_TEST_DIR", "/nonexistent")) / "calls"
    if count.parent.exists():
        with count.open("a") as f:
            f.write("call\\n")
    return kernels.paged_attention_tlsim(*args, out=out, **kwargs)

def os_exit(*args, **kwargs):
    os._exit(0)

def segfault(*args, **kwargs):
    ctypes.string_at(0)

def hangs(*args, **kwargs):
    time.sleep(3600)

def sys_exit(*args, **kwargs):
    sys.exit(0)

def sigterm_once(*args, out=None, **kwargs):
    if _marker("sigterm"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    return kernels.paged_attention_tlsim(*args, out=out, **kwargs)

def sigkill_once(*args, out=None, **kwargs):
    if _marker("sigkill"):
        os.kill(os.getpid(), signal.SIGKILL)
    return kernels.paged_attention_tlsim(*args, out=out, **kwargs)

for fn in (good, os_exit, segfault, hangs, sys_exit, sigterm_once, sigkill_once):
    register_backend(fn.__name__, fn)
register_backend("cuda_only", good, devices=("cuda",))
"""


_BUILT_IN = dict(backends_module.REGISTRY)


def fresh_registry():
    """What a new process has: the built-ins only (a resume in the same test re-imports the plugin)."""
    backends_module.REGISTRY.clear()
    backends_module.REGISTRY.update(_BUILT_IN)


pytestmark = pytest.mark.usefixtures("clean_registry")  # backends registered here vanish after each test


@pytest.fixture
def setup(tmp_path, monkeypatch):
    write_cases(tmp_path / "cases.toml", FIRST, SECOND)
    (tmp_path / "faulty_plugin.py").write_text(PLUGIN)
    monkeypatch.setenv("HARNESS_TEST_DIR", str(tmp_path))
    return tmp_path


def run(setup, out, *extra):
    return main(["run", str(setup / "cases.toml"), "--out", str(out), "--no-progress", "--no-timing",
                 "--plugin", str(setup / "faulty_plugin.py"), *extra])  # fmt: skip


def backends(*names):
    return [arg for name in names for arg in ("--backend", name)]


def rows_of(out):
    return pd.read_parquet(out / "results.parquet")


# --- 2. no backend can end the run -------------------------------------------------------


@pytest.mark.slow  # workers crash and one hangs past its limit
def test_exit_segfault_hang_and_sys_exit_in_a_plugin_are_error_rows_and_the_run_goes_on(setup, capsys):
    """Case 'first' limits a call to 4 s (timeout_s); 'second' runs only `hangs`, which is hung by then."""
    write_cases(setup / "cases.toml", {**FIRST, "timeout_s": 4.0}, {**SECOND, "backends": ["hangs"]})
    out = setup / "reports" / "run"
    code = run(setup, out, "--timeout", "2", *backends("os_exit", "segfault", "hangs", "sys_exit", "good", "tlsim"))
    assert code == 1
    rows = rows_of(out).set_index(["case", "backend"]).loc["first"]
    assert rows.loc["os_exit", "status"] == "error" and "exited with code 0" in rows.loc["os_exit", "reason"]
    assert rows.loc["segfault", "status"] == "error" and "killed by SIGSEGV" in rows.loc["segfault", "reason"]
    assert rows.loc["hangs", "status"] == "error" and "timed out after 4 s" in rows.loc["hangs", "reason"]
    assert rows.loc["sys_exit", "status"] == "error" and rows.loc["sys_exit", "reason"].startswith("SystemExit")
    assert rows.loc["good", "status"] == "pass", "an isolated call after three deaths runs in a fresh worker"
    assert rows.loc["tlsim", "status"] == "pass"
    second = rows_of(out).set_index(["case", "backend"]).loc["second"]
    assert second.loc["hangs", "status"] == "skip"
    assert second.loc["hangs", "reason"] == "hung on first after 4 s; not run"


# --- 3. the journal: a killed run is resumed -----------------------------------------------


def test_sigterm_keeps_the_journal_and_resume_runs_only_the_missing_pairs(setup, capsys):
    (setup / "sigterm").touch()
    out = setup / "reports" / "run"
    assert run(setup, out, "--isolate", "none", *backends("good", "sigterm_once")) == 143
    err = capsys.readouterr().err
    assert f"terminated (SIGTERM): 1 rows kept in {journal_path(out)}" in err
    assert f"python -m harness run --resume {out}" in err
    assert not out.exists()
    assert [r["backend"] for r in Journal.read(journal_path(out)).rows] == ["good"]
    fresh_registry()
    assert main(["run", "--resume", str(out), "--no-progress", "--plugin", str(setup / "faulty_plugin.py")]) == 0
    assert "3 to run, 1 from the journal" in capsys.readouterr().err
    rows = rows_of(out)
    assert list(zip(rows["case"], rows["backend"], strict=True)) == [
        ("first", "good"), ("first", "sigterm_once"), ("second", "good"), ("second", "sigterm_once")
    ]  # fmt: skip
    assert set(rows["status"]) == {"pass"}
    assert (setup / "calls").read_text().count("call") == 2, "the journaled pair was not run again"
    assert not journal_path(out).exists(), "the journal goes once the folder is written"


@pytest.mark.slow  # runs in fresh interpreters, one killed
def test_a_sigkilled_run_is_reported_at_the_next_run_and_resumed(setup, capsys):
    (setup / "sigkill").touch()
    reports = setup / "reports"
    out = reports / "killed"
    command = [sys.executable, "-m", "harness", "run", str(setup / "cases.toml"), "--out", str(out), "--no-timing",
               "--no-progress", "--isolate", "none", "--plugin", str(setup / "faulty_plugin.py"),
               *backends("good", "sigkill_once")]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "HARNESS_TEST_DIR": str(setup)})  # fmt: skip
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    assert [r["backend"] for r in Journal.read(journal_path(out)).rows] == ["good"]
    dead = subprocess.Popen(["true"])
    dead.wait()
    partial = reports / f".gone.partial-{dead.pid}"
    partial.mkdir()
    (partial / ".harness-partial").write_text(f"{dead.pid}\n")  # what write_run puts in its partial folder
    (partial / "results.csv").write_text("half")
    assert main(["run", str(setup / "cases.toml"), "--out", str(reports / "next"), "--backend", "tlsim",
                 "--no-timing", "--no-progress"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert f"unfinished run: 1 rows in {journal_path(out)}" in err
    assert f"finish it with: python -m harness run --resume {out}" in err
    assert f"removed {partial}: a run (pid {dead.pid}) died while writing it" in err
    assert not partial.exists()
    fresh_registry()
    assert main(["run", "--resume", str(out), "--no-progress", "--plugin", str(setup / "faulty_plugin.py")]) == 0
    assert len(rows_of(out)) == 4 and not journal_path(out).exists()


def test_a_failing_final_write_keeps_the_journal_and_says_how_to_resume(setup, capsys, monkeypatch):
    out = setup / "reports" / "run"

    def disk_full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(pd.DataFrame, "to_parquet", disk_full)
        assert run(setup, out, *backends("good", "tlsim")) == 3
    err = capsys.readouterr().err
    assert "writing the run folder" in err and "No space left on device" in err
    assert f"the 4 rows are kept in {journal_path(out)}" in err and f"--resume {out}" in err
    assert sorted(p.name for p in out.parent.iterdir()) == ["run.journal.jsonl"], "no partial folder left"
    fresh_registry()
    assert main(["run", "--resume", str(out), "--no-progress", "--plugin", str(setup / "faulty_plugin.py")]) == 0
    assert "0 to run, 4 from the journal" in capsys.readouterr().err
    assert (setup / "calls").read_text().count("call") == 2, "nothing ran again"
    assert len(rows_of(out)) == 4 and set(rows_of(out)["status"]) == {"pass"}


# --- 5. writes ------------------------------------------------------------------------------


def test_a_read_only_reports_folder_is_exit_2_before_any_work(setup, capsys, monkeypatch):
    reports = setup / "reports"
    reports.mkdir()
    reports.chmod(0o555)
    try:
        if os.geteuid() == 0:  # root writes anyway: make the kernel's answer the one a user gets
            real_open = os.open

            def read_only(path, flags, *args):
                if str(path).startswith(str(reports)) and flags & os.O_CREAT:
                    raise PermissionError(errno.EACCES, "Permission denied", str(path))
                return real_open(path, flags, *args)

            monkeypatch.setattr(os, "open", read_only)
        assert run(setup, reports / "run", *backends("good")) == 2
    finally:
        reports.chmod(0o755)
    assert "Permission denied" in capsys.readouterr().err
    assert not (setup / "calls").exists(), "no backend ran"


def test_runs_started_at_the_same_second_get_distinct_folders(tmp_path, monkeypatch):
    class Frozen:
        @staticmethod
        def now(tz=None):
            import datetime

            return datetime.datetime(2026, 1, 1, tzinfo=tz)

    monkeypatch.setattr(storage_module, "datetime", Frozen)
    real_default = storage_module.default_run_dir
    same_name = real_default(tmp_path, "cpu")
    first_call = threading.local()

    def raced_default(root, device):  # every run computes the same name before any has reserved it
        if getattr(first_call, "done", False):
            return real_default(root, device)
        first_call.done = True
        return same_name

    monkeypatch.setattr(storage_module, "default_run_dir", raced_default)
    frame = to_frame([{"case": "c", "backend": "b", "status": "pass"}])
    reserved, errors = [], []
    barrier = threading.Barrier(6)

    def one_run():
        try:
            barrier.wait()
            run_dir, journal = storage_module.reserve_run(None, tmp_path, "cpu", {})
            storage_module.write_run(frame, {}, run_dir)
            journal.remove()
            reserved.append(run_dir)
        except Exception as error:  # collected: a thread's exception would vanish
            errors.append(error)

    threads = [threading.Thread(target=one_run) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert len(set(reserved)) == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in reserved)


# --- 4. exit codes: no false green ----------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "case_addition", "message"),
    [
        (None, {"backends": ["flex_attention"]}, "nothing was graded: "),
        (backends("flex_attention", "tlsim"), {}, "--backend flex_attention ran on no case"),
        (backends("cuda_only"), {}, "nothing was graded"),
    ],
)
def test_a_run_that_grades_nothing_or_skips_a_requested_backend_is_not_green(setup, capsys, extra, case_addition,
                                                                              message):  # fmt: skip
    write_cases(setup / "cases.toml", FIRST, SECOND, defaults={**TINY, **case_addition})
    out = setup / "run"
    assert run(setup, out, *(extra or [])) == 1
    assert message in capsys.readouterr().err
    assert out.is_dir(), "the report is still written"


def test_an_internal_bug_is_exit_3_with_a_traceback_not_bad_input(setup, capsys, monkeypatch):
    from harness.cli import terminal

    def bug(frame):
        raise ValueError("an internal bug")

    monkeypatch.setattr(terminal, "summarize", bug)
    assert run(setup, setup / "run", *backends("tlsim")) == 3
    err = capsys.readouterr().err
    assert "Traceback" in err and "ValueError: an internal bug" in err and "internal error" in err


@pytest.mark.slow  # runs in fresh interpreters, one stopped
def test_sigterm_during_the_final_write_leaves_no_partial_folder_and_keeps_the_journal(setup, capsys, monkeypatch):
    from harness.results import report
    from harness.run.guard import Terminated

    def terminated_while_rendering(*args):
        raise Terminated  # what the SIGTERM handler raises, arriving while the folder is written

    out = setup / "reports" / "run"
    with monkeypatch.context() as patch:
        patch.setattr(report, "render_html", terminated_while_rendering)
        assert run(setup, out, *backends("tlsim")) == 143
    assert f"finish with: python -m harness run --resume {out}" in capsys.readouterr().err
    assert sorted(p.name for p in out.parent.iterdir()) == ["run.journal.jsonl"], "no partial folder"
    fresh_registry()
    assert main(["run", "--resume", str(out), "--no-progress", "--plugin", str(setup / "faulty_plugin.py")]) == 0
    assert len(rows_of(out)) == 2


@pytest.mark.parametrize("isolate", ["plugins", "none"])
@pytest.mark.slow  # a run in a fresh interpreter waits in a hanging call
def test_the_users_ctrl_c_stops_a_run_inside_a_hanging_call_and_keeps_the_journal(setup, isolate):
    """A terminal's Ctrl-C while `hangs` runs is exit 130 within seconds, journal kept, no error row for `hangs`."""
    import time

    out = setup / "reports" / "run"
    command = [sys.executable, "-m", "harness", "run", str(setup / "cases.toml"), "--out", str(out), "--no-timing",
               "--no-progress", "--plugin", str(setup / "faulty_plugin.py"), "--isolate", isolate,
               *backends("tlsim", "hangs")]  # fmt: skip
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HARNESS_TEST_DIR": str(setup)}, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            try:  # the run may have created the journal and not yet written its header line
                if journal_path(out).exists() and len(Journal.read(journal_path(out)).rows) >= 1:
                    break
            except JournalError:
                pass
            time.sleep(0.2)
        time.sleep(2)  # the worker is now inside `hangs`
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-2000:]
    assert f"interrupted: 1 rows kept in {journal_path(out)}" in err
    assert [r["backend"] for r in Journal.read(journal_path(out)).rows] == ["tlsim"]


def test_isolate_all_runs_the_built_ins_in_the_worker_too(setup, capsys, monkeypatch):
    from harness.run import runner

    def no_local_call(*args, **kwargs):
        raise AssertionError("a built-in ran in-process under --isolate all")

    # The driver's own name for calling a backend (a spawned worker imports its own, unpatched copy): an
    # in-process call would raise here. The driver still builds the oracle and grades: that is its job.
    monkeypatch.setattr(runner, "call_backend", no_local_call)
    out = setup / "run"
    assert main(["run", str(setup / "cases.toml"), "--out", str(out), "--no-timing", "--no-progress",
                 "--isolate", "all", *backends("tlsim", "reference")]) == 0  # fmt: skip
    assert set(rows_of(out)["status"]) == {"pass"} and len(rows_of(out)) == 4
