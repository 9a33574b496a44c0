"""One vocabulary (harness.cases.vocab) and one column table: schema, inputs, kernels, grading and report follow them."""

from __future__ import annotations

import inspect

import pytest
import torch

import kernels
from harness.cases.inputs import make_inputs
from harness.cases.spec import CaseSpec, case_file_schema
from harness.cases.variants import VARIANT_KEYS, VARIANTS
from harness.cases.vocab import (
    DEFAULT_TOLERANCES,
    DTYPE_NAMES,
    DTYPES,
    FAILING,
    GRADED,
    LAYOUTS,
    STATUSES,
    WORST_FIRST,
    field_path,
)
from harness.results import columns, report
from harness.results.schemas import COLUMN_KINDS
from harness.run import grading
from harness.run.runner import to_frame
from harness.timing import ceilings
from kernels.contract import CALL_OPTION_TABLE, CALL_OPTIONS, CONTRACT_DOC, SUPPORTED_DTYPES, PagedCall
from tests.tiny_cases import TINY, write_cases


def test_the_case_file_schema_and_the_grading_tables_offer_exactly_the_vocabulary():
    case = case_file_schema()["properties"]["case"]["items"]["properties"]
    assert tuple(case["dtype"]["enum"]) == DTYPE_NAMES
    assert tuple(case["layout"]["enum"]) == LAYOUTS  # each builds inputs: test_inputs_deterministic.py
    assert tuple(case["tolerance"]["propertyNames"]["enum"]) == DTYPE_NAMES
    assert tuple(DEFAULT_TOLERANCES) == DTYPE_NAMES
    assert tuple(grading.UNIT_ROUNDOFF) == DTYPE_NAMES
    assert grading.UNIT_ROUNDOFF["float32"] == 2.0**-24 and grading.UNIT_ROUNDOFF["bfloat16"] == 2.0**-8
    for peaks in ceilings.DATASHEET_PEAK_TFLOPS.values():
        assert set(peaks) <= set(DTYPE_NAMES)


def test_the_kernels_take_every_dtype_a_case_may_name_and_refuse_others():
    assert tuple(DTYPES.values()) == SUPPORTED_DTYPES
    for name in DTYPE_NAMES:
        inputs = make_inputs(**TINY, dtype=name)
        assert kernels.paged_attention_tlsim(*inputs.args()).dtype == DTYPES[name]
    wide = make_inputs(**TINY, dtype=torch.float64)
    with pytest.raises(ValueError, match="fp32/fp16/bf16"):
        kernels.paged_attention_tlsim(*wide.args())


def test_report_rows_speak_the_vocabulary(tmp_path, run_rows):
    assert sorted(WORST_FIRST) == sorted(STATUSES) and set(GRADED) | set(FAILING) < set(STATUSES)
    assert list(report._STATUS_ORDER) == list(WORST_FIRST)
    path = write_cases(tmp_path / "dtypes.toml", {"name": "tiny", "sweep": {"dtype": list(DTYPE_NAMES)}})
    rows = run_rows(path, ["reference", "varlen_flash"])
    assert set(rows["status"]) <= set(STATUSES) and "skip" in set(rows["status"])
    assert tuple(rows["dtype"].drop_duplicates()) == DTYPE_NAMES


def test_each_variant_is_named_once_and_the_harness_and_the_kernels_option_table_name_the_same_keywords():
    """The kernels never import the harness, so each side has its table: a keyword in one and not the other fails."""
    assert tuple(v.key for v in VARIANTS) == VARIANT_KEYS
    for variant in VARIANTS:
        assert set(variant.fields) <= set(CaseSpec.model_fields), variant
    harness = {keyword for v in VARIANTS for keyword in v.keywords} - {"return_lse"}  # return_lse: the entry's own
    assert harness == set(CALL_OPTIONS), (
        f"only in harness/cases/variants.py: {sorted(harness - set(CALL_OPTIONS))}; "
        f"only in kernels/contract.py CALL_OPTION_TABLE: {sorted(set(CALL_OPTIONS) - harness)}"
    )


@pytest.mark.parametrize("name", ["paged_attention_reference", "paged_attention_tlsim", "paged_attention_triton",
                                  "paged_attention_dispatch"])  # fmt: skip
def test_every_entry_shows_and_takes_each_call_option_by_its_table_row(name):
    entry = getattr(kernels, name)
    params = inspect.signature(entry).parameters
    assert params["return_lse"].kind is inspect.Parameter.KEYWORD_ONLY and not params["return_lse"].default
    for option in CALL_OPTION_TABLE:
        param = params[option.name]
        assert param.kind is inspect.Parameter.KEYWORD_ONLY and param.default is None, option.name
        assert param.annotation == option.kind.annotation, option.name
        assert option.name in CONTRACT_DOC and option.name in PagedCall.__dataclass_fields__, option.name
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()), "the options spelled out"
    inputs = make_inputs(**TINY)
    with pytest.raises(TypeError, match="'sliding_windw'"):
        entry(*inputs.args(), sliding_windw=2)


@pytest.mark.parametrize(
    ("loc", "brackets", "path"),
    [
        (("seq_lens", "function-after[_check]", "count"), False, "seq_lens.count"),
        (("seq_lens", "list[int]", 1), False, "seq_lens.1"),
        (("q_lens", "int"), False, "q_lens"),
        (("gpus", 0, "gpu_name"), True, "gpus[0].gpu_name"),
        (("q_lens", "constrained-int"), False, "q_lens"),
        (("ceilings", "dict[str,float]", "hbm"), True, "ceilings.hbm"),
    ],
)
def test_a_pydantic_location_reads_as_its_field_path_without_union_tags(loc, brackets, path):
    assert field_path(loc, brackets) == path


def test_contract_lists_every_column_and_every_variant_of_the_tables():
    text = columns.DOC.read_text()
    assert columns.doc_with_tables(text) == text, "docs/contract.md is stale: run python -m harness.results.columns"
    for name in columns.COLUMNS:
        assert f"| `{name}` |" in text
    for variant in VARIANTS:
        assert f"| `{variant.key}` |" in text, variant.key


def test_a_row_key_missing_from_the_table_fails_loudly():
    with pytest.raises(columns.UnknownColumnError, match="speedup"):
        to_frame([{"case": "c", "backend": "b", "status": "pass", "speedup": 2.0}])


def test_frame_has_the_table_columns_in_order_each_named_once_and_typed_as_the_readers_check_them():
    frame = to_frame([{"case": "c", "backend": "b", "status": "pass", "_private": 1}])
    assert list(frame.columns) == columns.COLUMNS and len(set(columns.COLUMNS)) == len(columns.COLUMNS)
    assert {c.dtype for c in columns.TABLE} <= {"str", "int", "float", "bool", "list"}
    assert set(columns.COLUMNS) == set(COLUMN_KINDS)
