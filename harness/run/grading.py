"""Grading a backend's output against the float64 oracle: an accuracy record, not a bool. The rule is
allclose's ``|out - expected| <= atol + rtol * |expected|``, no NaN anywhere (docs/contract.md, "Tolerances").

:func:`forward_error_bound` bounds, to first order, how far an output may land from the exact
result through round-off no correct fp32-softmax kernel avoids. With u the unit round-off
(fp32 2**-24; u_out the output dtype's), each logit s_j = scale * q . k_j errs by at most

    delta_j = u * (|s_j| + sqrt(head_dim) * scale * sum_i |q_i k_ji|)

and, since d out / d s_j = p_j (v_j - out),

    error_bound = sum_j p_j * delta_j * (|v_j| + |out|) + u_out * |out|

per output element. A row whose tolerance is below this bound at some element grades the input's
own round-off, not the kernel: its ``grading_note`` says so (the status is kept)."""

import bisect
import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.cases.memory import BOUND_CHUNK_ELEMENTS
from harness.cases.vocab import DTYPES
from harness.run.oracle import sequences


@dataclass(frozen=True)
class Grade:
    max_abs_err: float  # max |out - expected|
    max_rel_err: float  # max |out - expected| / max(|expected|, atol)
    rel_l2_err: float  # ||out - expected||_2 / ||expected||_2
    nan_count: int  # elements of out that are NaN or inf (never pass)
    tol_ratio: float  # max |out - expected| / (atol + rtol * |expected|) (<= 1 passes; 0 where exact)
    atol: float
    rtol: float
    passed: bool
    worst_index: tuple[int, ...]  # (token, head, dim) of the largest violation of the allclose rule
    error_bound: float = float("nan")  # max of forward_error_bound (NaN when not given)
    bound_ratio: float = float("nan")  # the bound's max over the tolerance (NaN when not given)
    fail_count: int = 0  # elements outside the tolerance, NaN/inf included

    def columns(self) -> dict[str, float | int | str]:
        """The report row's accuracy columns (names as in docs/contract.md), in the row's order."""
        errors = ("max_abs_err", "max_rel_err", "rel_l2_err", "nan_count", "tol_ratio", "fail_count", "error_bound")
        return {**{name: getattr(self, name) for name in errors}, "grading_note": self.grading_note}

    @property
    def grading_note(self) -> str:
        """Non-empty when the tolerance is below the forward error bound of the inputs."""
        if not self.bound_ratio > 1:
            return ""
        return (f"tolerance below the input's own round-off: grades the input, not the kernel "
                f"(error bound {self.error_bound:.3g} is {self.bound_ratio:.2f}x the tolerance)")  # fmt: skip

    @property
    def reason(self) -> str:
        """Empty when passed; otherwise why, in words a person can act on."""
        if self.passed:
            return ""
        if self.nan_count:
            return (f"{self.nan_count} NaN/inf outputs (unwritten rows, a read of an unowned slot, or a row whose every "
                    "key is masked)")  # fmt: skip
        return (f"max abs err {self.max_abs_err:.3g} at (token, head, dim) {self.worst_index} "
                f"exceeds atol {self.atol:g} + rtol {self.rtol:g} * |expected|")  # fmt: skip


def _ratio(numerator: torch.Tensor, allowed: torch.Tensor) -> float:
    """max(numerator / allowed), with 0 / 0 = 0 (exact where the tolerance is 0) and x / 0 = inf."""
    return float(torch.where(numerator == 0, 0.0, numerator / allowed).max())


def grade(out: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float,
          bound: torch.Tensor | None = None) -> Grade:  # fmt: skip
    """Compare ``out`` (any dtype, device) with ``expected`` (float64); ``bound``: :func:`forward_error_bound`'s."""
    actual = out.detach().to(expected.device, torch.float64)
    if actual.shape != expected.shape:
        raise ValueError(f"output shape {tuple(actual.shape)} differs from expected {tuple(expected.shape)}")
    finite = torch.isfinite(actual)
    nan_count = int((~finite).sum())
    diff = torch.where(finite, (actual - expected).abs(), torch.inf)
    if diff.numel() == 0:
        return Grade(0.0, 0.0, 0.0, 0, 0.0, atol, rtol, True, (), 0.0, 0.0)
    allowed = atol + rtol * expected.abs()
    excess = diff - allowed
    worst = tuple(int(i) for i in torch.unravel_index(torch.argmax(excess), excess.shape))
    finite_diff = torch.where(finite, diff, 0.0)
    ref_norm = float(torch.linalg.vector_norm(expected))
    return Grade(
        max_abs_err=float(finite_diff.max()) if nan_count == 0 else float("inf"),
        max_rel_err=float((finite_diff / expected.abs().clamp_min(atol)).max()) if nan_count == 0 else float("inf"),
        rel_l2_err=float(torch.linalg.vector_norm(finite_diff)) / ref_norm if ref_norm else 0.0,
        nan_count=nan_count, tol_ratio=_ratio(diff, allowed), atol=atol, rtol=rtol,
        passed=nan_count == 0 and bool((excess <= 0).all()), worst_index=worst,
        error_bound=float(bound.max()) if bound is not None else float("nan"),
        bound_ratio=_ratio(bound.to(expected.device, torch.float64), allowed) if bound is not None else float("nan"),
        fail_count=int((excess > 0).sum()),
    )  # fmt: skip


# Unit round-off u = eps / 2: float32 2**-24, float16 2**-11, bfloat16 2**-8.
UNIT_ROUNDOFF = {name: torch.finfo(dtype).eps / 2 for name, dtype in DTYPES.items()}


# The bound's name in the oracle cache (harness.run.oracle_cache.lookup): an edit of this file misses.
BOUND_RESULT = "forward_error_bound:" + hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def forward_error_bound(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, expected: torch.Tensor,
                        scale=None) -> torch.Tensor:  # fmt: skip
    """Per-element first-order bound on |out - exact| from unavoidable fp32 round-off (module docstring).

    q               [num_tokens, num_q_heads, head_dim] (its dtype sets the output's u)
    k_cache         [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache         [num_blocks, block_size, num_kv_heads, head_dim_v]
    block_table     [num_seqs, max_blocks_per_seq] int;  seq_lens [num_seqs] int
    query_start_loc [num_seqs + 1] int
    expected        [num_tokens, num_q_heads, head_dim_v] float64: the oracle's output
    returns         [num_tokens, num_q_heads, head_dim_v] float64 on expected's device"""
    device = expected.device
    u = UNIT_ROUNDOFF["float32"]
    u_out = UNIT_ROUNDOFF.get(str(q.dtype).removeprefix("torch."), u)
    num_kv_heads, head_dim = k_cache.shape[2:]
    scale = head_dim**-0.5 if scale is None else float(scale)
    qd = q.detach().to(device, torch.float64)
    num_q_heads = qd.shape[1]
    group = num_q_heads // num_kv_heads
    head_dim_v = v_cache.shape[-1]
    bound = u_out * expected.abs()
    for start, q_len, seq_len, k, v in sequences(k_cache, v_cache, block_table, seq_lens, query_start_loc, device):
        pos = torch.arange(seq_len)
        # Query rows in chunks of at most BOUND_CHUNK_ELEMENTS logits: three such float64 tensors at the peak.
        chunk = max(1, BOUND_CHUNK_ELEMENTS // max(1, seq_len * num_q_heads))
        for first in range(0, q_len, chunk):
            last = min(q_len, first + chunk)
            rows = slice(start + first, start + last)
            qs = qd[rows].view(last - first, num_kv_heads, group, head_dim)
            s = torch.einsum("qhgd,khd->hgqk", qs, k).mul_(scale)  # [num_kv_heads, group, rows, seq_len]
            delta = torch.einsum("qhgd,khd->hgqk", qs.abs(), k.abs()).mul_(head_dim**0.5 * scale)
            delta.add_(s.abs()).mul_(u)
            q_pos = seq_len - q_len + torch.arange(first, last, device=device)
            hidden = pos.to(device)[None, None, None, :] > q_pos[None, None, :, None]
            weight = torch.softmax(s.masked_fill_(hidden, float("-inf")), dim=-1).mul_(delta)  # p * delta
            del s, delta
            o = expected[rows].view(last - first, num_kv_heads, group, head_dim_v).abs()
            term = torch.einsum("hgqk,khd->qhgd", weight, v.abs()) + o * weight.sum(-1).permute(2, 0, 1)[..., None]
            bound[rows] += term.reshape(last - first, num_q_heads, head_dim_v)
    return bound


def locate(token: int, query_start_loc: list[int], seq_lens: list[int]) -> str:
    """A packed token index in the words of the case, 'seq 3, query 5 (position 1029)'; host lists."""
    seq = bisect.bisect_right(query_start_loc, token) - 1  # past sequences with q_len 0
    j = token - query_start_loc[seq]
    q_len = query_start_loc[seq + 1] - query_start_loc[seq]
    return f"seq {seq}, query {j} (position {seq_lens[seq] - q_len + j})"
