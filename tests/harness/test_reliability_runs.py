"""No backend ends the run, no run is lost, no false green; a run's files are data, never code."""

from __future__ import annotations

import datetime
import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from harness.backends import builtin as backends_module
from harness.cli import terminal
from harness.cli.main import main
from harness.cli.options import apply_threads
from harness.execute.output import captured_output
from harness.results import report
from harness.results import storage as storage_module
from harness.results.journal import Journal, journal_path
from harness.review import confirm
from harness.run.guard import Terminated
from harness.run.runner import to_frame
from tests.fresh_python import ROOT
from tests.harness import review_frames as rf
from tests.tiny_cases import write_cases

HEAD = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()

FIRST, SECOND = {"name": "first"}, {"name": "second", "seed": 1}

EVIL = """
from pathlib import Path
Path({marker!r}).write_text("imported")
"""

# On PYTHONPATH, a sitecustomize that makes a spawned worker sleep at start, before any harness code runs.
SLOW_WORKER_START = """
import os, sys, time
if "--multiprocessing-fork" in sys.argv:
    open(os.path.join(os.environ["HARNESS_TEST_DIR"], "starting"), "w").write(str(os.getpid()))
    time.sleep(120)
"""

_BUILT_IN = dict(backends_module.REGISTRY)


def fresh_registry():
    """What a new process has: the built-ins only (a resume in the same test re-imports the plugin)."""
    backends_module.REGISTRY.clear()
    backends_module.REGISTRY.update(_BUILT_IN)


@pytest.fixture(autouse=True)
def built_ins_only(clean_registry):
    fresh_registry()  # each test starts with the built-ins only; those registered here vanish after it


@pytest.fixture
def setup(tmp_path, plugin, case_file):
    """tmp_path holding cases.toml (first, second), tiny.toml, plugin.py (logging here) and evil.py."""
    write_cases(tmp_path / "cases.toml", FIRST, SECOND)
    (tmp_path / "evil.py").write_text(EVIL.format(marker=str(tmp_path / "evil_ran")))
    return tmp_path


def run_argv(setup, cases, out, *extra, plugin=True) -> list[str]:
    """``run`` of ``setup / cases`` into ``out``, untimed, with plugin.py unless ``plugin`` is False."""
    plugged = ["--plugin", str(setup / "plugin.py")] if plugin else []
    return ["run", str(setup / cases), "--out", str(out), "--no-progress", "--no-timing", *plugged, *map(str, extra)]


def run(setup, out, *extra, cases="cases.toml", plugin=True) -> int:
    return main(run_argv(setup, cases, out, *extra, plugin=plugin))


def resume_run(setup, out) -> int:
    """``run --resume`` in what a new process has: the built-ins, the plugin given again."""
    fresh_registry()
    return main(["run", "--resume", str(out), "--no-progress", "--plugin", str(setup / "plugin.py")])


def backends(*names):
    return [arg for name in names for arg in ("--backend", name)]


def _harness(setup, cases, out, *extra, env=()):
    """`python -m harness` running :func:`run_argv` in a new session (a killed test leaves nothing behind)."""
    command = [sys.executable, "-m", "harness", *run_argv(setup, cases, out, *extra)]
    env = {**os.environ, "HARNESS_TEST_DIR": str(setup), "TRITON_INTERPRET": "1", **dict(env)}
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip


def _finish(proc, timeout=240):
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _gone(pid: int, seconds: float = 0) -> bool:
    """No such process, or a zombie (dead, waiting for whoever adopted it to reap it), within ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z" or time.monotonic() >= deadline:
            return state == "Z"
        time.sleep(0.1)


def _wait_for(path: Path, proc, seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.2)


def _ctrl_c_once(started: Path, proc) -> str:
    """A terminal's Ctrl-C (SIGINT to the whole process group) once ``started`` exists; the run's stderr."""
    try:
        _wait_for(started, proc)
        os.killpg(proc.pid, signal.SIGINT)
        return proc.communicate(timeout=60)[1]
    finally:
        _finish(proc, 30)


@pytest.mark.slow  # workers crash and one hangs past its limit
def test_exit_segfault_hang_and_sys_exit_in_a_plugin_are_error_rows_and_the_run_goes_on(setup, capsys):
    """Case 'first' limits a call to 4 s (timeout_s); 'second' runs only `hangs`, which is hung by then."""
    write_cases(setup / "cases.toml", {**FIRST, "timeout_s": 4.0}, {**SECOND, "backends": ["hangs"]})
    out = setup / "reports" / "run"
    code = run(setup, out, "--timeout", "2", *backends("os_exit", "segfault", "hangs", "sys_exit", "good", "tlsim"))
    assert code == 1
    by_pair = pd.read_parquet(out / "results.parquet").set_index(["case", "backend"])
    rows = by_pair.loc["first"]
    assert rows.loc["os_exit", "status"] == "error" and "exited with code 0" in rows.loc["os_exit", "reason"]
    assert rows.loc["segfault", "status"] == "error" and "killed by SIGSEGV" in rows.loc["segfault", "reason"]
    assert rows.loc["hangs", "status"] == "error" and "timed out after 4 s" in rows.loc["hangs", "reason"]
    assert rows.loc["sys_exit", "status"] == "error" and rows.loc["sys_exit", "reason"].startswith("SystemExit")
    assert rows.loc["good", "status"] == "pass", "an isolated call after three deaths runs in a fresh worker"
    assert rows.loc["tlsim", "status"] == "pass"
    hung = by_pair.loc[("second", "hangs")]
    assert (hung["status"], hung["reason"]) == ("skip", "hung on first after 4 s; not run")


def _disk_full(self, *args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _terminated(*args):
    raise Terminated  # what the SIGTERM handler raises, arriving while the folder is written


# how the run stops -> (the backend beside `good`, what is patched, the exit, its words, the pairs a resume runs,
# what the reports folder holds then: never the run folder, nor a partial one)
STOPS = {
    "sigterm_mid_run": ("sigterm_once", None, 143,
                        ["terminated (SIGTERM): 1 rows kept in {journal}", "python -m harness run --resume {out}"], 3,
                        ["run.journal.jsonl", "run.logs"]),
    "disk_full_at_the_final_write": ("tlsim", (pd.DataFrame, "to_parquet", _disk_full), 3,
                                     ["writing the run folder", "No space left on device",
                                      "the 4 rows are kept in {journal}", "--resume {out}"], 0, ["run.journal.jsonl"]),
    "sigterm_at_the_final_write": ("tlsim", (report, "render_html", _terminated), 143,
                                   ["finish with: python -m harness run --resume {out}"], 0,
                                   ["run.journal.jsonl", "run.logs"]),
}  # fmt: skip


@pytest.mark.parametrize("stop", STOPS)
def test_a_stopped_run_or_failed_final_write_keeps_its_journal_resume_runs_the_rest(setup, capsys, monkeypatch, stop):
    other, patched, code, said, to_run, left = STOPS[stop]
    (setup / "sigterm").touch()
    out = setup / "reports" / "run"
    with monkeypatch.context() as patch:
        if patched:
            patch.setattr(*patched)
        assert run(setup, out, "--isolate", "none", *backends("good", other)) == code
    err = capsys.readouterr().err
    assert all(words.format(journal=journal_path(out), out=out) in err for words in said), err
    assert sorted(p.name for p in out.parent.iterdir()) == left
    assert len(Journal.read(journal_path(out)).rows) == 4 - to_run
    assert resume_run(setup, out) == 0
    assert f"{to_run} to run, {4 - to_run} from the journal" in capsys.readouterr().err
    rows = pd.read_parquet(out / "results.parquet")
    pairs = [(case, backend) for case in ("first", "second") for backend in ("good", other)]
    assert list(zip(rows["case"], rows["backend"], strict=True)) == pairs and set(rows["status"]) == {"pass"}
    assert (setup / "calls").read_text().count("call") == 2, "no journaled pair ran again"
    assert not journal_path(out).exists(), "the journal goes once the folder is written"


@pytest.mark.slow  # runs in fresh interpreters, one killed
def test_a_sigkilled_run_is_reported_at_the_next_run_and_resumed(setup, capsys):
    (setup / "sigkill").touch()
    reports = setup / "reports"
    out = reports / "killed"
    proc = _harness(setup, "cases.toml", out, "--isolate", "none", *backends("good", "sigkill_once"))
    _, err = _finish(proc, 300)
    assert proc.returncode == -signal.SIGKILL, err[-2000:]
    assert [r["backend"] for r in Journal.read(journal_path(out)).rows] == ["good"]
    partial = rf.partial(reports, "gone")  # with write_run's marker
    (partial / "results.csv").write_text("half")
    assert run(setup, reports / "next", "--backend", "tlsim", plugin=False) == 0
    err = capsys.readouterr().err
    assert f"unfinished run: 1 rows in {journal_path(out)}" in err
    assert f"finish it with: python -m harness run --resume {out}" in err
    assert f"removed {partial}: a run (pid {partial.name.rsplit('-', 1)[1]}) died while writing it" in err
    assert not partial.exists()
    assert resume_run(setup, out) == 0
    assert len(pd.read_parquet(out / "results.parquet")) == 4 and not journal_path(out).exists()


def test_runs_started_at_the_same_second_get_distinct_folders(tmp_path, monkeypatch):
    frozen = SimpleNamespace(now=lambda tz=None: datetime.datetime(2026, 1, 1, tzinfo=tz))
    monkeypatch.setattr(storage_module, "datetime", frozen)
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
    barrier = threading.Barrier(6)

    def one_run(_):
        barrier.wait()
        run_dir, journal = storage_module.reserve_run(None, tmp_path, "cpu", {})
        storage_module.write_run(frame, {}, run_dir)
        journal.remove()
        return run_dir

    with ThreadPoolExecutor(6) as pool:
        reserved = list(pool.map(one_run, range(6)))  # raises a thread's exception
    assert len(set(reserved)) == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in reserved)


def test_an_internal_bug_is_exit_3_with_a_traceback_not_bad_input(setup, capsys, monkeypatch):
    def bug(frame):
        raise ValueError("an internal bug")

    monkeypatch.setattr(terminal, "summarize", bug)
    assert run(setup, setup / "run", *backends("tlsim"), plugin=False) == 3
    err = capsys.readouterr().err
    assert "Traceback" in err and "ValueError: an internal bug" in err and "internal error" in err


@pytest.mark.parametrize("isolate", ["plugins", "none"])
@pytest.mark.slow  # a run in a fresh interpreter waits in a hanging call
def test_the_users_ctrl_c_stops_a_run_inside_a_hanging_call_and_keeps_the_journal(setup, isolate):
    """A terminal's Ctrl-C while `hangs` runs is exit 130 within seconds, journal kept, no error row for `hangs`."""
    out = setup / "reports" / "run"
    proc = _harness(setup, "cases.toml", out, "--isolate", isolate, *backends("tlsim", "hangs"))
    err = _ctrl_c_once(setup / "worker.pid", proc)  # `hangs` has begun: tlsim's row is journaled
    assert proc.returncode == 130, err[-2000:]
    assert f"interrupted: 1 rows kept in {journal_path(out)}" in err
    assert [r["backend"] for r in Journal.read(journal_path(out)).rows] == ["tlsim"]


# compare --confirm of two runs (``backend`` 1.5x slower) whose meta.json names a plugin, or a commit that is no commit
# id: (backend, meta.json's fields, the words): exit 2 before any plugin is imported or `git worktree add` is run
META_REFUSED = {
    "a_plugin_named_in_its_command": ("evil_backend", {"commit": HEAD, "command": "python -m harness run tiny.toml "
                                      "--plugin {evil}"}, ["{new}/meta.json names plugin(s) {evil}", "pass --plugin {evil}"]),
    "an_option_as_its_commit": ("reference", {"commit": "--no-checkout"}, ["{base}/meta.json: field 'commit'"]),
    "an_id_of_no_commit": ("reference", {"commit": "deadbeef" * 5}, ["{base}/meta.json: field 'commit'"]),
    "a_list_as_its_commit": ("reference", {"commit": ["a" * 40]}, ["{base}/meta.json: field 'commit'"]),
}  # fmt: skip


@pytest.mark.parametrize("name", META_REFUSED)
def test_confirm_imports_no_plugin_a_meta_names_and_checks_out_only_commit_ids(setup, capsys, monkeypatch, name):
    backend, fields, said = META_REFUSED[name]
    monkeypatch.chdir(ROOT)  # git runs here
    added = []  # commits handed to `git worktree add`: none may be, the checks come first
    monkeypatch.setattr(confirm, "worktree", lambda commit, *rest: added.append(commit))
    evil, rng = setup / "evil.py", np.random.default_rng(0)
    fields = {k: v.format(evil=evil) if k == "command" else v for k, v in fields.items()}
    meta = rf.meta(case_files=[str(setup / "tiny.toml")], timing_threads=1, **fields)
    base, new = (rf.write(pd.DataFrame([rf.row("tiny", backend, us, rng)]), meta, setup / name)
                 for name, us in (("base", 300.0), ("new", 450.0)))  # fmt: skip
    assert main(["compare", str(base), str(new), "--confirm", "slower"]) == 2
    err = capsys.readouterr().err
    assert all(words.format(base=base, new=new, evil=evil) in err for words in said), err
    assert added == [] and not (setup / "evil_ran").exists(), "a plugin named by meta.json was imported"


def test_resume_imports_a_journals_plugin_given_again_with_plugin_by_any_spelling(setup, monkeypatch):
    out = setup / "run"
    rf.journal(out, setup / "tiny.toml", plugins=[str(setup / "evil.py")], isolate="none")  # imported in this process
    monkeypatch.chdir(setup)  # the same file by another spelling: matched by its resolved path
    assert main(["run", "--resume", str(out), "--no-progress", "--plugin", "./evil.py"]) == 0
    assert (setup / "evil_ran").exists(), "given with --plugin, it is imported"


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
    assert run(setup, done, "--backend", "tlsim", cases="tiny.toml", plugin=False) == 0
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


def test_an_isolated_worker_dies_with_its_sigkilled_parent(setup):
    proc = _harness(setup, "tiny.toml", setup / "run", "--backend", "hangs")
    try:
        _wait_for(setup / "worker.pid", proc)
        worker = int((setup / "worker.pid").read_text())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert _gone(worker, 10), f"worker {worker} outlived its SIGKILLed parent"
    finally:
        _finish(proc, 30)
        if (setup / "worker.pid").exists() and not _gone(int((setup / "worker.pid").read_text())):
            os.kill(int((setup / "worker.pid").read_text()), signal.SIGKILL)


def test_profile_of_a_plugin_that_calls_os_exit_cannot_end_the_run(setup, capsys):
    out = setup / "run"
    code = run(setup, out, *backends("os_exit", "reference"), "--profile", "tiny:os_exit", "--profile", "tiny:reference",
               cases="tiny.toml")  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1, err[-3000:]  # the os_exit row is an error; the profile did not end the run with 0
    assert "profile: tiny:os_exit failed: the worker process exited with code 0" in err, err[-3000:]
    assert (out / "profiles" / "tiny__reference.trace.json").exists(), "the other pair is still profiled"
    rows = pd.read_parquet(out / "results.parquet").set_index("backend")
    assert rows.loc["os_exit", "status"] == "error" and rows.loc["reference", "status"] == "pass"


def test_an_isolated_workers_flood_goes_to_its_row_log_and_a_worker_runs_with_the_thread_count_its_rows_record(
    setup, capsys
):
    """One timed run: ``flood``'s output reaches its row's log and the terminal gets its head; ``threads`` (in its
    worker) runs with the --threads its row records."""
    out = setup / "run"
    assert main(["run", str(setup / "tiny.toml"), "--out", str(out), "--no-progress", "--threads", "1",
                 "--plugin", str(setup / "plugin.py"), *backends("flood", "threads", "tlsim")]) == 0  # fmt: skip
    captured = capsys.readouterr()
    log = out / "logs" / "tiny__flood.log"
    assert log.stat().st_size >= 100_000 and log.read_text().count("o") >= 50_000
    assert f"more bytes not shown: see {log}" in captured.err
    assert len(captured.err) + len(captured.out) < 8_000, "the flood reached the terminal"
    assert sorted(p.name for p in (out / "logs").iterdir()) == ["tiny__flood.log"], "silent rows leave no log"
    assert not (setup / "run.logs").exists()
    recorded = pd.read_parquet(out / "results.parquet").set_index("backend")["timing_threads"]
    assert recorded["threads"] == 1 and (setup / "threads").read_text() == "1"
    before = torch.get_num_threads()
    try:  # a recorded thread count past the cores runs on the cores
        assert apply_threads(str(10**6), "cpu") == (os.cpu_count() or 1)
        assert apply_threads("1", "cpu") == 1
    finally:
        torch.set_num_threads(before)


def test_ctrl_c_while_a_worker_starts_is_one_line_not_a_childs_traceback(setup):
    (setup / "site").mkdir()
    (setup / "site" / "sitecustomize.py").write_text(SLOW_WORKER_START)
    path = os.pathsep.join(filter(None, [str(setup / "site"), os.environ.get("PYTHONPATH")]))
    proc = _harness(setup, "tiny.toml", setup / "run", env={"PYTHONPATH": path})
    err = _ctrl_c_once(setup / "starting", proc)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert [line for line in err.splitlines() if line.strip()] == ["interrupted: nothing was written"], err
    assert _gone(int((setup / "starting").read_text()), 10)


def test_a_planted_link_in_a_runs_log_folder_is_replaced_never_written_through(tmp_path):
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
