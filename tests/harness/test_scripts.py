"""Every script in scripts/ runs here in a dry mode, so none can rot unnoticed."""

from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
import sys
import types
from pathlib import Path

import pandas as pd
import pytest

import kernels
from tests.fresh_python import ROOT, run_script
from tests.tiny_cases import write_cases

COMMITTED_RUN = ROOT / "tests" / "harness" / "data" / "h200_run"
PHASES = ROOT / "tests" / "harness" / "data" / "gpu_run_phases"
SMALL = {"num_q_heads": 2, "num_kv_heads": 1, "head_dim": 32, "seq_lens": [5, 9]}  # the scripts' dry-run cases
TIMED = {"slower", "faster", "same", "cannot tell"}  # the verdicts of a case kernel_ab timed
ONE_REP = {"min_reps": 1, "max_reps": 1}
# kernel_targets on the committed run, given once or twice: a case counts once, from the first run that has it
PREFILL_MISSED = "## prefill: met on 0 of 6 cases (worst 2.29 x best peer)"


@pytest.fixture(autouse=True)
def triton_entry_restored(monkeypatch):
    """kernel_ab binds kernels.paged_attention_triton to a side's kernel: the test's binding goes with it."""
    monkeypatch.setattr(kernels, "paged_attention_triton", kernels.paged_attention_triton)


@pytest.fixture
def kernel_ab():
    """scripts.kernel_ab; after the test, none of the base revision's modules it served is left in sys.modules."""
    from scripts import kernel_ab

    yield kernel_ab
    kernel_ab.remove_modules()
    assert not [name for name in sys.modules if name.startswith("kernels._ab")]


@pytest.fixture
def in_process(monkeypatch, capsys):
    """``in_process(*command)``: ``python COMMAND`` run in process as a fresh interpreter would: (code, out, err)."""

    def run(*command: str) -> tuple[int, str, str]:
        module, args = (command[1], command[2:]) if command[0] == "-m" else (None, command[1:])
        monkeypatch.chdir(ROOT)
        monkeypatch.setattr(sys, "argv", [module or command[0], *args])
        monkeypatch.setattr(sys, "path", [str(ROOT if module else (ROOT / command[0]).parent), *sys.path])
        code = 0
        try:
            runpy.run_module(module, run_name="__main__") if module else runpy.run_path(command[0], run_name="__main__")
        except SystemExit as stop:
            code = stop.code
        if isinstance(code, str):  # sys.exit(text) prints the text and exits 1, as Python does
            code = print(code, file=sys.stderr) or 1
        return code or 0, *capsys.readouterr()

    return run


# Every script, but the noise check's plugin (a --plugin module, not a command).
TOOLS = sorted(
    str(p.relative_to(ROOT / "scripts"))
    for p in (ROOT / "scripts").rglob("*")
    if p.suffix in (".py", ".sh") and p.name != "slowdown_plugin.py"
)


@pytest.mark.parametrize("tool", TOOLS)
def test_each_script_answers_help_with_its_usage(tool, in_process):
    if tool.endswith(".sh"):
        parsed = subprocess.run(["bash", "-n", f"scripts/{tool}"], cwd=ROOT, capture_output=True, text=True)
        assert parsed.returncode == 0, parsed.stderr
        done = subprocess.run(
            ["bash", f"scripts/{tool}", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        code, out, err = done.returncode, done.stdout, done.stderr
    else:
        code, out, err = in_process(f"scripts/{tool}", "--help")
    assert code == 0, err
    assert f"scripts/{tool}" in out or "usage:" in out, out


def test_every_script_is_exercised_here():
    """scripts/ holds the kernel developer's tools, scripts/self/ the harness's measurements of itself."""
    exercised = {"tune_tiles.py", "kernel_targets.py", "kernel_ab.py", "gpu_run.sh", "gpu_wheels.sh"}
    exercised |= {"mutants.py", "mutants.toml", "generate_mutants.py"}  # tests/kernels/test_mutants.py, below
    exercised |= {"sass_census.py"}  # tests/kernels/test_kernel_compiles_for_sm90.py
    exercised |= {"flashinfer_warmup.py"}  # tests/harness/test_flashinfer_peer.py
    selves = ("peer_table", "measure_tlsim_closeness", "noise_check", "slowdown_plugin", "host_overhead", "gpu_phases")
    exercised |= {f"self/{name}.py" for name in selves} | {"self/gpu_scale.sh"}
    exercised |= {"self/compare_targets.py", "self/scale_table.py"}  # tests/harness/test_scale_gpus_and_resume.py
    scripts = ROOT / "scripts"
    present = {
        p.relative_to(scripts).as_posix() for p in scripts.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    }
    assert present <= exercised, "a new script needs a dry run here"


def test_generated_mutants_are_a_catalogue_whose_every_mutant_applies_under_its_own_id(tmp_path):
    catalogue = tmp_path / "generated.toml"
    done = run_script("scripts/generate_mutants.py", "--out", str(catalogue))
    assert done.returncode == 0, done.stderr
    count = int(re.search(r"(\d+) generated mutants", done.stdout)[1])
    checked = run_script("scripts/mutants.py", "--check", "--catalogue", str(catalogue))
    assert checked.returncode == 0, checked.stdout + checked.stderr  # duplicate ids fail here
    assert f"{count}/{count} mutants apply" in checked.stdout
    sample = run_script("scripts/generate_mutants.py", "--sample", "12", "--seed", "3", "--out", str(catalogue))
    assert "sample of 12" in sample.stdout


def test_a_generated_mutant_inside_a_multi_line_statement_is_reached_when_the_statement_ran():
    is_reached = runpy.run_path(str(ROOT / "scripts" / "generate_mutants.py"))["is_reached"]
    reached = {"kernels/k.py": ({10, 20}, {30})}  # coverage.py's statements by first line: ran, missed
    verdicts = {
        line: is_reached({"id": f"gen-k-{line}-4-flip", "file": "kernels/k.py"}, reached) for line in (10, 12, 31)
    }
    assert verdicts == {10: True, 12: True, 31: False}  # 12 continues the statement at 10, 31 the one at 30
    assert not is_reached({"id": "gen-k-12-4-flip", "file": "kernels/other.py"}, reached)


def _tuned(out: str, tmp: Path) -> bool:
    """A TileConfig line follows the table's header, and the JSON written holds both candidates' records."""
    table = out.split("# kernels/tuning.py TUNED")[1]
    return "TileConfig(" in table and len(json.loads((tmp / "tune.json").read_text())["records"]) == 2


@pytest.mark.parametrize(
    ("command", "code", "said", "check"),
    [
        ("scripts/self/peer_table.py {run} --backend triton", 0, ["| prefill_4x4k | 2.28e+03 |", "sdpa_contiguous"],
         None),
        ("scripts/kernel_ab.py --dry --base no-such-revision", 2, ["git show no-such-revision"], None),
        ("scripts/kernel_targets.py {run}", 0, [PREFILL_MISSED, "ok   decode_4x16k", "MISS decode_32x4k_hd64"], None),
        ("scripts/kernel_targets.py {run} {run}", 0, [PREFILL_MISSED, "## eager: met on 0 of 14 cases"], None),
        ("scripts/self/measure_tlsim_closeness.py --limit 2", 0, [],
         lambda out, tmp: len([line for line in out.splitlines() if line.strip()]) == 3),  # a header, a line a case
        ("scripts/tune_tiles.py --dry --out {tmp}/tune.json", 0, [], _tuned),
        ("scripts/self/gpu_phases.py {phases}", 0, [],  # it reads the folder of a GPU run's stamps, writes nothing
         lambda out, tmp: out.strip() == (PHASES / "phases.txt").read_text().strip()),
        pytest.param("-m harness run {cases} --plugin scripts/self/slowdown_plugin.py --backend reference_slowable "
                     "--out {tmp}/run --no-timing --no-progress", 0, [], None, marks=pytest.mark.slow),  # a worker
    ],
    ids=["peer_table", "kernel_ab_of_no_base", "kernel_targets", "kernel_targets_of_two_runs", "closeness",
         "tile_tuner", "gpu_phases", "slowdown_plugin_as_a_plugin"],
)  # fmt: skip
def test_a_script_exits_with_its_code_and_prints_its_lines(tmp_path, in_process, clean_registry, command, code, said,
                                                           check):  # fmt: skip
    """{run}: the committed run of a GPU machine; {cases}: a small case file in {tmp}; ``check(stdout, tmp)``: the
    rest of what the script must print or write."""
    cases = write_cases(tmp_path / "c.toml", {"name": "c"}, defaults=SMALL)
    run, phases = COMMITTED_RUN.relative_to(ROOT), PHASES.relative_to(ROOT)
    got, out, err = in_process(*command.format(run=run, cases=cases, tmp=tmp_path, phases=phases).split())
    assert got == code, err
    assert all(words in (out if code == 0 else err) for words in said), out + err
    assert check is None or check(out, tmp_path), out
    assert not list((ROOT / "kernels").glob("_ab_*.py")), "kernel_ab leaves no module behind"


def test_rows_host_us_is_reported_beside_the_peers_and_not_scored_as_the_hot_loop_target():
    from scripts.kernel_targets import host_note, score

    older = pd.read_parquet(COMMITTED_RUN / "results.parquet")  # a run from before the host_us column
    assert host_note(older) is None
    frame = older.copy()
    peers = frame.loc[frame["backend_kind"] == "peer", "backend"].unique()
    frame["host_us"] = frame["backend"].map({"triton": 40.0, **dict.fromkeys(peers, 30.0)})
    note = host_note(frame)
    assert "triton median 40.0 us" in note and "its peers 30.0 us" in note
    assert "host" not in set(score(frame)["target"])


@pytest.mark.slow  # the script times interpreted calls
def test_host_overhead_script_tables_the_three_calls_plans_off_and_on():
    done = run_script("scripts/self/host_overhead.py", "--dry", "--profile")
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| call | host us, plans off | host us, plans on |") and len(rows) == 4
    assert [row.split(" | ")[0] for row in rows[1:]] == ["| default", "| no_offsets", "| hints_out"]
    assert "hits, 1 misses" in done.stdout and done.stdout.count("## cProfile") == 2


@pytest.mark.slow  # four harness runs in worker processes: about 16 s
def test_gpu_scale_script_dry_runs_one_and_two_workers_and_tables_them(tmp_path):
    cases = write_cases(tmp_path / "c.toml", {"name": "c"}, {"name": "d"}, defaults=SMALL)  # two: a worker each
    env = {**os.environ, "DRY": "1", "OUT": str(tmp_path / "out"), "SUITES": str(cases), "WORKERS": "1 2",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}  # fmt: skip
    done = subprocess.run(
        ["bash", "scripts/self/gpu_scale.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    speed, phases = (tmp_path / "out" / "scale" / "table.md").read_text().split("\n\nwhere the cases' busy time went")
    table = speed.splitlines()
    assert table[0].startswith("| workers | wall s | cases s | speed-up |") and len(table) == 4
    assert table[2].startswith("| 1 |") and table[3].startswith("| 2 |") and table[3].endswith("| pass 2 |")
    assert "| phase, s | workers1 | workers2 |" in phases and "| inputs |" in phases


@pytest.mark.slow  # three runs with isolated workers: about 35 s
def test_noise_check_gpu_preset_runs_dry_on_the_cpu_and_prints_verdict_counts(tmp_path):
    cases = write_cases(tmp_path / "tiny.toml", {"name": "c", "tags": ["small"], "block_size": 4}, defaults=SMALL)
    done = run_script(
        "scripts/self/noise_check.py", "--gpu", "--device", "cpu", "--cases", str(cases), "--out", str(tmp_path / "nc"),
        "--min-reps", "2", timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("A_vs_")]
    assert lines[0].startswith("A_vs_B (same commit), compare: 2 rows, verdicts")
    assert lines[1].startswith("A_vs_C (triton_slowable +5%), compare: 2 rows") and "slower on " in lines[1]


@pytest.mark.slow  # a checkout of HEAD timed against the tree
def test_kernel_ab_times_head_against_the_tree_and_leaves_no_module_behind(tmp_path):
    done = run_script("scripts/kernel_ab.py", "--dry", "--out", str(tmp_path / "ab.json"))
    assert done.returncode in (0, 1), done.stderr
    assert "| case | base us | new us | new / base | paired CI | verdict |" in done.stdout
    (record,) = json.loads((tmp_path / "ab.json").read_text())["records"]
    assert record["verdict"] in TIMED
    assert len(record["samples"]["base"]) == len(record["samples"]["new"]) == 9
    assert not list((ROOT / "kernels").glob("_ab_*.py"))


def _fails(*args, **kwargs):
    raise TypeError("paged_attention_triton() got an unexpected keyword argument 'max_q_len'")


def _plus_one(*args, **kwargs):
    return kernels.paged_attention_tlsim(*args, **kwargs) + 1


@pytest.mark.parametrize(
    ("base_fn", "new_fn", "verdict", "why"),
    [
        pytest.param(kernels.paged_attention_tlsim, _plus_one, "output differs", None, id="output_differs"),
        pytest.param(
            _fails, kernels.paged_attention_tlsim, "error", "the base kernel failed: TypeError", id="base_fails"
        ),
    ],
)
def test_kernel_ab_reports_a_kernel_that_differs_or_fails_untimed(base_fn, new_fn, verdict, why):
    from scripts.kernel_ab import dry_case, time_case

    sides = {"base": base_fn, "new": new_fn}
    modules = {side: types.SimpleNamespace(paged_attention_triton=fn) for side, fn in sides.items()}
    record = time_case(dry_case(), modules, "cpu", 9, ONE_REP)
    assert record["verdict"] == verdict and "ratio" not in record
    assert why is None or why in record["why"]


def test_kernel_ab_times_cases_with_options_passing_them_to_both_sides():
    """An fp8 case's scales and a variant's options reach the base's entry and the new one's alike."""
    from harness.cases.loading import load_cases
    from harness.cases.packaged import resolve_case_arg
    from scripts.kernel_ab import time_case, timeable

    loaded = load_cases([resolve_case_arg(s) for s in ("variants", "gpu")], device="cpu", backends=["triton"])
    kept = {c.id for c in timeable(loaded)}
    assert "llama3_8b_decode_fp8" in kept and "llama3_8b_decode_bf16_twin" in kept
    case = min((c for c in timeable(loaded) if c.id.startswith("fp8_kv_decode")), key=lambda c: sum(c.seq_lens))
    assert "fp8_kv" in case.variants
    seen = {"base": [], "new": []}

    def side(name):
        def entry(*args, **kwargs):
            seen[name].append(sorted(k for k in kwargs if k.endswith("_scale") and kwargs[k] is not None))
            return kernels.paged_attention_tlsim(*args, **kwargs)

        return entry

    modules = {name: types.SimpleNamespace(paged_attention_triton=side(name)) for name in seen}
    record = time_case(case, modules, "cpu", 6, ONE_REP)
    assert record["verdict"] in TIMED, record
    assert seen["base"] and seen["new"] and all(k == ["k_scale", "v_scale"] for k in seen["base"] + seen["new"])


@pytest.mark.slow  # a checkout of HEAD timed against the tree
@pytest.mark.parametrize("with_modules", [("tiling", "tuning"), ("tuning",)])
def test_kernel_ab_with_gives_the_base_its_revisions_tuning_and_split(tmp_path, monkeypatch, kernel_ab, with_modules):
    """The base side gets the base revision's tuning, and its tiling and split bound only with --with tiling."""
    import kernels.tiling
    import kernels.tuning

    real_show = kernel_ab._git_show
    edited = "DEVICE_SPLIT_MIN_KEYS = 123\n"

    def show(rev, path):  # the base's tiling.py with a split bound the working tree does not have
        text = real_show(rev, path)
        return text + edited if path.name == "tiling.py" else text

    monkeypatch.setattr(kernel_ab, "_git_show", show)
    modules = kernel_ab.kernel_modules("HEAD", tmp_path, with_modules)
    base_tiling = sys.modules["kernels._ab_base_tiling"]
    assert modules["base"].tiling_for is base_tiling.tiling_for is not kernels.tiling.tiling_for
    assert base_tiling.tile_config is sys.modules["kernels._ab_base_tuning"].tile_config
    assert base_tiling.tile_config is not kernels.tuning.tile_config
    assert modules["new"].tiling_for is kernels.tiling.tiling_for
    assert (base_tiling.DEVICE_SPLIT_MIN_KEYS == 123) == ("tiling" in with_modules)
    assert kernels.tiling.DEVICE_SPLIT_MIN_KEYS != 123
    record = kernel_ab.time_case(kernel_ab.dry_case(), modules, "cpu", 6, ONE_REP)
    assert record["verdict"] in TIMED, record


def test_kernel_ab_with_gluon_prefill_gives_the_base_side_the_base_revisions_hopper_prefill(tmp_path, kernel_ab):
    """--with gluon_prefill: the base kernel's ``gluon_prefill`` is the base revision's module; new, the tree's."""
    import kernels.gluon_prefill

    modules = kernel_ab.kernel_modules("HEAD", tmp_path, ("gluon_prefill",))
    base = sys.modules["kernels._ab_base_gluon_prefill"]
    assert modules["base"].gluon_prefill is base is not kernels.gluon_prefill
    assert modules["new"].gluon_prefill is kernels.gluon_prefill


def test_compare_targets_suite_loads_and_its_table_reader_reads_compare_rows(tmp_path):
    from harness.cases.loading import load_cases
    from scripts.self import compare_targets

    (tmp_path / "planted.toml").write_text(compare_targets.PLANTED_CASES)
    assert len(load_cases([tmp_path / "planted.toml"], device="cpu")) == 3
    table = "WORSE  reference_slowable  decode_a  +31%\nsame   tlsim  decode_a\nUNCONFIRMED  tlsim  decode_b  +40%\n"
    assert compare_targets.flagged(table) == {"WORSE": [("reference_slowable", "decode_a")],
                                              "UNCONFIRMED": [("tlsim", "decode_b")]}  # fmt: skip


def test_kernel_ab_reads_the_base_from_a_folder_when_given_one(tmp_path):
    """A GPU machine's copy of the tree has no git: ``--base-dir DIR`` takes the base files from a copied tree."""
    from scripts.kernel_ab import ABError, _git_show

    path = Path("kernels/triton_paged.py")
    (tmp_path / "kernels").mkdir()
    (tmp_path / path).write_text("# the base\n")
    assert _git_show(tmp_path, path) == "# the base\n"
    with pytest.raises(ABError, match=r"tuning\.py: no such file in the base folder"):
        _git_show(tmp_path, Path("kernels/tuning.py"))


def test_kernel_targets_score_fp8_against_its_twin_and_mla_in_tflops_its_worst_case_the_slowest(monkeypatch, capsys):
    """fp8 decode is scored against its bf16 twin, read at 85%; MLA by TFLOP/s, its worst case the lowest."""
    import scripts.kernel_targets as kernel_targets

    shape = {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "head_dim_v": 128, "num_seqs": 32,
             "max_seq_len": 16384, "total_kv_tokens": 524288, "num_tokens": 32, "block_size": 16,
             "dtype": "bfloat16", "max_q_len": 1, "status": "pass", "backend": "triton",
             "bytes_moved": 2**31, "tflops": 1.0, "flops": 10**11}  # fmt: skip
    mla = {**shape, "num_q_heads": 128, "num_kv_heads": 1, "head_dim": 576, "head_dim_v": 512}
    frame = pd.DataFrame([
        {**shape, "case": "fp8", "kv_dtype": "float8_e4m3fn", "latency_us": 300.0, "pct_of_ceiling": 86.0},
        {**shape, "case": "twin", "kv_dtype": "", "latency_us": 510.0, "pct_of_ceiling": 95.0},
        {**shape, "case": "other_length", "max_seq_len": 8192, "kv_dtype": "", "latency_us": 250.0},
        {**mla, "case": "mla", "kv_dtype": "", "latency_us": 500.0, "tflops": 150.0, "pct_of_ceiling": 12.0},
        {**mla, "case": "mla_fast", "kv_dtype": "", "latency_us": 300.0, "tflops": 320.0},
        {**mla, "case": "mla_small_test_case", "kv_dtype": "", "latency_us": 5.0, "flops": 10**8},
        {**mla, "case": "mla_fp32", "kv_dtype": "", "latency_us": 500.0, "dtype": "float32"},
    ])  # fmt: skip
    frame["backend_kind"], frame["call_us"] = "kernel", float("nan")
    table = kernel_targets.score(frame).set_index(["target", "case"])
    assert table.loc[("fp8", "fp8"), "measured"] == pytest.approx(300 / 510) and table.loc[("fp8", "fp8"), "met"]
    assert table.loc[("fp8", "fp8"), "unit"] == "x twin"
    assert table.loc[("read", "fp8"), "limit"] == 85.0 and table.loc[("read", "twin"), "limit"] == 90.0
    assert table.loc[("mla", "mla"), "measured"] == 150.0 and not table.loc[("mla", "mla"), "met"]
    assert ("read", "mla") not in table.index, "MLA is compute-bound: scored in TFLOP/s, not by its read"
    assert ("mla", "twin") not in table.index and ("fp8", "twin") not in table.index
    assert ("mla", "mla_small_test_case") not in table.index and ("mla", "mla_fp32") not in table.index
    monkeypatch.setattr(kernel_targets, "load_run", lambda run_dir: (frame, {}))
    assert kernel_targets.main(["run"]) == 0
    assert "## mla: met on 1 of 2 cases (worst 150 TFLOP/s)" in capsys.readouterr().out
