"""Bad calls fail with a message naming the argument, before any kernel runs.

Shape, dtype and device checks always run; value checks run when asked (check=True, or
PAGED_ATTENTION_CHECK=1, which tests/conftest.py sets for the suite).
"""

from __future__ import annotations

import pytest
import torch

import kernels
from tests.kernels.kernel_cases import BAD_CALLS, BASE, base_args, needs_triton

BACKENDS = [
    kernels.paged_attention_reference,
    kernels.paged_attention_tlsim,
    kernels.paged_attention_triton,
    kernels.paged_attention_dispatch,
]


@pytest.mark.parametrize("fn", BACKENDS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_is_a_value_error_naming_the_argument(fn, name):
    args, message = BAD_CALLS[name]
    with pytest.raises(ValueError, match=message):
        fn(*args)


def test_triton_sync_free_call_with_hints_matches_the_checked_call():
    """Checks off and launch hints given: the same answer, bit for bit, as the checked call."""
    needs_triton()
    args = base_args()
    checked = kernels.paged_attention_triton(*args, check=True)
    sync_free = kernels.paged_attention_triton(*args, max_q_len=max(BASE.q_lens), max_seq_len=35, check=False)
    torch.testing.assert_close(sync_free, checked, rtol=0, atol=0)


def test_check_none_follows_the_environment_variable(monkeypatch):
    monkeypatch.setenv(kernels.CHECK_ENV, "1")
    assert kernels.checks_enabled(None) and not kernels.checks_enabled(False)
    monkeypatch.setenv(kernels.CHECK_ENV, "0")
    assert not kernels.checks_enabled(None) and kernels.checks_enabled(True)
    monkeypatch.delenv(kernels.CHECK_ENV)
    assert not kernels.checks_enabled(None), "value checks are off by default"


@pytest.mark.parametrize("fn", BACKENDS, ids=lambda f: f.__name__)
def test_value_checks_are_opt_in_and_shape_checks_are_not(fn, monkeypatch):
    if fn is kernels.paged_attention_triton and (reason := kernels.triton_unavailable_reason("cpu")):
        pytest.skip(reason)
    monkeypatch.delenv(kernels.CHECK_ENV)
    args, message = BAD_CALLS["qsl_wrong_total"]
    fn(*args)  # the default path reads no value: the caller vouches for query_start_loc
    with pytest.raises(ValueError, match=message):
        fn(*args, check=True)
    monkeypatch.setenv(kernels.CHECK_ENV, "1")
    with pytest.raises(ValueError, match=message):
        fn(*args)
    fn(*args, check=False)
    for name in ("q_not_3d", "dtype_mismatch", "block_table_int64"):  # metadata only: always checked
        bad_args, bad_message = BAD_CALLS[name]
        with pytest.raises(ValueError, match=bad_message):
            fn(*bad_args, check=False)


@pytest.mark.parametrize("scale", [0.0, -0.125, float("nan")])
def test_non_positive_scale_is_refused(scale):
    with pytest.raises(ValueError, match="scale must be a positive finite number"):
        kernels.paged_attention_tlsim(*base_args(), scale=scale)
