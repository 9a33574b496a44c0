"""The case files as tests: one per (case, backend), asserting the case's tolerance."""

from __future__ import annotations

import pytest


def test_case_within_tolerance(harness_case, harness_backend, harness_session):
    row = harness_session.run(harness_case, harness_backend)
    if row["status"] == "skip":
        pytest.skip(row["reason"])
    assert row["status"] == "pass", f"{row['status']}: {row['reason']}"
