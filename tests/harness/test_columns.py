"""The column table is the one place a report column is declared: the frame, the contract and the page follow it."""

import pytest

from harness.cases.variants import VARIANTS
from harness.results import columns
from harness.results.schemas import COLUMN_KINDS
from harness.run.runner import to_frame


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
