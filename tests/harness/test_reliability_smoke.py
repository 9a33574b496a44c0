"""cases/smoke.toml fails a kernel without the running max and one with a half-precision accumulator."""

from __future__ import annotations

from functools import partial

import pandas as pd
import pytest
import torch

from harness import register_backend
from harness.cli.main import main


def _per_sequence(attend, q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, scale=None, out=None):
    """Gather each sequence's KV (fp32 K), form fp32 logits [Hq, q_len, seq_len], let ``attend`` finish."""
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    group = q.shape[1] // num_kv_heads
    scale = head_dim**-0.5 if scale is None else scale
    starts = query_start_loc.tolist() if query_start_loc is not None else list(range(len(seq_lens) + 1))
    out = torch.empty_like(q) if out is None else out
    for seq, seq_len in enumerate(seq_lens.tolist()):
        q_len = starts[seq + 1] - starts[seq]
        if q_len == 0:
            continue
        pos = torch.arange(seq_len)
        blocks = block_table[seq, pos // block_size].long()
        k = k_cache[blocks, pos % block_size].float().repeat_interleave(group, 1).transpose(0, 1)
        v = v_cache[blocks, pos % block_size].repeat_interleave(group, 1).transpose(0, 1)
        s = q[starts[seq] : starts[seq + 1]].float().transpose(0, 1) @ k.transpose(1, 2) * scale
        visible = pos[None, :] <= (seq_len - q_len + torch.arange(q_len))[:, None]
        out[starts[seq] : starts[seq + 1]] = attend(s, visible, v, q.dtype).transpose(0, 1).to(out.dtype)
    return out


def no_running_max(s, visible, v, dtype):
    """softmax = exp(s) / sum(exp(s)) in fp32, without subtracting the row max: overflows past s = 88.7."""
    p = torch.where(visible, torch.exp(s), 0.0)
    return (p @ v.float()) / p.sum(-1, keepdim=True)


def half_accumulator(s, visible, v, dtype):
    """The kernel's online softmax with the output accumulator in q's dtype, rounded after every tile."""
    s = torch.where(visible, s, float("-inf"))
    m = torch.full(s.shape[:-1], float("-inf"))
    l_sum = torch.zeros(s.shape[:-1])
    acc = torch.zeros((*s.shape[:-1], v.shape[-1]), dtype=dtype)
    for start in range(0, s.shape[-1], 64):
        tile = s[..., start : start + 64]
        m_new = torch.maximum(m, tile.amax(-1))
        m_safe = torch.where(m_new == float("-inf"), 0.0, m_new)
        alpha = torch.exp(m - m_safe)
        p = torch.exp(tile - m_safe[..., None])
        l_sum = l_sum * alpha + p.sum(-1)
        pv = p.to(v.dtype).float() @ v[..., start : start + 64, :].float()
        acc = (acc.float() * alpha[..., None] + pv).to(dtype)
        m = m_new
    return acc.float() / l_sum[..., None]


# mutant -> (the cases that may fail it, the ones that must)
MUTANTS = {
    "no_running_max": (
        "logits_past_exp_overflow/",
        {"logits_past_exp_overflow/dtype=float32", "logits_past_exp_overflow/dtype=float16"},
    ),
    "half_accumulator": ("long_half_accumulation/", {"long_half_accumulation/dtype=float16"}),
}


@pytest.fixture(autouse=True)
def mutants_registered(clean_registry):
    for attend in (no_running_max, half_accumulator):  # a kernel: _per_sequence finished by each
        register_backend(attend.__name__, partial(_per_sequence, attend))


def test_harness_run_with_no_case_file_fails_each_mutant_exactly_on_the_cases_added_for_it(tmp_path):
    """`harness run` reads cases/smoke.toml relative to the working directory: the repository root here."""
    out = tmp_path / "run"
    backends = [arg for name in [*MUTANTS, "tlsim", "reference"] for arg in ("--backend", name)]
    assert main(["run", "--out", str(out), "--no-timing", "--no-progress", *backends]) == 1
    rows = pd.read_parquet(out / "results.parquet")
    for mutant, (may, must) in MUTANTS.items():
        mine = rows[rows["backend"] == mutant].set_index("case")["status"]
        caught = {case for case, status in mine.items() if status == "fail"}
        assert must <= caught, f"the smoke suite lets {mutant} pass {must - caught}"
        assert all(case.startswith(may) for case in caught), f"{mutant} failed elsewhere too: {caught}"
    correct = rows[rows["backend"].isin(["tlsim", "reference"])]
    assert (correct["status"] == "pass").all(), correct[correct["status"] != "pass"][["case", "reason"]]
