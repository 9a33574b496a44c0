"""A peer whose call raises is an error row with the message, never a skip; only declared limits skip."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.backends import peers
from harness.backends.registry import REGISTRY
from harness.cases.spec import expand_spec
from harness.run.runner import RunConfig, build_context, run_backend
from tests.tiny_cases import TINY

CONFIG = RunConfig(device="cpu", backends=[], timing=False, progress=False)


def case(**fields):
    (made,) = expand_spec({"name": "peer", **TINY, "dtype": "float16", **fields}, "test")
    return made


def broken_varlen_attn(*args, **kwargs):
    raise AssertionError("a peer outside its declared limits was called")


@pytest.mark.parametrize(
    ("name", "error"),
    [("varlen_flash", RuntimeError), ("varlen_flash_paged", RuntimeError), ("varlen_flash", ValueError),
     ("varlen_flash", TypeError)],
)  # fmt: skip
def test_any_exception_of_a_peers_call_is_an_error_row_with_its_message_not_a_refusal(name, error, monkeypatch):
    def raising(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, -1),
                enable_gqa=False, seqused_k=None, block_table=None):  # fmt: skip
        raise error("varlen kernel exploded: illegal memory access")

    monkeypatch.setattr(peers, "_varlen_attn", lambda: raising)
    backend = dataclasses.replace(REGISTRY[name], devices=("cpu",))  # the fake runs anywhere
    the_case = case()
    assert backend.skip_reason(the_case, "cpu") is None
    row = run_backend(build_context(the_case, "cpu", "cpu"), backend, CONFIG)
    assert row["status"] == "error", row
    assert row["reason"].split(" (at")[0] == f"{error.__name__}: varlen kernel exploded: illegal memory access"


@pytest.mark.parametrize(
    ("fields", "reason"),
    [({"dtype": "float32"}, "fp16/bf16 only"), ({"head_dim": 36}, "multiple of 8 up to 256, not 36")],
)
def test_a_declared_limit_is_still_a_skip_with_its_reason(fields, reason, monkeypatch):
    monkeypatch.setattr(peers, "_varlen_attn", lambda: broken_varlen_attn)  # never called: decided before
    backend = dataclasses.replace(REGISTRY["varlen_flash"], devices=("cpu",))
    row = run_backend(build_context(case(**fields), "cpu", "cpu"), backend, CONFIG)
    assert row["status"] == "skip" and reason in row["reason"], row


def test_without_varlen_attn_in_this_torch_the_row_is_a_skip(monkeypatch):
    monkeypatch.setattr(peers, "_varlen_attn", lambda: None)
    reason = REGISTRY["varlen_flash"].skip_reason(case(), "cuda")
    assert reason == f"torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn"
