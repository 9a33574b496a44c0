"""Every way the CLI refuses, as one table: exit code and words; no traceback, no work begun, no file written."""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from harness.cases.packaged import packaged_suites
from harness.cli.main import main
from tests.fresh_python import git_in
from tests.harness import review_frames as rf
from tests.tiny_cases import write_cases


@dataclass(frozen=True)
class Refusal:
    """A refused command: ``argv`` (or built under ``tmp``), ``words`` it prints, ``patch`` applied after."""

    name: str
    argv: list[str] | Callable[[Path, Path], list[str]]
    exit: int
    words: tuple[str, ...] = ()
    patch: Callable[[pytest.MonkeyPatch, Path], None] | None = None


def _bad(verb: str, alone: str, run: str, **changes):
    """``verb`` of ``run`` and its copy tmp/bad with ``changes``; of the copy alone if ``verb`` is ``alone``."""

    def make(runs: Path, tmp: Path) -> list[str]:
        bad = rf.copy_run(runs / run, to=tmp / "bad", **changes)
        return [verb, str(bad)] if verb == alone else [verb, str(runs / run), str(bad)]

    return make


def _folder(files: dict[str, Path | str | bytes], verb: str = "history"):
    """A folder ``tmp/folder`` holding ``files`` (a run's file by its name, text or bytes), after a good run."""

    def make(runs: Path, tmp: Path) -> list[str]:
        folder = tmp / "folder"
        folder.mkdir()
        for name, content in files.items():
            if isinstance(content, Path):
                shutil.copy(runs / content / name, folder / name)
            else:
                (folder / name).write_bytes(content if isinstance(content, bytes) else content.encode())
        return [verb, str(folder)] if verb == "report" else [verb, str(runs / "untimed"), str(folder)]

    return make


def _run_args(out: str, *extra: str, case: dict | None = None, plugin: str | None = None):
    """``run`` of one case into ``tmp/out`` (a folder, dangling link, finished run, under a file or a path)."""

    def make(runs: Path, tmp: Path) -> list[str]:
        cases = write_cases(tmp / "cases.toml", case or {"name": "tiny"})
        target = tmp / "out"
        if out == "dangling":
            target.symlink_to(tmp / "nowhere")
        elif out == "done":
            shutil.copytree(runs / "untimed", target)
        elif out == "under a file":
            target.write_text("")
            target = target / "run"
        elif out != "folder":
            target = Path(out)
        plugged = []
        if plugin is not None:
            (tmp / "plugin.py").write_text(plugin)
            plugged = ["--plugin", str(tmp / "plugin.py")]
        return ["run", str(cases), "--out", str(target), "--backend", "reference", "--no-progress", *plugged, *extra]

    return make


def _runs_pair(base: str, new: str, verb: str = "compare", *extra: str):
    return lambda runs, tmp: [verb, str(runs / base), str(runs / new), *extra]


def _compare(**made):
    """compare of tmp/base and tmp/new, each made by its function of the folder in ``made`` (absent when not)."""

    def make(runs: Path, tmp: Path) -> list[str]:
        for side, fill in made.items():
            fill(tmp / side)
        return ["compare", str(tmp / "base"), str(tmp / "new")]

    return make


def _meta_only(folder: Path) -> None:
    folder.mkdir()
    (folder / "meta.json").write_text(json.dumps(rf.meta()))


def _doubled(folder: Path) -> None:
    rf.write(rf.frame(num_cases=1).pipe(lambda f: pd.concat([f, f.iloc[:1]])), rf.meta(), folder)


NO_SUCH, NO_ROWS = "{tmp}/%s: not a run folder (no such folder)", "{tmp}/%s: not a run folder (no results.parquet)"


def _resume(*extra: str, rows=(), **options):
    """``run --resume tmp/run`` of a stopped journal (``rows``, ``options``); tmp/mine.py is a plugin to name."""

    def make(runs: Path, tmp: Path) -> list[str]:
        (tmp / "mine.py").write_text("from pathlib import Path\nPath(__file__).with_name('imported').touch()\n")
        options_ = {key: [v.format(tmp=tmp) for v in value] if isinstance(value, list) else value
                    for key, value in options.items()}  # fmt: skip
        rf.journal(tmp / "run", write_cases(tmp / "tiny.toml", {"name": "tiny"}), rows, **options_)
        return ["run", "--resume", str(tmp / "run"), "--no-progress", *extra]

    return make


def _merge(second: str, out: str = "merged", **meta_changes):
    """merge of the untimed run and a second: a copy, nowhere, or a run with its case renamed and ``meta_changes``."""

    def make(runs: Path, tmp: Path) -> list[str]:
        first = rf.copy_run(runs / "untimed", to=tmp / "first")
        if second == "itself":
            other = rf.copy_run(runs / "untimed", to=tmp / "other")
        elif second == "nowhere":
            other = tmp / "nowhere"
        else:
            other = rf.copy_run(runs / second, meta_changes, lambda f: f.assign(case="other"), to=tmp / "other")
        return ["merge", str(tmp / out) if out != "first" else str(first), str(first), str(other)]

    return make


def _sized(limit: str, value: int):
    """A patch lowering the size limit harness.results.{limit} to ``value``, where pandas may read no parquet file."""

    def patch(monkeypatch: pytest.MonkeyPatch, tmp: Path) -> None:
        monkeypatch.setattr(f"harness.results.{limit}", value)
        monkeypatch.setattr(pd, "read_parquet", lambda *a, **k: pytest.fail("read before it was sized"))

    return patch


def _read_only_reports(monkeypatch: pytest.MonkeyPatch, tmp: Path) -> None:
    """tmp/reports, read-only; root writes anyway, so for root os.open answers there as the kernel answers a user."""
    (reports := tmp / "reports").mkdir()
    reports.chmod(0o555)
    real_open = os.open

    def read_only(path, flags, *args):
        if str(path).startswith(str(reports)) and flags & os.O_CREAT:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args)

    if os.geteuid() == 0:
        monkeypatch.setattr(os, "open", read_only)


BISECT = ["bisect", "HEAD~2", "HEAD", "--case", "c", "--backend", "tlsim"]


def _git(name: str, argv: list[str], *words: str) -> Refusal:
    """continuous or bisect, exit 2, in tmp/repo of three commits (HEAD~2, HEAD~1, HEAD)."""

    def make(runs: Path, tmp: Path) -> list[str]:
        git = git_in(tmp / "repo")
        for i in range(3):
            git("commit", "-q", "--allow-empty", "-m", str(i))
        return argv

    return Refusal(name, make, 2, words, patch=lambda monkeypatch, tmp: monkeypatch.chdir(tmp / "repo"))


FOREIGN = pd.DataFrame({"x": [1]}).to_parquet()  # a parquet file of no harness run
ELEVEN_ROWS = {"results.parquet": pd.DataFrame({"case": ["c"] * 11, "backend": "b", "status": "pass"}).to_parquet(),
               "meta.json": "{}"}  # fmt: skip
SMOKE = ["run", "smoke", "--backend", "reference", "--no-timing", "--no-progress", "--out", "{tmp}/out"]
META_FIELDS = {"commit": {"commit": 5}, "gpus[0].gpu_name": {"gpus": [{}]}, "ceilings": {"ceilings": "fast"}}
ROW_FAULTS = {
    "column 'latency_us'": lambda f: f.assign(latency_us=["12.5"] * len(f)),
    "column 'case'": lambda f: f.assign(case=list(range(len(f)))),
    "holds no rows": lambda f: f.iloc[:0],
}
BIG_CASE = {"name": "prefill_8k", "num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "seq_lens": [8192],
            "q_lens": [8192]}  # fmt: skip
BAD_K = {"decode and": "ends where a name was expected", "(decode": "'(' is never closed",
         "decode prefill": "'prefill' after a complete expression", "or decode": "'or' where a name was expected",
         "": "an empty expression"}  # fmt: skip
BAD_CASES = {"num_q_heads = 7": {"num_q_heads": 7}, "an unknown backend": {"backends": ["trtion"]},
             "a seed past 64 bits": {"seed": 10**20}, "a nan input_scale": {"input_scale": float("nan")}}  # fmt: skip
NARROW = (
    "from harness import register_backend\ndef narrow(q, k_cache, v_cache, block_table, seq_lens, "
    "query_start_loc=None):\n    return q\nregister_backend('narrow', narrow)\n"
)
BAD_IMPORTS = [
    ("os._exit", "import os\nos._exit(0)\n", "plugins", "exited with code 0 while importing"),
    ("a segfault", "import ctypes\nctypes.string_at(0)\n", "plugins", "killed by SIGSEGV while importing"),
    ("SystemExit in a worker", "raise SystemExit(0)\n", "plugins", "SystemExit"),
    ("SystemExit in process", "raise SystemExit(0)\n", "none", "importing it raised SystemExit(0)"),
    ("an exception", "x = 1\nraise RuntimeError('broken')\n", "plugins", "plugin.py: RuntimeError: broken (at plugin.py:2)"),
    ("an exception in process", "x = 1\nraise RuntimeError('b')\n", "none", "RuntimeError: b (at plugin.py:2)"),
    ("a kernel without out=", NARROW, "plugins", "backend 'narrow': narrow cannot be called as the kernel contract's "
     "fn(q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, scale=None, out=None): got an unexpected "
     "keyword argument 'out'"),
]  # fmt: skip
BAD_JOURNAL_ROWS = [
    ({"case": ["tiny"], "backend": "tlsim", "status": "pass"}, "'case'"),
    ({"case": "tiny", "backend": "tlsim", "status": "pass", "latency_us": "fast"}, "'latency_us'"),
    ({"case": "tiny", "backend": "tlsim", "status": "great"}, "'status'"),
    ([1, 2], "a list, not a JSON object"),
    ({"resumed_by": "me"}, "'resumed_by'"),
]
REFUSALS = [
    # --- run: cases, backends, plugins and options -------------------------------------------------
    *(Refusal(f"an unknown case name to {verb}", [verb, "smok", *(["--out", "{tmp}/out"] if verb == "run" else [])],
              2, ("smok: no such case file or folder, and not a packaged suite", *packaged_suites()))
      for verb in ("run", "list")),
    *(Refusal(f"-k {expression!r}", ["list", "smoke", "-k", expression], 2, (f"-k {expression!r}", words))
      for expression, words in BAD_K.items()),
    Refusal("a folder without case files", ["list", "{tmp}/empty"], 2, ("{tmp}/empty: a directory with no *.toml",),
            patch=lambda monkeypatch, tmp: (tmp / "empty").mkdir()),
    Refusal("-k matching nothing", ["list", "smoke", "-k", "nothing_is_called_this"], 2,
            ("matching -k 'nothing_is_called_this'",)),
    *(Refusal(f"a case file with {name}", _run_args("folder", "--no-timing", case={"name": "base", **fields}), 2,
              (f"error: {{tmp}}/cases.toml: case 'base': field '{next(iter(fields))}'",))
      for name, fields in BAD_CASES.items()),
    Refusal("an unknown backend", _run_args("folder", "--no-timing", "--backend", "nope"), 2,
            ("--backend nope: unknown backend; registered:", "once --plugin names its file")),
    Refusal("a backend's name mistyped", _run_args("folder", "--no-timing", "--backend", "tlsin"), 2,
            ("--backend tlsin: unknown backend; did you mean 'tlsim'?",)),
    Refusal("a plugin file named as a module", _run_args("folder", "--no-timing", "--plugin", "mine"), 2,
            ("--plugin mine: ModuleNotFoundError", "give its path: --plugin mine.py"),
            patch=lambda monkeypatch, tmp: (monkeypatch.chdir(tmp), (tmp / "mine.py").write_text(""))),
    Refusal("an absent plugin", _run_args("folder", "--no-timing", "--plugin", "{tmp}/absent.py"), 2, ("absent.py",)),
    *(Refusal(f"a plugin whose import ends in {name}", _run_args("folder", "--no-timing", "--isolate", isolate,
                                                                 plugin=body), 2, (words,))
      for name, body, isolate, words in BAD_IMPORTS),
    Refusal("a timeout of 0", _run_args("folder", "--timeout", "0"), 2,
            ("--timeout 0: must be a positive number of seconds",)),
    Refusal("a verify fraction past 1", _run_args("folder", "--verify-oracle-cache", "2"), 2,
            ("give a fraction in (0, 1]",)),
    Refusal("a case too large for memory", _run_args("folder", "--no-timing", case=BIG_CASE), 2,
            ("case 'prefill_8k': field 'seq_lens': too large for cpu memory",)),
    Refusal("a sweep limit that is not a number", ["list", "smoke"], 2, ("HARNESS_MAX_SWEEP_POINTS='lots'",),
            patch=lambda monkeypatch, tmp: monkeypatch.setenv("HARNESS_MAX_SWEEP_POINTS", "lots")),
    *(Refusal(f"--shard {text}", [*SMOKE, f"--shard={text}"], 2, ("give I/N",))
      for text in ("2/2", "1", "a/2", "0/0", "-1/3", "1/2/3")),
    Refusal("--workers none", [*SMOKE, "--workers", "none"], 2, ("--workers none",)),
    Refusal("--ray without Ray installed", [*SMOKE, "--ray"], 2, ("pip install 'paged-attention-harness[ray]'",),
            patch=lambda monkeypatch, tmp: monkeypatch.setitem(sys.modules, "ray", None)),
    # --- run: where it writes --------------------------------------------------------------------------
    Refusal("an --out that is a finished run", _run_args("done", "--no-timing"), 2, ("{tmp}/out: already exists",)),
    Refusal("an --out under a file", _run_args("under a file", "--no-timing"), 2, ("out is a file, not a folder",)),
    Refusal("a dangling symlink as --out", _run_args("dangling", "--no-timing"), 2, ("{tmp}/out: is a symbolic link",)),
    Refusal("an unwritable --out", _run_args("/proc/harness-cannot-write-here", "--no-timing"), 2, ("cannot",)),
    Refusal("an --out in a read-only folder", _run_args("{tmp}/reports/run", "--no-timing"), 2, ("Permission denied",),
            patch=_read_only_reports),
    # --- run --resume and --finalize ---------------------------------------------------------------------
    Refusal("a resume of a finished run", lambda runs, tmp: ["run", "--resume", str(runs / "untimed")], 2,
            ("already exists: that run is complete",)),
    Refusal("a resume without a journal", ["run", "--resume", "{tmp}/never"], 2, ("no journal here",)),
    Refusal("a resume given cases", ["run", "--resume", "{tmp}/never", "smoke"], 2,
            ("--resume runs the journal's own cases",)),
    Refusal("a resume given --shard", ["run", "--resume", "{tmp}/never", "--shard", "0/2"], 2, ("--shard",)),
    Refusal("--finalize without --resume", ["run", "--finalize"], 2, ("--finalize needs --resume",)),
    Refusal("a finalize of a journal that holds no row", _resume("--finalize"), 2, ("holds no row",)),
    *(Refusal(f"a resume given {' '.join(extra)}", _resume(*extra, timing=timing), 2,
              (extra[0], "differs from the run"))
      for extra, timing in ((["--device", "cuda"], False), (["--tag", "big"], False),
                            (["--oracle-device", "cuda"], False), (["-k", "decode"], False), (["--no-timing"], True))),
    *(Refusal(f"a journal row with {words}", _resume(rows=[line]), 2, ("{tmp}/run.journal.jsonl: line 2: ", words))
      for line, words in BAD_JOURNAL_ROWS),
    Refusal("a journal whose plugins are not a list", _resume("--plugin", "{tmp}/mine.py", plugins="/x/mine.py"),
            2, ("{tmp}/run.journal.jsonl: line 1: field 'options.plugins'",)),
    Refusal("a journal naming a plugin not given", _resume(plugins=["{tmp}/mine.py"]), 2,
            ("names plugin(s) {tmp}/mine.py", "pass --plugin {tmp}/mine.py")),
    Refusal("a plugin the run did not use", _resume("--plugin", "{tmp}/mine.py"), 2, ("the run did not use it",)),
    Refusal("a resume whose log folder is a link", _resume(), 2,
            ("{tmp}/run.logs is not the run's log folder (a link or a file)",),
            patch=lambda monkeypatch, tmp: (tmp / "elsewhere").mkdir() or (tmp / "run.logs").symlink_to(tmp / "elsewhere")),
    Refusal("a journal past its size limit, sized before it is read", ["run", "--resume", "{tmp}/stopped"], 2,
            ("{tmp}/stopped.journal.jsonl: 15 bytes, past the 4 a journal may hold",),
            patch=lambda monkeypatch, tmp: (tmp / "stopped.journal.jsonl").write_text('{"journal": 1}\n')
            and _sized("journal.MAX_BYTES", 4)(monkeypatch, tmp)),
    # --- compare, report, history: run folders that are not runs -------------------------------------------
    *(Refusal(f"meta {name} to {verb}", _bad(verb, "report", "untimed", meta_patch=patch), 2,
              (f"{{tmp}}/bad/meta.json: field '{name}'",))
      for name, patch in META_FIELDS.items() for verb in ("compare", "history", "report")),
    *(Refusal(f"results {words} to {verb}", _bad(verb, "history", "timed", frame_fn=fault), 2,
              (f"{{tmp}}/bad/results.parquet: {words}",))
      for words, fault in ROW_FAULTS.items() for verb in ("compare", "history")),
    Refusal("an untouched run to compare", _runs_pair("untimed", "untimed"), 0),
    Refusal("untouched runs to history", _runs_pair("untimed", "timed", "history"), 0),
    Refusal("an untimed new run", _runs_pair("timed", "untimed"), 4,
            ("1 graded row(s) timed in one run only (the new run was not timed",)),
    Refusal("an untimed base run", _runs_pair("untimed", "timed"), 4, ("the base run was not timed",)),
    Refusal("a folder that is not a run", _folder({"notes.txt": "hello"}), 2, ("{tmp}/folder: not a run folder",)),
    Refusal("a run folder without rows", _folder({"meta.json": Path("untimed")}), 2,
            ("{tmp}/folder: not a run folder (no results.parquet)",)),
    Refusal("a path that holds no run to history", ["history", "{tmp}/nothing"], 2, ("neither a run folder",)),
    Refusal("compare of two absent folders", _compare(), 2, (NO_SUCH % "base", NO_SUCH % "new")),
    Refusal("compare of absent and meta only", _compare(new=_meta_only), 2, (NO_SUCH % "base", NO_ROWS % "new")),
    Refusal("compare of meta only and absent", _compare(base=_meta_only), 2, (NO_ROWS % "base", NO_SUCH % "new")),
    Refusal("compare of doubled rows", _compare(base=_doubled, new=_doubled), 2,
            ("base run: duplicated (case, backend) rows: reference on case00",
             "new run: duplicated (case, backend) rows: reference on case00")),
    Refusal("a corrupt meta.json", _folder({"results.parquet": Path("untimed"), "meta.json": "{not json"}, "compare"),
            2, ("{tmp}/folder/meta.json: corrupt run metadata",)),
    Refusal("a parquet of no harness run", _folder({"results.parquet": FOREIGN, "meta.json": "{}"}, "compare"), 2,
            ("{tmp}/folder/results.parquet: not a harness results file: no column(s) case, backend, status",)),
    Refusal("a results.parquet past its row limit, sized before it is read", _folder(ELEVEN_ROWS, "report"), 2,
            ("{tmp}/folder/results.parquet: 11 rows, 0.0 GiB uncompressed: past the 10 rows",),
            patch=_sized("storage.MAX_ROWS", 10)),
    Refusal("a meta.json past its size limit", _folder(ELEVEN_ROWS, "report"), 2,
            ("{tmp}/folder/meta.json: 2 bytes, past the 1 a meta.json may hold",), patch=_sized("storage.MAX_META_BYTES", 1)),
    Refusal("a results.parquet of text to report", _folder({"results.parquet": "text", "meta.json": "{}"}, "report"),
            2, ("not a readable parquet file",)),
    # --- compare's options --------------------------------------------------------------------------------
    Refusal("--json naming a folder", _runs_pair("untimed", "untimed", "compare", "--json", "{tmp}"), 2,
            ("a folder; give a file to write",)),
    Refusal("too few --confirm-rounds", ["compare", "{tmp}/none", "{tmp}/none", "--confirm", "all",
                                         "--confirm-rounds", "8"], 2, ("--confirm-rounds 8: at least 9 rounds",)),
    Refusal("--confirm with --no-confirm", ["compare", "{tmp}", "{tmp}", "--confirm", "all", "--no-confirm"], 2,
            ("choose one",)),
    # --- merge ----------------------------------------------------------------------------------------------
    Refusal("a merge of overlapping runs", _merge("itself"), 2, ("also in",)),
    Refusal("a merge of two commits", _merge("untimed", commit="f" * 40), 2, ("different commits",)),
    Refusal("a merge of two devices", _merge("untimed", device="cuda"), 2, ("different devices",)),
    Refusal("a merge of a timed and an untimed run", _merge("timed"), 2, ("not timed",)),
    Refusal("a merge of a folder that is not a run", _merge("nowhere"), 2, ("not a run folder",)),
    Refusal("a merge into an existing folder", _merge("untimed", out="first"), 2, ("already exists",)),
    # --- continuous and bisect ------------------------------------------------------------------------------
    _git("continuous of no commit", ["continuous", "no-such-ref"],
         "BASE 'no-such-ref': not a commit of this repository"),
    _git("continuous of an unknown option", ["continuous", "--help-me"]),
    _git("continuous of one commit twice", ["continuous", "HEAD", "HEAD"], "are the same commit"),
    _git("bisect of a BAD before GOOD", ["bisect", "HEAD", "HEAD~2", *BISECT[3:]], "is not an ancestor of BAD"),
    _git("bisect of an unknown backend", [*BISECT[:-1], "nope"], "--backend nope: unknown backend"),
    _git("bisect of an unknown case", [*BISECT[:4], "nope", *BISECT[5:]], "--case nope: no such case"),
    _git("bisect of too few rounds", [*BISECT, "--rounds", "3"], "--rounds 3: at least"),
]  # fmt: skip


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``folder`` with its size and mtime, less the bytecode Python caches on importing a plugin."""
    return {
        str(p): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in folder.rglob("*") if "__pycache__" not in p.parts
    }


@pytest.mark.usefixtures("clean_registry")
@pytest.mark.parametrize("refusal", REFUSALS, ids=lambda r: r.name)
def test_a_refused_command_gets_its_exit_code_and_says_why_before_any_work(refusal, runs, tmp_path, monkeypatch,
                                                                          capsys):  # fmt: skip
    """No case runs, no inputs are built, nothing under the folder is written or changed, no traceback."""
    from harness.cases import inputs
    from harness.execute import local
    from harness.run import runner

    def work(*args, **kwargs):
        raise AssertionError("work began on a refused command")

    args = refusal.argv if isinstance(refusal.argv, list) else refusal.argv(runs, tmp_path)
    args = [arg.format(tmp=tmp_path) for arg in args]
    for module, name in ((local, "run_cases"), (inputs, "make_inputs"), (runner, "make_inputs")):
        monkeypatch.setattr(module, name, work)
    if refusal.patch is not None:
        refusal.patch(monkeypatch, tmp_path)
    before = _files(tmp_path)
    try:
        code = main(args)
    except SystemExit as stop:  # argparse's refusals
        code = stop.code
    out, err = capsys.readouterr()
    assert code == refusal.exit, out + err
    for words in refusal.words:
        assert words.format(tmp=tmp_path) in out + err, out + err
    assert "Traceback" not in err
    assert _files(tmp_path) == before
