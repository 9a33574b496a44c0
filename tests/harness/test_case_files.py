"""Case files: validation errors name file, case and field; sweeps expand with stable ids."""

from __future__ import annotations

import json
import os

import pytest

from harness.cases.loading import load_cases
from harness.cases.spec import CaseFileError, load_case_file
from harness.cli.main import main
from tests.tiny_cases import case_file_text

GOOD = case_file_text(
    {"name": "base"}, defaults={"num_q_heads": 8, "num_kv_heads": 2, "head_dim": 64, "seq_lens": [5, 17]}
)


def write(tmp_path, text: str, name: str = "cases.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _refusal(path) -> str:
    """The CaseFileError's text for loading ``path``."""
    with pytest.raises(CaseFileError) as info:
        load_case_file(path)
    return str(info.value)


# A case file (GOOD, changed) -> the fields named, of each case it loads, in order.
LOADED = {
    "a sweep expands as a product with readable ids": (
        GOOD + '[case.sweep]\nhead_dim = [64, 80]\ndtype = ["float32", "bfloat16"]\n', ("id",),
        [(f"base/head_dim={h}/dtype={d}",) for h in (64, 80) for d in ("float32", "bfloat16")]),
    "gqa_ratio gives num_kv_heads": (GOOD.replace("num_kv_heads = 2", "gqa_ratio = 4"), ("num_q_heads", "num_kv_heads"),
                                     [(8, 2)]),
    "a tolerance override applies to its dtype only": (
        GOOD + "[case.tolerance]\nbfloat16 = { atol = 0.05, rtol = 0.02 }\n"
        "[case.sweep]\ndtype = ['float32', 'bfloat16']\n", ("atol", "rtol"), [(1e-5, 1e-4), (0.05, 0.02)]),
    "swept long lists get short ids, distinct and stable": (
        GOOD + "[case.sweep]\nseq_lens = [[1, 2, 3, 4, 5], [5, 4, 3, 2, 1]]\n", ("id",),
        [("base/seq_lens=5seqs-e37647",), ("base/seq_lens=5seqs-086baf",)]),
}  # fmt: skip


@pytest.mark.parametrize("name", LOADED)
def test_a_case_file_loads_into_the_cases_it_describes(tmp_path, name):
    text, fields, expected = LOADED[name]
    assert [tuple(getattr(c, f) for f in fields) for c in load_case_file(write(tmp_path, text))] == expected


def test_generated_lengths_are_deterministic_per_seed(tmp_path):
    text = GOOD.replace(
        "seq_lens = [5, 17]", 'seq_lens = { count = 6, min = 1, max = 500, distribution = "lognormal" }'
    )
    text += "q_lens = { min = 0, max = 9 }\n"
    first, second = load_case_file(write(tmp_path, text)), load_case_file(write(tmp_path, text, "again.toml"))
    assert first[0].seq_lens == second[0].seq_lens and len(first[0].seq_lens) == 6
    assert all(0 <= q <= min(9, s) for q, s in zip(first[0].q_lens, first[0].seq_lens, strict=True))
    reseeded = load_case_file(write(tmp_path, text + "seed = 5\n", "other.toml"))
    assert reseeded[0].seq_lens != first[0].seq_lens


# A misspelt key: where it is, and the error the file gets (the whole of it: said once, at its table).
TYPOS = {
    "in_defaults": (
        "[defaults]\ndtpye = 'float16'\n", "",
        ["[defaults]: field 'dtpye': not a case field; did you mean 'dtype'?"],
    ),
    "in_a_case": ("", "hed_dim = 64\n", ["case 'base': field 'hed_dim': not a case field; did you mean 'head_dim'?"]),
    "in_a_generator": (
        "", "q_lens = { mni = 0, max = 1 }\n",
        ["case 'base': field 'q_lens.min': Field required",
         "case 'base': field 'q_lens.mni': not a field of q_lens; did you mean 'min'?"],
    ),
    "in_a_sweep": (
        "", "[case.sweep]\nblock_szie = [4, 8]\n",
        ["case 'base': field 'sweep': cannot sweep 'block_szie': not a case field; "
         "did you mean 'block_size'?"],
    ),
    "in_the_defaults_sweep": (
        "[defaults.sweep]\nhead_dmi = [64]\n", "",
        ["[defaults]: field 'sweep': cannot sweep 'head_dmi': not a case field; did you mean 'head_dim'?"],
    ),
    "nothing_close": ("[defaults]\ncolour = 'red'\n", "", ["[defaults]: field 'colour': not a case field"]),
}  # fmt: skip


@pytest.mark.parametrize("name", TYPOS)
def test_a_misspelt_key_is_named_at_its_table_with_the_field_it_was_meant_to_be(tmp_path, name):
    defaults, case, expected = TYPOS[name]
    text = GOOD.replace("[defaults]\n", "[defaults]\n" + defaults.removeprefix("[defaults]\n"))
    if defaults.startswith("[defaults.sweep]"):
        text = GOOD.replace("[[case]]", defaults + "[[case]]")
    path = write(tmp_path, text.replace('name = "base"\n', 'name = "base"\n' + case))
    assert _refusal(path).splitlines() == [f"{path}: {line}" for line in expected]


def test_a_bad_value_from_defaults_says_it_was_set_there(tmp_path):
    path = write(tmp_path, GOOD.replace("num_q_heads = 8", "num_q_heads = 7") + "[case.sweep]\nblock_size = [4, 8]\n")
    lines = _refusal(path).splitlines()
    assert len(lines) == 2 and all(
        "field 'num_q_heads' (set in [defaults]): num_q_heads (7) must be a multiple" in line for line in lines
    )


# What is no case file: its text (or a function of tmp_path making the path) and the words of the refusal, without
# hanging: opening a FIFO blocks forever, reading /dev/zero never ends.
UNREADABLE = {
    "a_bad_sweep_point": (GOOD + "[case.sweep]\nhead_dim = [64, 1000]\n", r"case 'base/head_dim=1000': field 'head_dim'"),
    "not_toml": ("[[case]\nname=", "not valid TOML"),
    "nested_too_deeply": ("x = " + "[" * 100_000 + "]" * 100_000 + "\n", "not valid TOML: nested too deeply"),
    "case_tables_not_tables": ("case = [1, 2]\n", r"needs at least one \[\[case\]\] table"),
    "larger_than_4_mib": ("# " + "x" * (5 * 2**20) + "\n", "larger than 4 MiB"),
    "absent": (lambda tmp_path: tmp_path / "absent.toml", "no such case file"),
    "a_folder": (lambda tmp_path: tmp_path, "is a directory, not a case file"),
    "a_fifo": (lambda tmp_path: os.mkfifo(tmp_path / "f.toml") or tmp_path / "f.toml", "not a regular file"),
    "dev_zero": (lambda tmp_path: "/dev/zero", "not a regular file"),
}  # fmt: skip


@pytest.mark.parametrize("name", UNREADABLE)
def test_a_file_that_is_not_a_case_file_is_refused_saying_why(tmp_path, name):
    text, match = UNREADABLE[name]
    with pytest.raises(CaseFileError, match=match):
        load_case_file(text(tmp_path) if callable(text) else write(tmp_path, text))


def test_schema_lists_the_case_fields(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    case_props = schema["properties"]["case"]["items"]["properties"]
    assert {"num_q_heads", "head_dim", "block_size", "seq_lens", "q_lens", "sweep"} <= set(case_props)
    assert case_props["block_size"]["maximum"] == 256


def test_shipped_case_files_load():
    cases = load_cases(["cases/smoke.toml", "cases/cpu.toml"], device="cpu")
    assert len({c.id for c in cases}) == len(cases) > 20


# --- hardening: every bad input is refused with file, case and field; nothing runs -------

REFUSED = {
    "wrong_type": ('block_size = "big"\n', "field 'block_size': Input should be a valid integer"),
    "heads_not_multiple": ("num_q_heads = 7\n", "field 'num_q_heads': num_q_heads (7) must be a multiple"),
    "block_size_range": ("block_size = 512\n", "field 'block_size': Input should be less than or equal to 256"),
    "head_dim_range": ("head_dim = 16\n", "field 'head_dim': Input should be greater than or equal to 32"),
    "q_len_above_seq_len": ("q_lens = [6, 1]\n",
                            "field 'q_lens': q_lens[0] = 6 must be between 0 and seq_lens[0] = 5"),
    "bad_sweep_field": ("[case.sweep]\nwarp_count = [4]\n", "field 'sweep': cannot sweep 'warp_count'"),
    "seed_past_int64": ("seed = 100000000000000000000\n", "field 'seed': Input should be less than or equal to"),
    "true_is_not_1": ("block_size = true\n", "field 'block_size': Input should be a valid integer"),
    "true_is_not_a_length": ("q_lens = true\n", "field 'q_lens': "),
    "atol_inf": ("tolerance = { float32 = { atol = inf, rtol = 0.0 } }\n", "field 'tolerance.float32.atol': Input should be a finite number"),
    "rtol_nan": ("tolerance = { float32 = { atol = 0.0, rtol = nan } }\n", "field 'tolerance.float32.rtol': Input should be a finite number"),
    "input_scale_nan": ("input_scale = nan\n", "field 'input_scale': Input should be a finite number"),
    "input_scale_inf": ("input_scale = inf\n", "field 'input_scale': Input should be a finite number"),
    "scale_is_no_field": ("scale = nan\n", "field 'scale': not a case field"),
    "timeout_negative": ("timeout_s = -1.0\n", "field 'timeout_s': Input should be greater than 0"),
    "length_past_int32": ("seq_lens = [5, 4294967296]\n", "field 'seq_lens.1': Input should be less than or equal to 2147483647"),
    "generator_count_zero": ("seq_lens = { count = 0, min = 1, max = 5 }\n", "field 'seq_lens.count': Input should be greater than or equal to 1"),
    "generator_min_above_max": ("seq_lens = { count = 2, min = 9, max = 5 }\n", "field 'seq_lens': min (9) must be <= max (5)"),
    "lengths_of_wrong_type": ('seq_lens = "long"\n', "field 'seq_lens': Input should be a valid list or Input should be a valid dictionary"),
}  # fmt: skip


@pytest.mark.parametrize("name", REFUSED)
def test_bad_values_are_refused_naming_file_case_and_field(tmp_path, name):
    addition, message = REFUSED[name]
    path = write(tmp_path, (GOOD.replace("seq_lens = [5, 17]\n", "") if "seq_lens" in addition else GOOD) + addition)
    text = _refusal(path)
    assert text.startswith(f"{path}: case 'base': "), text
    assert message in text, text
    for internal in ("function-after", "list[", "constrained", "SeqLenGenerator", "union"):
        assert internal not in text, f"pydantic internals in: {text}"


def test_the_same_file_twice_is_read_once_with_a_note(tmp_path, capsys):
    path = write(tmp_path, GOOD)
    cases = load_cases([path, path, tmp_path / "." / "cases.toml", tmp_path])
    assert [c.id for c in cases] == ["base"]
    assert "is given twice" in capsys.readouterr().err


def test_backend_names_are_checked_against_the_registry(tmp_path):
    from harness.backends.builtin import REGISTRY
    from harness.cases.spec import check_backend_names

    path = write(tmp_path, GOOD + 'backends = ["trtion"]\nexclude_backends = ["tlsim", "flex"]\n')
    cases = load_case_file(path)
    with pytest.raises(CaseFileError) as info:
        check_backend_names(cases, list(REGISTRY))
    lines = str(info.value).splitlines()
    assert lines[0].startswith(f"{path}: case 'base': field 'backends': unknown backend 'trtion'; registered: ")
    assert lines[1].startswith(f"{path}: case 'base': field 'exclude_backends': unknown backend 'flex'")
    assert len(lines) == 2
